"""The Compute Engine instance resource the GCP adapter inserts for a launch request."""

from __future__ import annotations

from google.cloud import compute_v1

from providers.base import LaunchRequest, ProviderError

RESUME_METADATA_KEY = "broker-resume"

# GPUs that attach to N1 machine types as guest accelerators.
N1_ACCELERATORS = {
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
    "P100": "nvidia-tesla-p100",
    "P4": "nvidia-tesla-p4",
    "K80": "nvidia-tesla-k80",
}
# Accelerator-optimized families come with their GPUs built in.
BUNDLED_GPU_FAMILIES = ("a2-", "a3-", "a4-", "g2-", "g4-")


def guest_accelerators(
    zone: str, machine_type: str, gpu: str, count: int
) -> list[compute_v1.AcceleratorConfig]:
    """The accelerators to attach: none for a2/a3/g2 shapes, the GPU for N1 shapes."""
    if machine_type.startswith(BUNDLED_GPU_FAMILIES) or count == 0 or not gpu:
        return []
    accelerator = N1_ACCELERATORS.get(gpu.upper())
    if accelerator is None:
        raise ProviderError(
            f"GPU {gpu!r} cannot be attached to {machine_type}; use an accelerator-optimized type"
        )
    return [
        compute_v1.AcceleratorConfig(
            accelerator_type=f"zones/{zone}/acceleratorTypes/{accelerator}",
            accelerator_count=count,
        )
    ]


def instance_resource(
    *,
    name: str,
    request: LaunchRequest,
    labels: dict[str, str],
    resume: str,
    termination_action: str,
    image: str,
    boot_disk_gb: int = 100,
) -> compute_v1.Instance:
    """The ``Instance`` body for ``instances.insert``."""
    spot = request.market == "spot"
    scheduling = compute_v1.Scheduling(
        provisioning_model="SPOT" if spot else "STANDARD",
        on_host_maintenance="TERMINATE",  # GPUs cannot live-migrate
        automatic_restart=not spot,
    )
    if spot:
        scheduling.instance_termination_action = termination_action
    boot = compute_v1.AttachedDisk(
        boot=True,
        auto_delete=True,
        initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image=image, disk_size_gb=boot_disk_gb
        ),
    )
    return compute_v1.Instance(
        name=name,
        machine_type=f"zones/{request.zone}/machineTypes/{request.instance_type}",
        labels=labels,
        metadata=compute_v1.Metadata(
            items=[compute_v1.Items(key=RESUME_METADATA_KEY, value=resume)]
        ),
        scheduling=scheduling,
        guest_accelerators=guest_accelerators(
            request.zone, request.instance_type, request.gpu, request.gpu_count
        ),
        disks=[boot],
        network_interfaces=[compute_v1.NetworkInterface(network="global/networks/default")],
    )
