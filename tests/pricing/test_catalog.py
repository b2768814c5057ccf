"""The bundled catalog: known prices, row counts, GCP composition, table plumbing."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from broker.core.offers import NO_PRICE, Offer, OfferTable
from pricing import spot_prior
from pricing.aws_catalog import AWS_CSV, load_aws_csv
from pricing.catalog import bundled_catalog
from pricing.gcp_catalog import GCP_CSV, N1_GPUS, load_gcp_offers

SOURCE_HEADER = (
    "InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,"
    "AvailabilityZone,Price,SpotPrice"
)
CANONICAL_GPUS = {
    "V100", "V100-32GB", "T4", "T4g", "A10G", "L4", "L40S", "A100", "A100-80GB",
    "H100", "H200", "Radeon Pro V520", "P100", "P4",
}  # fmt: skip


def rows(table: OfferTable, **where: str) -> list[Offer]:
    mask = np.ones(len(table), dtype=bool)
    for column, value in where.items():
        mask &= getattr(table, column) == value
    return [table.row(int(i)) for i in np.flatnonzero(mask)]


def test_p3_2xlarge_in_us_east_1_costs_3_06_per_hour_on_demand() -> None:
    offers = rows(bundled_catalog(), instance_type="p3.2xlarge", region="us-east-1")
    assert offers
    assert {o.on_demand_micros_per_hour for o in offers} == {3_060_000}
    assert {(o.gpu, o.gpu_count, o.gpu_memory_gb, o.vcpus) for o in offers} == {
        ("V100", 1, 16.0, 8.0)
    }


def test_row_counts_match_the_snapshots() -> None:
    with AWS_CSV.open() as handle:
        aws_rows = sum(1 for _ in csv.DictReader(handle))
    assert aws_rows == len(load_aws_csv()) == 1490
    gcp = load_gcp_offers()
    assert len(gcp) == 1070  # per CATALOG.md
    assert len(bundled_catalog()) == aws_rows + len(gcp)


def test_money_columns_are_integer_micros_and_missing_prices_are_minus_one() -> None:
    table = bundled_catalog()
    assert table.on_demand_micros_per_hour.dtype == np.int64
    assert table.spot_micros_per_hour.dtype == np.int64
    aws = table.provider == "aws"
    assert int((table.spot_micros_per_hour[aws] == NO_PRICE).sum()) == 45  # per CATALOG.md
    assert int((table.on_demand_micros_per_hour == NO_PRICE).sum()) == 7  # p5e rows
    for column in (table.on_demand_micros_per_hour, table.spot_micros_per_hour):
        assert ((column > 0) | (column == NO_PRICE)).all()


def test_gpu_names_are_canonical_and_shapes_sane() -> None:
    table = bundled_catalog()
    assert set(np.unique(table.gpu).tolist()) <= CANONICAL_GPUS
    assert (table.gpu_count >= 1).all()
    assert (table.gpu_memory_gb > 0).all()
    assert (table.vcpus > 0).all() and (table.ram_gb > 0).all()
    assert set(np.unique(table.provider).tolist()) == {"aws", "gcp"}


def test_gcp_csv_keeps_the_source_header() -> None:
    assert GCP_CSV.read_text().splitlines()[0] == SOURCE_HEADER


@pytest.mark.parametrize(
    ("machine", "gpu", "on_demand", "spot"),
    [
        ("a2-highgpu-1g", "A100", 739_480 + 2_933_910, 295_760 + 1_147_200),
        ("g2-standard-4", "L4", 146_790 + 560_040, 58_740 + 223_100),
        ("n1-standard-8", "T4", 380_000 + 350_000, 96_300 + 140_000),
        ("n1-highmem-8", "V100", 473_210 + 2_480_000, 119_220 + 992_000),
    ],
)
def test_gcp_offer_is_host_plus_accelerator(machine, gpu, on_demand, spot) -> None:
    (offer,) = rows(load_gcp_offers(), instance_type=machine, gpu=gpu, zone="us-central1-a")
    assert offer.provider == "gcp" and offer.region == "us-central1"
    assert (offer.on_demand_micros_per_hour, offer.spot_micros_per_hour) == (on_demand, spot)


def test_gcp_whole_gpu_machines_carry_their_gpu_count() -> None:
    gcp = load_gcp_offers()
    for machine, gpu, count in [
        ("a2-megagpu-16g", "A100", 16),
        ("a3-megagpu-8g", "H100", 8),
        ("a3-ultragpu-8g", "H200", 8),
        ("g2-standard-48", "L4", 4),
    ]:
        offers = rows(gcp, instance_type=machine)
        assert offers and {(o.gpu, o.gpu_count) for o in offers} == {(gpu, count)}
    n1 = np.char.startswith(gcp.instance_type, "n1-")
    assert set(np.unique(gcp.gpu[n1]).tolist()) <= set(N1_GPUS)
    # 8 vCPUs per attached GPU, standard and highmem hosts
    assert (gcp.vcpus[n1] == 8 * gcp.gpu_count[n1]).all()


def test_spot_risk_is_the_spot_models_prior_its_zones_trace_or_the_fleets() -> None:
    table = bundled_catalog()
    (traced,) = rows(table, instance_type="p3.2xlarge", zone="use1-az6")  # us-east-1a's trace
    assert traced.spot_risk == pytest.approx(spot_prior.prior_rate(("aws", "use1-az6", "p3")))
    assert "us-east-1a" in spot_prior.prior_for(("aws", "use1-az6", "p3")).source
    fleet = spot_prior.prior_stats(spot_prior.fleet_prior()).preemptions_per_hour
    (untraced,) = rows(table, instance_type="p3.2xlarge", zone="use1-az1")
    (a2,) = rows(table, instance_type="a2-highgpu-1g", zone="us-central1-a")
    assert untraced.spot_risk == a2.spot_risk == pytest.approx(fleet)
    assert traced.spot_risk < fleet  # us-east-1a holds spot long


def test_table_round_trips_through_offers_and_concat() -> None:
    table = bundled_catalog().take(np.arange(0, 1865, 97))
    rebuilt = OfferTable.from_offers(table.offers())
    doubled = OfferTable.concat(table, rebuilt)
    assert len(doubled) == 2 * len(table)
    assert doubled.row(len(table) + 3) == table.row(3)
    assert rebuilt.row(0) == table.row(0)


def test_unequal_columns_are_rejected() -> None:
    table = bundled_catalog()
    with pytest.raises(ValueError, match="differ in length"):
        table.replace(gpu=table.gpu[:-1])
