"""The Cloud Billing Catalog fake through google-cloud-billing's CloudCatalogClient: SKUs
derived from the bundled GCP catalog, paging, and prices moved by the market."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import billing_v1

from pricing.gcp_catalog import load_gcp_offers
from pricing.gcp_skus import COMPUTE_SERVICE, index_skus
from providers.local import LocalCloud
from providers.local.billing_skus import host_fit_residual

# The source rounds every price to 5 decimals (10 micro-dollars); CATALOG.md has the figures.
COMPOSITION_TOLERANCE_MICROS = 10


def catalog_client(cloud: LocalCloud) -> billing_v1.CloudCatalogClient:
    return billing_v1.CloudCatalogClient(
        credentials=AnonymousCredentials(),
        transport="rest",
        client_options={"api_endpoint": cloud.gcp_billing_endpoint_url},
    )


@pytest.fixture
def skus(local_cloud: LocalCloud) -> Iterator[list[billing_v1.Sku]]:
    yield list(catalog_client(local_cloud).list_skus(parent=COMPUTE_SERVICE))


def test_list_services_names_compute_engine(local_cloud: LocalCloud) -> None:
    (service,) = catalog_client(local_cloud).list_services()
    assert (service.name, service.display_name) == (COMPUTE_SERVICE, "Compute Engine")


def test_skus_have_the_real_shape_and_descriptions(skus: list[billing_v1.Sku]) -> None:
    descriptions = {s.description for s in skus}
    assert "Nvidia Tesla T4 GPU running in Americas" in descriptions
    assert (
        "Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in Americas" in descriptions
    )
    assert any(d.startswith("N1 Predefined Instance Core running in ") for d in descriptions)
    assert any(d.startswith("Spot Preemptible A2 Instance Ram running in ") for d in descriptions)
    t4 = next(
        s
        for s in skus
        if s.description == "Nvidia Tesla T4 GPU running in Americas"
        and "us-central1" in s.service_regions
    )
    assert t4.name == f"{COMPUTE_SERVICE}/skus/{t4.sku_id}"
    assert (t4.category.resource_group, t4.category.usage_type) == ("GPU", "OnDemand")
    expression = t4.pricing_info[0].pricing_expression
    assert (expression.usage_unit, expression.base_unit_conversion_factor) == ("h", 3600)
    price = expression.tiered_rates[0].unit_price
    assert price.currency_code == "USD" and price.units == 0 and price.nanos == 350_000_000
    ram = next(s for s in skus if s.description.startswith("G2 Instance Ram"))
    assert ram.pricing_info[0].pricing_expression.usage_unit == "GiBy.h"
    assert ram.category.resource_group == "RAM"
    regions = [
        r
        for s in skus
        if s.description.startswith("Nvidia L4 GPU running")
        for r in s.service_regions
    ]
    assert len(regions) == len(set(regions))  # one on-demand L4 price per region


def test_list_skus_pages_with_page_size_and_tokens(local_cloud: LocalCloud, skus: list) -> None:
    client = catalog_client(local_cloud)
    pager = client.list_skus(request={"parent": COMPUTE_SERVICE, "page_size": 50})
    pages = list(pager.pages)
    assert len(pages) == -(-len(skus) // 50) > 1
    assert all(len(p.skus) == 50 for p in pages[:-1]) and pages[-1].next_page_token == ""
    assert [s.sku_id for p in pages for s in p.skus] == [s.sku_id for s in skus]
    with pytest.raises(gexc.BadRequest):
        client.list_skus(request={"parent": COMPUTE_SERVICE, "page_token": "bm90LWEtdG9rZW4="})
    with pytest.raises(gexc.NotFound):
        list(client.list_skus(parent="services/0000-0000-0000"))


def test_host_skus_fit_the_catalog_host_rows_within_a_cent() -> None:
    assert host_fit_residual() <= 10_000  # what the fit must do
    assert host_fit_residual() <= COMPOSITION_TOLERANCE_MICROS  # what it does


def test_skus_compose_every_bundled_offer_price(skus: list[billing_v1.Sku]) -> None:
    prices = index_skus(skus)
    worst = 0
    for offer in load_gcp_offers().offers():
        accelerator = "H100-MEGA" if offer.instance_type == "a3-megagpu-8g" else offer.gpu
        for market, listed in (
            ("on_demand", offer.on_demand_micros_per_hour),
            ("spot", offer.spot_micros_per_hour),
        ):
            composed = prices.compose_micros(
                offer.instance_type.split("-")[0],
                offer.vcpus,
                offer.ram_gb,
                accelerator,
                offer.gpu_count,
                offer.region,
                market,
            )
            assert (composed is None) == (listed < 0), (offer, market)
            if composed is not None:
                worst = max(worst, abs(composed - listed))
    assert worst <= COMPOSITION_TOLERANCE_MICROS


def test_a_market_change_of_an_offer_moves_its_gpu_sku(local_cloud: LocalCloud) -> None:
    client = catalog_client(local_cloud)
    local_cloud.market.set_price("gcp", "us-central1-a", "g2-standard-4", "spot", 300_000)
    prices = index_skus(client.list_skus(parent=COMPUTE_SERVICE))
    assert prices.compose_micros("g2", 4, 16, "L4", 1, "us-central1", "spot") == 300_000
    # The GPU SKU is regional: every L4 offer of the region moves with it.
    g2_8 = prices.compose_micros("g2", 8, 32, "L4", 1, "us-central1", "spot")
    host_8 = prices.compose_micros("g2", 8, 32, "L4", 0, "us-central1", "spot")
    host_4 = prices.compose_micros("g2", 4, 16, "L4", 0, "us-central1", "spot")
    assert g2_8 is not None and host_8 is not None and host_4 is not None
    assert abs((g2_8 - host_8) - (300_000 - host_4)) <= 1
    local_cloud.market.set_price("gcp", "us-central1-a", "g2-standard-4", "spot", -1)
    prices = index_skus(client.list_skus(parent=COMPUTE_SERVICE))
    assert prices.get("GPU", "L4", "us-central1", "spot") is None
    assert prices.get("GPU", "L4", "us-central1", "on_demand") is not None
