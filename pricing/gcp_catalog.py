"""GCP GPU offers composed from the bundled SkyPilot catalog rows (``data/gcp-gpu-vms.csv``).

The source prices a GPU VM in two parts: a host row (machine type, vCPUs, RAM, host price,
empty accelerator) and an accelerator row (empty machine type, accelerator name and count,
price of that many GPUs). An offer's price is host + accelerator, on demand and on spot
alike; a missing spot price on either side means no spot offer. Whole-GPU machine types
(A2, A3, G2) come with their GPUs fixed; N1 hosts get T4/V100/P100/P4 attached, with two
host shapes per GPU count (see ``N1_HOSTS_PER_GPU``). The file holds the rows this
composition uses in every GPU zone of the source, less the H100 rows whose on-demand price
is inconsistent (``data/CATALOG.md``). :func:`read_gcp_rows` gives the rows as they are, for
other readers of the same prices (the billing fake's SKUs).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from broker.core.offers import NO_PRICE, OfferTable
from pricing.snapshot import DATA_DIR, gpu_memory_gb, price_micros

GCP_CSV = DATA_DIR / "gcp-gpu-vms.csv"

# Source accelerator names -> catalog GPU names (H100-MEGA is the same GPU on a3-megagpu).
GPU_NAMES = {"H100-MEGA": "H100"}

# Machine types that carry their GPUs: machine type -> (source accelerator name, count).
WHOLE_GPU_MACHINES: dict[str, tuple[str, int]] = {
    **{f"a2-highgpu-{n}g": ("A100", n) for n in (1, 2, 4, 8)},
    "a2-megagpu-16g": ("A100", 16),
    **{f"a2-ultragpu-{n}g": ("A100-80GB", n) for n in (1, 2, 4, 8)},
    **{f"a3-highgpu-{n}g": ("H100", n) for n in (1, 2, 4, 8)},
    "a3-megagpu-8g": ("H100-MEGA", 8),
    "a3-ultragpu-8g": ("H200", 8),
    **{f"g2-standard-{v}": ("L4", 1) for v in (4, 8, 12, 16, 32)},
    "g2-standard-24": ("L4", 2),
    "g2-standard-48": ("L4", 4),
    "g2-standard-96": ("L4", 8),
}

# GPUs that attach to N1 hosts, and the host shapes offered per attached GPU: 8 vCPUs per
# GPU stays within every N1 GPU's vCPU limit (V100: 12 per GPU) and matches common setups.
N1_GPUS = ("T4", "V100", "P100", "P4")
N1_HOSTS_PER_GPU = ("n1-standard-{vcpus}", "n1-highmem-{vcpus}")
N1_VCPUS_PER_GPU = 8

# GCE accelerator type names, for launching N1 offers (the provider attaches these).
GCE_ACCELERATOR_TYPES = {
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
    "P100": "nvidia-tesla-p100",
    "P4": "nvidia-tesla-p4",
    "A100": "nvidia-tesla-a100",
    "A100-80GB": "nvidia-a100-80gb",
    "H100": "nvidia-h100-80gb",
    "H100-MEGA": "nvidia-h100-mega-80gb",
    "H200": "nvidia-h200-141gb",
    "L4": "nvidia-l4",
}


@dataclass(frozen=True)
class Price:
    """On-demand and spot price in micro-USD per hour (``NO_PRICE`` = not offered)."""

    on_demand: int
    spot: int


@dataclass(frozen=True)
class Host:
    """A host row: the VM (vCPUs + RAM) without GPUs, priced per hour."""

    vcpus: float
    ram_gb: float
    price: Price


@dataclass(frozen=True)
class Accelerator:
    """An accelerator row: *count* GPUs of one name in one zone, priced per hour together."""

    memory_gb: float
    price: Price


HostKey = tuple[str, str]  # (machine type, zone)
AcceleratorKey = tuple[str, int, str]  # (source accelerator name, count, zone)


def read_gcp_rows(
    path: Path = GCP_CSV,
) -> tuple[dict[HostKey, Host], dict[AcceleratorKey, Accelerator]]:
    """Host rows by (machine type, zone) and accelerator rows by (name, count, zone)."""
    hosts: dict[HostKey, Host] = {}
    accels: dict[AcceleratorKey, Accelerator] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            price = Price(price_micros(row["Price"]), price_micros(row["SpotPrice"]))
            zone = row["AvailabilityZone"]
            if row["InstanceType"]:
                hosts[row["InstanceType"], zone] = Host(
                    float(row["vCPUs"]), float(row["MemoryGiB"]), price
                )
            else:
                key = (row["AcceleratorName"], int(row["AcceleratorCount"]), zone)
                accels[key] = Accelerator(gpu_memory_gb(row["GpuInfo"]), price)
    return hosts, accels


def _combos(
    hosts: dict[HostKey, Host], accels: dict[AcceleratorKey, Accelerator]
) -> list[tuple[str, str, str, int]]:
    """(machine type, zone, source accelerator name, count) for every composable offer."""
    combos = []
    for machine, zone in hosts:
        if machine in WHOLE_GPU_MACHINES:
            name, count = WHOLE_GPU_MACHINES[machine]
            if (name, count, zone) in accels:
                combos.append((machine, zone, name, count))
    for name, count, zone in accels:
        if name not in N1_GPUS:
            continue
        for shape in N1_HOSTS_PER_GPU:
            machine = shape.format(vcpus=N1_VCPUS_PER_GPU * count)
            if (machine, zone) in hosts:
                combos.append((machine, zone, name, count))
    return sorted(combos)


def _sum(a: int, b: int) -> int:
    return NO_PRICE if NO_PRICE in (a, b) else a + b


def load_gcp_offers(path: Path = GCP_CSV) -> OfferTable:
    """GCP offers (provider "gcp", zones like ``us-central1-a``) priced host + accelerator."""
    hosts, accels = read_gcp_rows(path)
    names = [
        *("provider", "region", "zone", "instance_type", "gpu", "gpu_count", "gpu_memory_gb"),
        *("vcpus", "ram_gb", "on_demand_micros_per_hour", "spot_micros_per_hour", "spot_risk"),
    ]
    cols: dict[str, list] = {name: [] for name in names}
    for machine, zone, name, count in _combos(hosts, accels):
        host, accel = hosts[machine, zone], accels[name, count, zone]
        cols["provider"].append("gcp")
        cols["region"].append(zone.rsplit("-", 1)[0])
        cols["zone"].append(zone)
        cols["instance_type"].append(machine)
        cols["gpu"].append(GPU_NAMES.get(name, name))
        cols["gpu_count"].append(count)
        cols["gpu_memory_gb"].append(accel.memory_gb)
        cols["vcpus"].append(host.vcpus)
        cols["ram_gb"].append(host.ram_gb)
        cols["on_demand_micros_per_hour"].append(_sum(host.price.on_demand, accel.price.on_demand))
        cols["spot_micros_per_hour"].append(_sum(host.price.spot, accel.price.spot))
        cols["spot_risk"].append(0.0)
    return OfferTable.from_columns(cols)
