"""Which Cloud Billing SKUs price a GCP offer, read from google-cloud-billing's own types."""

from __future__ import annotations

from google.cloud import billing_v1

from pricing.gcp_skus import index_skus


def sku(
    description: str, usage: str, nanos: int, unit: str = "h", units: int = 0
) -> billing_v1.Sku:
    rate = billing_v1.PricingExpression.TierRate(
        start_usage_amount=0, unit_price={"currency_code": "USD", "units": units, "nanos": nanos}
    )
    expression = billing_v1.PricingExpression(usage_unit=unit, tiered_rates=[rate])
    return billing_v1.Sku(
        description=description,
        category=billing_v1.Category(resource_group="GPU", usage_type=usage),
        service_regions=["us-central1", "us-east1"],
        pricing_info=[billing_v1.PricingInfo(pricing_expression=expression)],
    )


def test_only_on_demand_and_spot_skus_of_known_families_and_gpus_count() -> None:
    prices = index_skus(
        [
            sku("Nvidia Tesla T4 GPU running in Americas", "OnDemand", 350_000_000),
            sku(
                "Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in Americas",
                "Preemptible",
                140_000_000,
            ),
            sku("H200 141GB GPU running in Americas", "OnDemand", 311_000_000, units=10),
            sku("Nvidia H100 80GB Plus GPU running in Americas", "OnDemand", 1, units=11),
            sku("N1 Predefined Instance Core running in Americas", "OnDemand", 31_611_000),
            sku(
                "Spot Preemptible N1 Predefined Instance Ram running in Americas",
                "Preemptible",
                892_000,
                unit="GiBy.h",
            ),
            # Not what an offer is billed: ignored.
            sku("Nvidia Tesla T4 Virtual Workstation GPU running in Americas", "OnDemand", 9),
            sku("DWS Defined Duration Nvidia H100 80GB GPU running in Americas", "OnDemand", 9),
            sku("Commitment v1: A2 Cpu in Americas for 1 Year", "Commit1Yr", 9),
            sku("N1 Predefined Instance Core running in Americas", "Commit1Yr", 9),
            sku("Custom Instance Core running in Americas", "OnDemand", 9),
            sku(
                "Nvidia Tesla T4 GPU running in Americas", "Preemptible", 9
            ),  # spot, said on demand
            sku("A2 Instance Ram running in Americas", "OnDemand", 9, unit="GBy.mo"),
        ]
    )
    assert prices.prices == {
        ("GPU", "T4", region, market): nanos
        for region in ("us-central1", "us-east1")
        for market, nanos in (("on_demand", 350_000_000), ("spot", 140_000_000))
    } | {
        (kind, name, region, market): nanos
        for region in ("us-central1", "us-east1")
        for kind, name, market, nanos in (
            ("GPU", "H200", "on_demand", 10_311_000_000),
            ("GPU", "H100-MEGA", "on_demand", 11_000_000_001),
            ("Core", "n1", "on_demand", 31_611_000),
            ("Ram", "n1", "spot", 892_000),
        )
    }


def test_an_offer_is_host_plus_its_gpus_and_needs_every_sku() -> None:
    prices = index_skus(
        [
            sku("N1 Predefined Instance Core running in Americas", "OnDemand", 31_611_000),
            sku("N1 Predefined Instance Ram running in Americas", "OnDemand", 4_237_000, "GiBy.h"),
            sku("Nvidia Tesla T4 GPU running in Americas", "OnDemand", 350_000_000),
        ]
    )
    # n1-standard-8 + 1 x T4: 8 x 0.031611 + 30 x 0.004237 + 0.35 = 0.729998 $/h
    assert prices.compose_micros("n1", 8, 30, "T4", 1, "us-central1", "on_demand") == 729_998
    assert prices.compose_micros("n1", 8, 30, "T4", 1, "us-central1", "spot") is None
    assert prices.compose_micros("n1", 8, 30, "T4", 1, "europe-west4", "on_demand") is None
