"""A small Compute Engine v1 REST server: exactly the calls ``providers/gcp.py`` makes.

Instances insert/get/delete/list/aggregatedList, zone operations get/wait/list, zones,
machine types and accelerator types (per zone and aggregated, as ``gce_catalog.ZoneCatalog``
says); ``requestId`` deduplication, label filters, partial responses (every reply honours the
``fields`` query parameter or the ``X-Goog-FieldMask`` header, see ``partial_response``),
Google's JSON errors, spot capacity and preemption (after a notice) from the market, injected
faults; with ``LocalInstances``, each instance's ``startup-script`` runs as a local process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from broker import clock as broker_clock
from broker.clock import Clock
from providers.local.asgi_thread import AsgiThread
from providers.local.faults import Fault, FaultInjector
from providers.local.gce_catalog import (
    ZoneCatalog,
    accelerator_type_resource,
    machine_type_resource,
)
from providers.local.gce_state import BASE, ApiError, ComputeState, matches_filter
from providers.local.instances import NOTICE_SECONDS, LocalInstances
from providers.local.market import MarketReplay
from providers.local.partial_response import Selection, parse_fields, project

logger = logging.getLogger(__name__)
Handler = Callable[[Request], Awaitable[Any]]

_FAULTS = {
    Fault.THROTTLE: (429, "rateLimitExceeded", "usageLimits", "Rate Limit Exceeded"),
    Fault.SERVER_ERROR: (500, "backendError", "global", "Internal Error"),
    Fault.UNAVAILABLE: (503, "backendError", "global", "Backend Error"),
}


def google_error(status: int, reason: str, message: str, domain: str = "global") -> JSONResponse:
    """Google's JSON error document."""
    errors = [{"message": message, "domain": domain, "reason": reason}]
    body = {"error": {"code": status, "message": message, "errors": errors}}
    return JSONResponse(body, status_code=status)


async def injected_fault(faults: FaultInjector | None) -> JSONResponse | None:
    """Google's error answer to an injected fault, or None (after an injected delay)."""
    fault = faults.decide() if faults is not None else None
    if fault is Fault.DELAY:
        await asyncio.sleep(faults.delay_seconds if faults else 0)
    elif fault is not None:
        status, reason, domain, message = _FAULTS[fault]
        return google_error(status, reason, message, domain)
    return None


def partial_response(request: Request) -> Selection | None:
    """The reply's field selection: the ``fields`` system parameter (query ``fields`` or
    ``$fields``, or header ``X-Goog-FieldMask``), None for the whole resource."""
    query = request.query_params
    text = query.get("fields") or query.get("$fields") or request.headers.get("x-goog-fieldmask")
    if not text or not text.strip():
        return None
    try:
        return parse_fields(text)
    except ValueError as exc:
        raise ApiError(400, "invalidParameter", str(exc)) from None


def build_app(
    state: ComputeState, faults: FaultInjector | None = None, catalog: ZoneCatalog | None = None
) -> Starlette:
    """The Starlette application serving ``state``, listing the zones of ``catalog``."""
    catalog = catalog or ZoneCatalog(state.zones)

    def endpoint(handler: Handler) -> Handler:
        async def serve(request: Request) -> JSONResponse:
            failure = await injected_fault(faults)
            if failure is not None:
                return failure
            try:
                selection = partial_response(request)
                body = await handler(request)
                return JSONResponse(body if selection is None else project(body, selection))
            except ApiError as exc:
                return google_error(exc.status, exc.reason, exc.message)

        return serve

    def params(request: Request) -> tuple[str, str]:
        return request.path_params["project"], request.path_params.get("zone", "")

    async def insert(request: Request) -> Any:
        project, zone = params(request)
        body = await request.json()
        request_id = request.query_params.get("requestId")
        # Off the event loop: starting (and below, killing) an instance's process takes time.
        return await run_in_threadpool(state.insert, project, zone, body, request_id)

    async def get(request: Request) -> Any:
        return state.get(*params(request), request.path_params["instance"])

    async def delete(request: Request) -> Any:
        project, zone = params(request)
        name, request_id = request.path_params["instance"], request.query_params.get("requestId")
        return await run_in_threadpool(state.delete, project, zone, name, request_id)

    async def list_instances(request: Request) -> Any:
        items = state.list(*params(request), request.query_params.get("filter"))
        return {"kind": "compute#instanceList", "id": "instances", "items": items}

    async def aggregated(request: Request) -> Any:
        project, expression = request.path_params["project"], request.query_params.get("filter")
        items: dict[str, Any] = {}
        for zone in state.zones:
            found = state.list(project, zone, expression)
            items[f"zones/{zone}"] = (
                {"instances": found}
                if found
                else {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "No results."}}
            )
        return {"kind": "compute#instanceAggregatedList", "id": project, "items": items}

    async def operation(request: Request) -> Any:
        return state.operation(*params(request), request.path_params["operation"])

    async def list_operations(request: Request) -> Any:
        items = state.operations(*params(request), request.query_params.get("filter"))
        return {"kind": "compute#operationList", "id": "operations", "items": items}

    def check_listed(zone: str) -> None:
        if zone not in catalog.zones:
            raise ApiError(404, "notFound", f"The resource 'zones/{zone}' was not found")

    def zone_resource(project: str, zone: str) -> dict[str, Any]:
        return {
            "kind": "compute#zone",
            "name": zone,
            "status": catalog.status(zone),
            "region": f"{BASE}/projects/{project}/regions/{zone.rsplit('-', 1)[0]}",
            "selfLink": f"{BASE}/projects/{project}/zones/{zone}",
        }

    async def zones(request: Request) -> Any:
        project = request.path_params["project"]
        return {
            "kind": "compute#zoneList",
            "items": [zone_resource(project, z) for z in catalog.zones],
        }

    async def zone(request: Request) -> Any:
        project, name = params(request)
        check_listed(name)
        return zone_resource(project, name)

    Names = Callable[[str], Iterable[str]]

    def listing(names: Names, make: Callable[..., dict[str, Any]], kind: str) -> Handler:
        async def serve(request: Request) -> Any:
            project, zone_name = params(request)
            check_listed(zone_name)
            items = [make(BASE, project, zone_name, n) for n in names(zone_name)]
            return {"kind": kind, "items": items}

        return serve

    def aggregated_listing(
        names: Names, make: Callable[..., dict[str, Any]], kind: str, key: str
    ) -> Handler:
        async def serve(request: Request) -> Any:
            project, expression = request.path_params["project"], request.query_params.get("filter")
            items: dict[str, Any] = {}
            for zone_name in catalog.zones:
                found = [make(BASE, project, zone_name, n) for n in names(zone_name)]
                found = [r for r in found if matches_filter(r, expression)]
                items[f"zones/{zone_name}"] = (
                    {key: found}
                    if found
                    else {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "No results."}}
                )
            return {"kind": kind, "id": project, "items": items}

        return serve

    def item(names: Names, make: Callable[..., dict[str, Any]]) -> Handler:
        async def serve(request: Request) -> Any:
            project, zone_name = params(request)
            check_listed(zone_name)
            name = request.path_params["name"]
            if name not in names(zone_name):
                raise ApiError(404, "notFound", f"The resource '{name}' was not found")
            return make(BASE, project, zone_name, name)

        return serve

    prefix = "/compute/v1/projects/{project}"
    zone_prefix = prefix + "/zones/{zone}"
    routes = [
        Route(zone_prefix + "/instances", endpoint(insert), methods=["POST"]),
        Route(zone_prefix + "/instances", endpoint(list_instances), methods=["GET"]),
        Route(zone_prefix + "/instances/{instance}", endpoint(get), methods=["GET"]),
        Route(zone_prefix + "/instances/{instance}", endpoint(delete), methods=["DELETE"]),
        Route(prefix + "/aggregated/instances", endpoint(aggregated), methods=["GET"]),
        Route(zone_prefix + "/operations", endpoint(list_operations), methods=["GET"]),
        Route(zone_prefix + "/operations/{operation}", endpoint(operation), methods=["GET"]),
        Route(zone_prefix + "/operations/{operation}/wait", endpoint(operation), methods=["POST"]),
        Route(prefix + "/zones", endpoint(zones), methods=["GET"]),
        Route(zone_prefix, endpoint(zone), methods=["GET"]),
    ]
    machines, accelerators = catalog.machine_types, catalog.accelerator_types
    for plural, names, make, kind in (
        ("machineTypes", machines, machine_type_resource, "compute#machineType"),
        ("acceleratorTypes", accelerators, accelerator_type_resource, "compute#acceleratorType"),
    ):
        routes += [
            Route(f"{zone_prefix}/{plural}", endpoint(listing(names, make, f"{kind}List"))),
            Route(f"{zone_prefix}/{plural}/{{name}}", endpoint(item(names, make))),
            Route(
                f"{prefix}/aggregated/{plural}",
                endpoint(aggregated_listing(names, make, f"{kind}AggregatedList", plural)),
            ),
        ]
    return Starlette(routes=routes)


class GceFake:
    """The fake Compute Engine API under uvicorn, in a daemon thread on a loopback port."""

    def __init__(
        self,
        zones: Iterable[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        market: MarketReplay | None = None,
        faults: FaultInjector | None = None,
        clock: Clock | None = None,
        instances: LocalInstances | None = None,
        spot_notice_seconds: float = NOTICE_SECONDS["gcp"],
    ) -> None:
        self.host, self.port = host, port
        self.market = market
        now: Callable[[], datetime] = clock.now if clock is not None else broker_clock.now
        self.state = ComputeState(
            zones,
            now=now,
            market=market,
            instances=instances,
            notice_seconds=spot_notice_seconds,
        )
        self.catalog = ZoneCatalog(zones)
        self.app = build_app(self.state, faults, self.catalog)
        self._server = AsgiThread(self.app, host, port, "gce-fake")

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``, valid once started."""
        return self._server.url

    def start(self) -> GceFake:
        """Bind the port, serve in a thread, and attach the preemptor to the market."""
        self._server.start()
        self.port = self._server.port
        if self.market is not None:
            self.market.attach(self.state.preempt)
        logger.info("GCE fake listening", extra={"endpoint_url": self.endpoint_url})
        return self

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for the thread."""
        self._server.stop()

    def __enter__(self) -> GceFake:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
