"""A small Compute Engine v1 REST server: exactly the calls ``providers/gcp.py`` makes.

Instances insert/get/delete/list/aggregatedList, zone operations get/wait/list, zones,
machine types and accelerator types; ``requestId`` deduplication, label filters,
Google's JSON errors, spot capacity and preemption (after a notice) from the market, injected
faults; with ``LocalInstances``, each instance's ``startup-script`` runs as a local process.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from broker import clock as broker_clock
from broker.clock import Clock
from providers.local.faults import Fault, FaultInjector
from providers.local.gce_catalog import (
    ACCELERATOR_TYPES,
    MACHINE_TYPES,
    accelerator_type_resource,
    machine_type_resource,
)
from providers.local.gce_state import BASE, ApiError, ComputeState
from providers.local.instances import NOTICE_SECONDS, LocalInstances
from providers.local.market import MarketReplay

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


def build_app(state: ComputeState, faults: FaultInjector | None = None) -> Starlette:
    """The Starlette application serving ``state``."""

    def endpoint(handler: Handler) -> Handler:
        async def serve(request: Request) -> JSONResponse:
            fault = faults.decide() if faults is not None else None
            if fault is Fault.DELAY:
                await asyncio.sleep(faults.delay_seconds if faults else 0)
            elif fault is not None:
                status, reason, domain, message = _FAULTS[fault]
                return google_error(status, reason, message, domain)
            try:
                return JSONResponse(await handler(request))
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

    def zone_resource(project: str, zone: str) -> dict[str, Any]:
        return {
            "kind": "compute#zone",
            "name": zone,
            "status": "UP",
            "region": f"{BASE}/projects/{project}/regions/{zone.rsplit('-', 1)[0]}",
            "selfLink": f"{BASE}/projects/{project}/zones/{zone}",
        }

    async def zones(request: Request) -> Any:
        project = request.path_params["project"]
        return {
            "kind": "compute#zoneList",
            "items": [zone_resource(project, z) for z in state.zones],
        }

    async def zone(request: Request) -> Any:
        project, name = params(request)
        state.check_zone(name)
        return zone_resource(project, name)

    def catalog(names: Iterable[str], make: Callable[..., dict[str, Any]], kind: str) -> Handler:
        async def listing(request: Request) -> Any:
            project, zone_name = params(request)
            state.check_zone(zone_name)
            return {"kind": kind, "items": [make(BASE, project, zone_name, n) for n in names]}

        return listing

    def catalog_item(names: Iterable[str], make: Callable[..., dict[str, Any]]) -> Handler:
        known = set(names)

        async def item(request: Request) -> Any:
            project, zone_name = params(request)
            state.check_zone(zone_name)
            name = request.path_params["name"]
            if name not in known:
                raise ApiError(404, "notFound", f"The resource '{name}' was not found")
            return make(BASE, project, zone_name, name)

        return item

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
        Route(
            zone_prefix + "/machineTypes",
            endpoint(catalog(MACHINE_TYPES, machine_type_resource, "compute#machineTypeList")),
        ),
        Route(
            zone_prefix + "/machineTypes/{name}",
            endpoint(catalog_item(MACHINE_TYPES, machine_type_resource)),
        ),
        Route(
            zone_prefix + "/acceleratorTypes",
            endpoint(
                catalog(ACCELERATOR_TYPES, accelerator_type_resource, "compute#acceleratorTypeList")
            ),
        ),
        Route(
            zone_prefix + "/acceleratorTypes/{name}",
            endpoint(catalog_item(ACCELERATOR_TYPES, accelerator_type_resource)),
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
        self.app = build_app(self.state, faults)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``, valid once started."""
        if self._server is None:
            raise RuntimeError("GceFake is not started")
        return f"http://{self.host}:{self.port}"

    def start(self) -> GceFake:
        """Bind the port, serve in a thread, and attach the preemptor to the market."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="gce-fake", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the GCE fake did not start")
            time.sleep(0.01)
        if self.market is not None:
            self.market.attach(self.state.preempt)
        logger.info("GCE fake listening", extra={"endpoint_url": self.endpoint_url})
        return self

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for the thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> GceFake:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
