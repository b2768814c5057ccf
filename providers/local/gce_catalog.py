"""What the GCE fake offers in every zone: machine types and GPU accelerator types."""

from __future__ import annotations

import zlib

# name -> (vCPUs, memory MiB, GPU catalog name or "", GPUs bundled with the machine type)
MACHINE_TYPES: dict[str, tuple[int, int, str, int]] = {
    **{f"n1-standard-{n}": (n, n * 3840, "", 0) for n in (1, 2, 4, 8, 16, 32, 64, 96)},
    **{f"n1-highmem-{n}": (n, n * 6656, "", 0) for n in (2, 4, 8, 16, 32, 64, 96)},
    "a2-highgpu-1g": (12, 87040, "A100", 1),
    "a2-highgpu-2g": (24, 174080, "A100", 2),
    "a2-highgpu-4g": (48, 348160, "A100", 4),
    "a2-highgpu-8g": (96, 696320, "A100", 8),
    "a2-ultragpu-1g": (12, 174080, "A100-80GB", 1),
    "a2-ultragpu-8g": (96, 1392640, "A100-80GB", 8),
    "a2-ultragpu-2g": (24, 348160, "A100-80GB", 2),
    "a2-ultragpu-4g": (48, 696320, "A100-80GB", 4),
    "a3-highgpu-1g": (26, 239616, "H100", 1),
    "a3-highgpu-2g": (52, 479232, "H100", 2),
    "a3-highgpu-4g": (104, 958464, "H100", 4),
    "a3-highgpu-8g": (208, 1916928, "H100", 8),
    "a3-megagpu-8g": (208, 1916928, "H100", 8),
    "a3-ultragpu-8g": (224, 3022848, "H200", 8),
    "g2-standard-4": (4, 16384, "L4", 1),
    "g2-standard-8": (8, 32768, "L4", 1),
    "g2-standard-12": (12, 49152, "L4", 1),
    "g2-standard-16": (16, 65536, "L4", 1),
    "g2-standard-32": (32, 131072, "L4", 1),
    "g2-standard-24": (24, 98304, "L4", 2),
    "g2-standard-48": (48, 196608, "L4", 4),
    "g2-standard-96": (96, 393216, "L4", 8),
}

# accelerator type -> (GPU catalog name, maximum per instance, attachable to N1 shapes)
ACCELERATOR_TYPES: dict[str, tuple[str, int, bool]] = {
    "nvidia-tesla-t4": ("T4", 4, True),
    "nvidia-tesla-v100": ("V100", 8, True),
    "nvidia-tesla-p100": ("P100", 4, True),
    "nvidia-tesla-p4": ("P4", 4, True),
    "nvidia-tesla-a100": ("A100", 16, False),
    "nvidia-a100-80gb": ("A100-80GB", 8, False),
    "nvidia-h100-80gb": ("H100", 8, False),
    "nvidia-l4": ("L4", 8, False),
    "nvidia-h200-141gb": ("H200", 8, False),
}


def machine_type_resource(base: str, project: str, zone: str, name: str) -> dict[str, object]:
    """The Compute API JSON of one machine type."""
    cpus, memory, gpu, count = MACHINE_TYPES[name]
    resource: dict[str, object] = {
        "kind": "compute#machineType",
        "id": str(zlib.crc32(name.encode())),
        "name": name,
        "description": f"{cpus} vCPUs, {memory / 1024:g} GB RAM",
        "guestCpus": cpus,
        "memoryMb": memory,
        "zone": zone,
        "selfLink": f"{base}/projects/{project}/zones/{zone}/machineTypes/{name}",
    }
    if gpu:
        accelerator = next(a for a, (g, _, _) in ACCELERATOR_TYPES.items() if g == gpu)
        resource["accelerators"] = [
            {"guestAcceleratorType": accelerator, "guestAcceleratorCount": count}
        ]
    return resource


def accelerator_type_resource(base: str, project: str, zone: str, name: str) -> dict[str, object]:
    """The Compute API JSON of one accelerator type."""
    gpu, maximum, _ = ACCELERATOR_TYPES[name]
    return {
        "kind": "compute#acceleratorType",
        "id": str(zlib.crc32(name.encode())),
        "name": name,
        "description": f"NVIDIA {gpu}",
        "maximumCardsPerInstance": maximum,
        "zone": zone,
        "selfLink": f"{base}/projects/{project}/zones/{zone}/acceleratorTypes/{name}",
    }


def gpu_of(machine_type: str, accelerator_type: str | None) -> str:
    """The GPU catalog name an instance runs on ("" when it has none)."""
    if accelerator_type and accelerator_type in ACCELERATOR_TYPES:
        return ACCELERATOR_TYPES[accelerator_type][0]
    return MACHINE_TYPES.get(machine_type, (0, 0, "", 0))[2]
