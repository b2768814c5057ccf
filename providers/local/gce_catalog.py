"""What the GCE fake offers: its zones, and each zone's machine types and GPU accelerator types.

The fake lists every zone of the bundled GCP catalog (``pricing/data/gcp-gpu-vms.csv``) besides
the zones it runs instances in, and in a catalog zone the GPU machine types and accelerator
types the catalog lists there (N1 shapes everywhere); a zone the catalog lacks offers all.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Iterable
from functools import cache

from pricing.gcp_catalog import GCE_ACCELERATOR_TYPES, WHOLE_GPU_MACHINES, read_gcp_rows

# name -> (vCPUs, memory MiB, GPU catalog name or "", GPUs bundled with the machine type)
MACHINE_TYPES: dict[str, tuple[int, int, str, int]] = {
    **{f"n1-standard-{n}": (n, n * 3840, "", 0) for n in (1, 2, 4, 8, 16, 32, 64, 96)},
    **{f"n1-highmem-{n}": (n, n * 6656, "", 0) for n in (2, 4, 8, 16, 32, 64, 96)},
    "a2-highgpu-1g": (12, 87040, "A100", 1),
    "a2-highgpu-2g": (24, 174080, "A100", 2),
    "a2-highgpu-4g": (48, 348160, "A100", 4),
    "a2-highgpu-8g": (96, 696320, "A100", 8),
    "a2-megagpu-16g": (96, 1392640, "A100", 16),
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
    "nvidia-h100-mega-80gb": ("H100", 8, False),
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
        accelerator = GCE_ACCELERATOR_TYPES[WHOLE_GPU_MACHINES[name][0]]
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


@cache
def _catalog_offers() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Machine types and accelerator types by zone, as the bundled catalog lists them."""
    hosts, accelerators = read_gcp_rows()
    machines: dict[str, set[str]] = {}
    for machine, zone in hosts:
        if machine in WHOLE_GPU_MACHINES:
            machines.setdefault(zone, set()).add(machine)
    cards: dict[str, set[str]] = {zone: set() for zone in machines}
    for name, _, zone in accelerators:
        cards.setdefault(zone, set()).add(GCE_ACCELERATOR_TYPES[name])
        machines.setdefault(zone, set())
    return machines, cards


class ZoneCatalog:
    """The zones the fake lists (its own first), what each offers, and test switches:
    a zone taken down, a machine or accelerator type withdrawn from a zone."""

    def __init__(self, zones: Iterable[str]) -> None:
        own = list(zones)
        machines, _ = _catalog_offers()
        self.zones = own + sorted(set(machines) - set(own))
        self._down: set[str] = set()
        self._withdrawn: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def status(self, zone: str) -> str:
        return "DOWN" if zone in self._down else "UP"

    def set_up(self, zone: str, up: bool) -> None:
        """Take a zone down (``up=False``) or bring it back."""
        with self._lock:
            (self._down.discard if up else self._down.add)(zone)

    def withdraw(self, zone: str, name: str, withdrawn: bool = True) -> None:
        """Stop (or, with ``withdrawn=False``, resume) listing a machine or accelerator type."""
        with self._lock:
            (self._withdrawn.add if withdrawn else self._withdrawn.discard)((zone, name))

    def reset(self) -> None:
        """Every zone up, nothing withdrawn."""
        with self._lock:
            self._down.clear()
            self._withdrawn.clear()

    def machine_types(self, zone: str) -> list[str]:
        machines, _ = _catalog_offers()
        gpu_machines = machines.get(zone)
        names = [
            name
            for name, (_, _, gpu, _) in MACHINE_TYPES.items()
            if gpu_machines is None or not gpu or name in gpu_machines
        ]
        return [name for name in names if (zone, name) not in self._withdrawn]

    def accelerator_types(self, zone: str) -> list[str]:
        _, cards = _catalog_offers()
        listed = cards.get(zone)
        return [
            name
            for name in ACCELERATOR_TYPES
            if (listed is None or name in listed) and (zone, name) not in self._withdrawn
        ]
