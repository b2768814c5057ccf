"""The GCP catalog: its rows as read, region and zone coverage, and the H100 resolution."""

from __future__ import annotations

import csv

import numpy as np

from broker.core.offers import NO_PRICE
from pricing.gcp_catalog import (
    GCE_ACCELERATOR_TYPES,
    GCP_CSV,
    N1_GPUS,
    Accelerator,
    Host,
    Price,
    load_gcp_offers,
    read_gcp_rows,
)

# Per-GPU on-demand prices the source repeats across unrelated regions (CATALOG.md):
# the H100 and H100-MEGA rows carrying them were left out of the file.
INCONSISTENT_H100 = {
    ("H100", 1): "4.20076",
    ("H100", 2): "8.40152",
    ("H100", 4): "16.80304",
    ("H100", 8): "33.60609",
    ("H100-MEGA", 8): "35.39149",
}


def csv_rows() -> list[dict[str, str]]:
    with GCP_CSV.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def test_rows_are_read_as_hosts_and_accelerators_keyed_by_zone() -> None:
    hosts, accels = read_gcp_rows()
    assert hosts["a2-highgpu-1g", "us-central1-a"] == Host(12.0, 85.0, Price(739_480, 295_760))
    assert accels["A100", 1, "us-central1-a"] == Accelerator(40.0, Price(2_933_910, 1_147_200))
    assert accels["H200", 8, "us-east5-a"].price == Price(36_602_580, NO_PRICE)  # no spot
    rows = csv_rows()
    assert len(hosts) + len(accels) == len(rows) == 1483


def test_offers_cover_every_gpu_region_and_zone_of_the_file() -> None:
    zones = {r["AvailabilityZone"] for r in csv_rows() if not r["InstanceType"]}
    offers = load_gcp_offers()
    assert set(offers.zone.tolist()) == zones
    assert set(offers.region.tolist()) == {region_of(z) for z in zones}
    assert len(zones) == 73 and len({region_of(z) for z in zones}) == 30
    for region in ("asia-south1", "europe-west1", "me-central2", "southamerica-east1"):
        assert region in offers.region


def test_every_row_of_the_file_composes_into_an_offer() -> None:
    offers = load_gcp_offers()
    used = set(zip(offers.instance_type.tolist(), offers.zone.tolist(), strict=True))
    hosts, accels = read_gcp_rows()
    assert set(hosts) <= used
    gpus = offers.gpu.tolist(), offers.gpu_count.tolist(), offers.zone.tolist()
    gpu_zones = set(zip(*gpus, strict=True))
    for name, count, zone in accels:
        assert name in GCE_ACCELERATOR_TYPES
        assert ({"H100-MEGA": "H100"}.get(name, name), count, zone) in gpu_zones


def test_n1_gpus_attach_in_every_zone_that_lists_them() -> None:
    offers = load_gcp_offers()
    _, accels = read_gcp_rows()
    for name, count, zone in accels:
        if name in N1_GPUS:
            at = (offers.zone == zone) & (offers.gpu == name) & (offers.gpu_count == count)
            assert sorted(offers.instance_type[at].tolist()) == [
                f"n1-highmem-{8 * count}",
                f"n1-standard-{8 * count}",
            ]


def test_h100_rows_with_the_inconsistent_on_demand_price_are_left_out() -> None:
    for row in csv_rows():
        key = (row["AcceleratorName"], int(row["AcceleratorCount"] or 0))
        assert INCONSISTENT_H100.get(key) != row["Price"]
    offers = load_gcp_offers()
    h100 = offers.take(np.flatnonzero(offers.gpu == "H100"))
    per_gpu = h100.on_demand_micros_per_hour / h100.gpu_count
    # every H100 left: on demand dearer than spot, and per GPU (host included) at least the
    # us-east4 list price of an a3-highgpu-1g: 1.18251 + 9.79655 $/h
    assert (h100.on_demand_micros_per_hour > h100.spot_micros_per_hour).all()
    assert per_gpu.min() >= 10_979_060 * 0.99
    assert not ((h100.zone == "us-central1-a") & (h100.instance_type == "a3-highgpu-1g")).any()
    (a3,) = [
        o for o in h100.offers() if (o.zone, o.instance_type) == ("us-east4-a", "a3-highgpu-1g")
    ]
    assert (a3.on_demand_micros_per_hour, a3.spot_micros_per_hour) == (10_979_060, 1_976_140)
