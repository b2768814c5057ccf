"""The AWS snapshot (``data/aws-gpu-vms.csv``) as an offer table."""

from __future__ import annotations

import csv
from pathlib import Path

from broker.core.offers import CATALOG_FIELDS, OfferTable
from pricing.snapshot import DATA_DIR, gpu_memory_gb, price_micros

AWS_CSV = DATA_DIR / "aws-gpu-vms.csv"


def load_aws_csv(path: Path = AWS_CSV) -> OfferTable:
    """The AWS snapshot rows as offers (zone = AWS zone id, e.g. ``use1-az2``); risk 0."""
    cols: dict[str, list] = {name: [] for name in CATALOG_FIELDS}
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            cols["provider"].append("aws")
            cols["region"].append(row["Region"])
            cols["zone"].append(row["AvailabilityZone"])
            cols["instance_type"].append(row["InstanceType"])
            cols["gpu"].append(row["AcceleratorName"])
            cols["gpu_count"].append(int(float(row["AcceleratorCount"])))
            cols["gpu_memory_gb"].append(gpu_memory_gb(row["GpuInfo"]))
            cols["vcpus"].append(float(row["vCPUs"]))
            cols["ram_gb"].append(float(row["MemoryGiB"]))
            cols["on_demand_micros_per_hour"].append(price_micros(row["Price"]))
            cols["spot_micros_per_hour"].append(price_micros(row["SpotPrice"]))
            cols["spot_risk"].append(0.0)
    return OfferTable.from_columns(cols)
