"""The Compute Engine instance resource the GCP adapter inserts for a launch request."""

from __future__ import annotations

from google.cloud import compute_v1

from providers.base import LaunchRequest, ProviderError

BOOT_METADATA_KEY = "startup-script"
# Deep Learning VM images install the NVIDIA driver at first boot when asked to.
DRIVER_METADATA = {"install-nvidia-driver": "True"}
STORAGE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
X86_64 = "x86_64"
ARM64 = "arm64"
# Machine series with Arm CPUs (A4X: Grace with B200 GPUs; C4A: Axion; T2A: Ampere Altra).
ARM64_FAMILIES = ("a4x-", "c4a-", "t2a-")

# GPUs that attach to N1 machine types as guest accelerators.
N1_ACCELERATORS = {
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
    "P100": "nvidia-tesla-p100",
    "P4": "nvidia-tesla-p4",
    "K80": "nvidia-tesla-k80",
}
# Accelerator-optimized families come with their GPUs built in.
BUNDLED_GPU_FAMILIES = ("a2-", "a3-", "a4-", "a4x-", "g2-", "g4-")


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


def architecture(machine_type: str) -> str:
    """``arm64`` for an Arm machine series (``a4x-highgpu-4g``), else ``x86_64``."""
    return ARM64 if machine_type.startswith(ARM64_FAMILIES) else X86_64


def instance_resource(
    *,
    name: str,
    request: LaunchRequest,
    labels: dict[str, str],
    termination_action: str,
    image: str,
    service_account: str | None = None,
    boot_disk_gb: int = 100,
) -> compute_v1.Instance:
    """The ``Instance`` body for ``instances.insert``: the request's boot script as its
    ``startup-script``, the NVIDIA driver installed at boot, ``service_account`` (with
    read-write Cloud Storage) when given."""
    spot = request.market == "spot"
    scheduling = compute_v1.Scheduling(
        provisioning_model="SPOT" if spot else "STANDARD",
        on_host_maintenance="TERMINATE",  # GPUs cannot live-migrate
        automatic_restart=not spot,
    )
    if spot:
        # What a preemption does. A power-off from inside (the boot script's backstop) stops
        # the instance whatever the market: its machine is no longer billed, and the broker
        # deletes it, disk and all, when it ends the attempt.
        scheduling.instance_termination_action = termination_action
    metadata = dict(DRIVER_METADATA)
    if request.boot_script:
        metadata[BOOT_METADATA_KEY] = request.boot_script
    accounts = (
        [compute_v1.ServiceAccount(email=service_account, scopes=[STORAGE_SCOPE])]
        if service_account
        else []
    )
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
            items=[compute_v1.Items(key=k, value=v) for k, v in metadata.items()]
        ),
        service_accounts=accounts,
        scheduling=scheduling,
        guest_accelerators=guest_accelerators(
            request.zone, request.instance_type, request.gpu, request.gpu_count
        ),
        disks=[boot],
        network_interfaces=[
            compute_v1.NetworkInterface(
                network="global/networks/default",
                # An external address: the agent reaches the broker's API and the store.
                access_configs=[
                    compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")
                ],
            )
        ],
    )
