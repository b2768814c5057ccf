"""A small Cloud Billing Catalog API (v1 REST): the calls ``CloudCatalogClient`` makes for
``list_services`` and ``list_skus`` (``pageSize``, ``pageToken``), serving Compute Engine's
SKUs as ``billing_skus.py`` derives them from the bundled GCP catalog and the market's
price changes, with Google's JSON errors and the shared injected faults."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from broker.core.offers import OfferTable
from pricing.gcp_catalog import load_gcp_offers
from pricing.gcp_skus import COMPUTE_SERVICE, SkuKey
from providers.local.asgi_thread import AsgiThread
from providers.local.billing_skus import apply_changes, base_prices, sku_resources
from providers.local.faults import FaultInjector
from providers.local.gce_fake import google_error, injected_fault
from providers.local.market import MarketReplay
from providers.local.paging import page_offset, page_token, query_key

logger = logging.getLogger(__name__)

MAX_PAGE_SIZE = 5000  # the API's default and largest page
_EPOCH = datetime(2024, 1, 1, tzinfo=UTC)


class BillingFake:
    """The fake Cloud Billing Catalog API under uvicorn, in a daemon thread on a loopback
    port. Prices are the bundled catalog's, moved by ``market`` (provider "gcp")."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        market: MarketReplay | None = None,
        faults: FaultInjector | None = None,
    ) -> None:
        self.market = market
        self.faults = faults
        self.app = build_app(self)
        self._server = AsgiThread(self.app, host, port, "billing-fake")

    @cached_property
    def base(self) -> dict[SkuKey, int]:
        """Every SKU's price from the catalog alone (nano-dollars)."""
        return base_prices()

    @cached_property
    def offers(self) -> OfferTable:
        return load_gcp_offers()

    def skus(self) -> list[dict[str, Any]]:
        """Compute Engine's SKUs now, in the API's JSON shape."""
        prices, since = dict(self.base), {}
        if self.market is not None:
            apply_changes(prices, since, self.market.price_changes("gcp"), self.offers)
        start = self.market.start_time if self.market is not None else _EPOCH
        return sku_resources(prices, since, start)

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``, valid once started."""
        return self._server.url

    def start(self) -> BillingFake:
        """Bind the port and serve in a thread."""
        self.base  # noqa: B018 - fit the SKUs before the first request waits for it
        self._server.start()
        logger.info("billing fake listening", extra={"endpoint_url": self.endpoint_url})
        return self

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for the thread."""
        self._server.stop()

    def __enter__(self) -> BillingFake:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def build_app(fake: BillingFake) -> Starlette:
    """The Starlette application serving ``fake``'s SKUs."""
    service_id = COMPUTE_SERVICE.split("/", 1)[1]

    async def services(request: Request) -> JSONResponse:
        failure = await injected_fault(fake.faults)
        if failure is not None:
            return failure
        service = {
            "name": COMPUTE_SERVICE,
            "serviceId": service_id,
            "displayName": "Compute Engine",
            "businessEntityName": "businessEntities/GCP",
        }
        return JSONResponse({"services": [service]})

    async def skus(request: Request) -> JSONResponse:
        failure = await injected_fault(fake.faults)
        if failure is not None:
            return failure
        if request.path_params["service"] != service_id:
            return google_error(404, "notFound", "Service not found.")
        currency = request.query_params.get("currencyCode", "USD")
        if currency != "USD":
            return google_error(400, "badRequest", "The local billing catalog prices in USD.")
        try:
            size = int(request.query_params.get("pageSize") or MAX_PAGE_SIZE)
        except ValueError:
            return google_error(400, "badRequest", "Invalid pageSize.")
        size = min(max(size, 1), MAX_PAGE_SIZE)
        query = query_key(request.path_params["service"], currency)
        offset = page_offset(request.query_params.get("pageToken"), query)
        if offset is None:
            return google_error(400, "badRequest", "Invalid page token.")
        found = fake.skus()
        body: dict[str, Any] = {"skus": found[offset : offset + size], "nextPageToken": ""}
        if offset + size < len(found):
            body["nextPageToken"] = page_token(offset + size, query)
        return JSONResponse(body)

    return Starlette(
        routes=[
            Route("/v1/services", services, methods=["GET"]),
            Route("/v1/services/{service}/skus", skus, methods=["GET"]),
        ]
    )
