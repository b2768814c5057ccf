"""Local AWS: moto's server in-process (EC2, S3) behind a middleware that adds what
moto lacks and the broker relies on: ClientToken idempotency, spot capacity from the
market replay, spot interruptions with their two-minute notice, injected faults, placement
groups (``aws_placement.py``), prices
(the Price List API and the spot price history, ``aws_pricing.py``), and real instances:
the user data script of each launch runs as a local process (``LocalInstances``)."""

from __future__ import annotations

import io
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, unquote
from xml.sax.saxutils import escape

from moto.ec2.models import ec2_backends
from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend
from moto.ec2.models.instances import Instance, StateReason
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import BaseWSGIServer, make_server

from providers.local.aws_launch import (
    boot_script,
    gpu_count_of_instance_type,
    gpu_of_instance_type,
    request_tags,
)
from providers.local.aws_placement import PlacementGroups
from providers.local.aws_pricing import AwsPrices, pricing_fault
from providers.local.aws_spot_history import describe_spot_price_history
from providers.local.faults import Fault, FaultInjector
from providers.local.instances import NOTICE_SECONDS, LocalInstances
from providers.local.market import MarketReplay

logger = logging.getLogger(__name__)

SPOT_TERMINATION = StateReason(
    "Server.SpotInstanceTermination: Spot instance termination", "Server.SpotInstanceTermination"
)
_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/(?P<region>[^/]+)/(?P<service>[^/]+)/")
_INSTANCE_ID = re.compile(r"<instanceId>(i-[0-9a-f]+)</instanceId>")
StartResponse = Callable[..., Any]


def zone_names(regions: Iterable[str]) -> list[str]:
    """The zone names moto serves in ``regions`` (us-east-1a, ...)."""
    return [
        zone.name for region in regions for zone in RegionsAndZonesBackend.zones.get(region, [])
    ]


# Moto's EC2 state is plain dicts: requests (served on threads) and the market's thread that
# forgets old instances take turns on it.
EC2_STATE = threading.RLock()
FORGET_AFTER = timedelta(hours=1)  # EC2 lists a terminated instance for about an hour


def _ec2_instances() -> Iterator[tuple[str, Any, Instance]]:
    for account in list(ec2_backends.keys()):
        for backend in list(ec2_backends[account].values()):
            for reservation in list(backend.reservations.values()):
                for instance in list(reservation.instances):
                    yield reservation.id, backend, instance


def _xml_response(
    start_response: StartResponse, status: str, body: str, extra: Iterable[tuple[str, str]] = ()
) -> list[bytes]:
    data = body.encode()
    headers = [("Content-Type", "text/xml"), ("Content-Length", str(len(data))), *extra]
    start_response(status, headers)
    return [data]


def ec2_error(start_response: StartResponse, status: str, code: str, message: str) -> list[bytes]:
    """Answer with EC2's XML error document."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error>'
        f"<Code>{code}</Code><Message>{escape(message)}</Message></Error></Errors>"
        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
    )
    return _xml_response(start_response, status, body)


def s3_error(start_response: StartResponse, status: str, code: str, message: str) -> list[bytes]:
    """Answer with S3's XML error document."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{escape(message)}</Message>"
        f"<RequestId>{uuid.uuid4()}</RequestId></Error>"
    )
    return _xml_response(start_response, status, body)


_FAULT_ANSWERS = {
    ("ec2", Fault.THROTTLE): ("503 Service Unavailable", "RequestLimitExceeded"),
    ("ec2", Fault.SERVER_ERROR): ("500 Internal Server Error", "InternalError"),
    ("ec2", Fault.UNAVAILABLE): ("503 Service Unavailable", "Unavailable"),
    ("s3", Fault.THROTTLE): ("503 Slow Down", "SlowDown"),
    ("s3", Fault.SERVER_ERROR): ("500 Internal Server Error", "InternalError"),
    ("s3", Fault.UNAVAILABLE): ("503 Service Unavailable", "ServiceUnavailable"),
}


class CloudBehaviour:
    """WSGI middleware in front of moto: faults, spot capacity, prices, ClientToken
    idempotency, and the processes of the instances it launches and terminates."""

    def __init__(
        self,
        app: Any,
        market: MarketReplay | None,
        faults: FaultInjector | None,
        instances: LocalInstances | None = None,
        capacity: dict[tuple[str, str], int] | None = None,
    ) -> None:
        self.app = app
        self.market = market
        self.faults = faults
        self.instances = instances
        # (zone name, instance type) -> how many live instances of it the zone holds at most
        self.capacity = capacity if capacity is not None else {}
        self.prices = AwsPrices(market)
        self.placement_groups = PlacementGroups()
        self._launch_lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Any:
        # A signed header, or a presigned URL's X-Amz-Credential (the agents' checkpoints).
        signed = environ.get("HTTP_AUTHORIZATION") or unquote(environ.get("QUERY_STRING", ""))
        scope = _SCOPE.search(signed)
        service, region = (scope["service"], scope["region"]) if scope else ("", "")
        if service in ("ec2", "s3", "pricing") and self.faults is not None:
            fault = self.faults.decide()
            if fault is Fault.DELAY:
                time.sleep(self.faults.delay_seconds)
            elif fault is not None and service == "pricing":
                return pricing_fault(start_response, fault)
            elif fault is not None:
                status, code = _FAULT_ANSWERS[(service, fault)]
                answer = ec2_error if service == "ec2" else s3_error
                return answer(start_response, status, code, f"injected fault: {fault}")
        if service == "pricing":
            return self.prices.get_products(environ, start_response)
        if service != "ec2":
            return self.app(environ, start_response)
        if environ.get("REQUEST_METHOD") != "POST":
            return [_moto(self.app, environ, start_response)[1]]
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        params = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        if params.get("Action") == "DescribeSpotPriceHistory":
            return describe_spot_price_history(self.prices, params, region, start_response)
        if params.get("Action") == "TerminateInstances":
            return self._terminate(params, environ, start_response)
        placement = self.placement_groups.handle(params, region, start_response, ec2_error)
        if placement is not None:
            return placement
        if params.get("Action") != "RunInstances":
            return [_moto(self.app, environ, start_response)[1]]
        with self._launch_lock:  # one RunInstances at a time keeps the token check exact
            token = params.get("ClientToken")
            existing = self._find_by_token(token) if token else None
            if existing is not None:
                return _xml_response(start_response, "200 OK", _run_instances_xml(*existing))
            unknown = self.placement_groups.refusal(params, region)
            if unknown:
                return ec2_error(
                    start_response, "400 Bad Request", "InvalidPlacementGroup.Unknown", unknown
                )
            refusal = self._capacity_refusal(params)
            if refusal:
                return ec2_error(
                    start_response,
                    "500 Internal Server Error",
                    "InsufficientInstanceCapacity",
                    refusal,
                )
            status, body = _moto(self.app, environ, start_response)
        if status.startswith("200"):
            self._start_instances(_INSTANCE_ID.findall(body.decode("utf-8", "replace")), params)
        return [body]

    def _start_instances(self, instance_ids: list[str], params: dict[str, str]) -> None:
        if self.instances is None:
            return
        script = boot_script(params.get("UserData"))
        if script is None:
            logger.info("launch without a boot script: nothing runs", extra={"ids": instance_ids})
            return
        instance_type = params.get("InstanceType", "m1.small")
        gpu, count = gpu_of_instance_type(instance_type), gpu_count_of_instance_type(instance_type)
        tags = request_tags(params)
        for instance_id in instance_ids:
            try:
                self.instances.start(instance_id, "aws", script, gpu, count, tags)
            except Exception:  # the launch stands, as a machine that failed to boot would
                logger.exception("local instance did not start", extra={"instance_id": instance_id})

    def _terminate(
        self, params: dict[str, str], environ: dict[str, Any], start_response: StartResponse
    ) -> Any:
        # EC2 leaves an already terminated instance alone; moto would overwrite its state
        # reason, and with it the evidence of a spot interruption.
        ids = {v for k, v in params.items() if k.startswith("InstanceId.")}
        ended = [
            (i, i.state_reason, i._reason)
            for _, _, i in _ec2_instances()
            if i.id in ids and i.state == "terminated"
        ]
        status, body = _moto(self.app, environ, start_response)
        for instance, reason, transition in ended:
            instance.state_reason, instance._reason = reason, transition
        if status.startswith("200") and self.instances is not None:
            self.instances.kill_many(sorted(ids))
        return [body]

    def _find_by_token(self, token: str) -> tuple[str, Any, Instance] | None:
        for reservation_id, backend, instance in _ec2_instances():
            if instance.client_token == token:
                return reservation_id, backend, instance
        return None

    def _capacity_refusal(self, params: dict[str, str]) -> str | None:
        zone = params.get("Placement.AvailabilityZone")
        is_spot = params.get("InstanceMarketOptions.MarketType") == "spot"
        instance_type = params.get("InstanceType", "m1.small")
        limit = self.capacity.get((zone or "", instance_type))
        full = limit is not None and self._live(zone or "", instance_type) >= limit
        if not full:
            if not (is_spot and zone and self.market):
                return None
            if self.market.is_available("aws", zone, gpu_of_instance_type(instance_type)):
                return None
        return (
            f"We currently do not have sufficient {instance_type} capacity in the "
            f"Availability Zone you requested ({zone}). Our system will be working on "
            "provisioning additional capacity."
        )

    @staticmethod
    def _live(zone: str, instance_type: str) -> int:
        """How many instances of ``instance_type`` run (or start) in ``zone`` now."""
        return sum(
            1
            for _, _, i in _ec2_instances()
            if i.instance_type == instance_type
            and i.placement.zone == zone
            and i.state in ("pending", "running")
        )


def _call(app: Any, environ: dict[str, Any], start_response: StartResponse) -> tuple[str, bytes]:
    """Run ``app`` to the end: its status line and whole body."""
    statuses: list[str] = []

    def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        statuses.append(status)
        return start_response(status, headers, exc_info)

    answer = app(environ, capture)
    try:
        body = b"".join(answer)
    finally:
        if hasattr(answer, "close"):
            answer.close()
    return (statuses[-1] if statuses else "500 Internal Server Error"), body


def _moto(app: Any, environ: dict[str, Any], start_response: StartResponse) -> tuple[str, bytes]:
    """An EC2 request answered whole by moto, its state held (``EC2_STATE``) meanwhile."""
    with EC2_STATE:
        return _call(app, environ, start_response)


def _iso(moment: Any) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z") if hasattr(moment, "strftime") else str(moment)


def _run_instances_xml(reservation_id: str, backend: Any, instance: Instance) -> str:
    # What EC2 answers for a repeated ClientToken: the original reservation.
    tags = "".join(
        f"<item><key>{escape(t['key'])}</key><value>{escape(t['value'])}</value></item>"
        for t in backend.describe_tags(filters={"resource-id": [instance.id]})
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<RunInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        f"<requestId>{uuid.uuid4()}</requestId><reservationId>{reservation_id}</reservationId>"
        f"<ownerId>{backend.account_id}</ownerId><groupSet/><instancesSet><item>"
        f"<instanceId>{instance.id}</instanceId><imageId>{instance.image_id}</imageId>"
        f"<instanceState><code>{instance.state_code}</code><name>{instance.state}</name>"
        f"</instanceState><instanceType>{instance.instance_type}</instanceType>"
        f"<launchTime>{_iso(instance.launch_time)}</launchTime>"
        f"<placement><availabilityZone>{instance.placement.zone}</availabilityZone></placement>"
        f"<clientToken>{escape(instance.client_token or '')}</clientToken>"
        f"<tagSet>{tags}</tagSet></item></instancesSet></RunInstancesResponse>"
    )


class SpotReclaimer:
    """The market's preemptor for EC2: where spot turns unavailable, a running spot instance
    gets the interruption notice, and ``notice_seconds`` (market time) later it is
    terminated with EC2's spot interruption reason and its processes are killed."""

    def __init__(
        self,
        instances: LocalInstances | None = None,
        notice_seconds: float = NOTICE_SECONDS["aws"],
    ) -> None:
        self.instances = instances
        self.notice_seconds = notice_seconds
        self._noticed: dict[str, datetime] = {}
        self._lock = threading.Lock()

    def __call__(self, market: MarketReplay) -> int:
        with self._lock:
            now = market.now()
            live: set[str] = set()
            reclaimed: list[str] = []
            for _, _, instance in _ec2_instances():
                if instance.lifecycle != "spot" or instance.state not in ("pending", "running"):
                    continue
                live.add(instance.id)
                zone = instance.placement.zone or ""
                noticed = self._noticed.get(instance.id)
                if noticed is None:
                    gpu = gpu_of_instance_type(instance.instance_type)
                    if market.is_available("aws", zone, gpu):
                        continue
                    noticed = self._noticed[instance.id] = now
                    reclaim = now + timedelta(seconds=self.notice_seconds)
                    if self.instances is not None:
                        self.instances.notice(instance.id, "aws", reclaim)
                    logger.info(
                        "spot interruption notice", extra={"instance_id": instance.id, "zone": zone}
                    )
                if (now - noticed).total_seconds() < self.notice_seconds:
                    continue
                with EC2_STATE:
                    _interrupt(instance, now)
                reclaimed.append(instance.id)
                logger.info("spot interruption", extra={"instance_id": instance.id, "zone": zone})
            for gone in set(self._noticed) - live:
                del self._noticed[gone]
        if reclaimed and self.instances is not None:
            self.instances.kill_many(reclaimed)
        return len(reclaimed)


class TerminatedReaper:
    """EC2 forgets a terminated instance about an hour after it ended (DescribeInstances no
    longer lists it); moto keeps every one, and its tag filters read every tag of every
    resource for each instance, so a long run's DescribeInstances grows with the square of
    the instances ever launched. This forgets a reservation, with its instances' tags, once
    all its instances have been terminated for ``after`` (market time, as EC2 does)."""

    def __init__(self, after: timedelta = FORGET_AFTER) -> None:
        self.after = after
        self._ended: dict[str, datetime] = {}  # reservation id -> when first seen all ended

    def __call__(self, market: MarketReplay) -> int:
        now = market.now()
        forgotten = 0
        with EC2_STATE:
            for account in list(ec2_backends.keys()):
                for backend in list(ec2_backends[account].values()):
                    for reservation_id, reservation in list(backend.reservations.items()):
                        if any(i.state != "terminated" for i in reservation.instances):
                            self._ended.pop(reservation_id, None)
                            continue
                        ended = self._ended.setdefault(reservation_id, now)
                        if now - ended < self.after:
                            continue
                        for instance in reservation.instances:
                            backend.tags.pop(instance.id, None)
                        del backend.reservations[reservation_id]
                        del self._ended[reservation_id]
                        forgotten += 1
        return forgotten


def _interrupt(instance: Instance, now: datetime) -> None:
    instance.terminate()
    instance.state_reason = SPOT_TERMINATION
    instance._reason = f"Service initiated ({now.strftime('%Y-%m-%d %H:%M:%S')} GMT)"


class _QuietHandler(MotoRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        logger.debug("%s %s %s", self.command, self.path, code)


class LocalAws:
    """Moto's server on a free loopback port, with the market and faults in front of it;
    with ``instances``, launches run their user data script as local processes."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        market: MarketReplay | None = None,
        faults: FaultInjector | None = None,
        instances: LocalInstances | None = None,
        spot_notice_seconds: float = NOTICE_SECONDS["aws"],
    ) -> None:
        self.host = host
        self.port = port
        self.market = market
        self.faults = faults
        self.instances = instances
        self.reclaimer = SpotReclaimer(instances, spot_notice_seconds)
        self.reaper = TerminatedReaper()
        self.capacity: dict[tuple[str, str], int] = {}
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``, valid once started."""
        if self._server is None:
            raise RuntimeError("LocalAws is not started")
        return f"http://{self.host}:{self._server.server_port}"

    def start(self) -> LocalAws:
        """Start serving in a daemon thread; attach the spot preemptor to the market."""
        app = CloudBehaviour(
            DomainDispatcherApplication(create_backend_app),
            self.market,
            self.faults,
            self.instances,
            self.capacity,
        )
        app.prices.offer_catalog_types()
        self._server = make_server(
            self.host, self.port, app, threaded=True, request_handler=_QuietHandler
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="moto-server", daemon=True
        )
        self._thread.start()
        if self.market is not None:
            self.market.attach(self.reclaimer)
            self.market.attach(self.reaper)
        logger.info("local AWS listening", extra={"endpoint_url": self.endpoint_url})
        return self

    def set_capacity(self, zone: str, instance_type: str, instances: int | None) -> None:
        """Let ``zone`` (a zone name) hold at most ``instances`` live instances of
        ``instance_type``, on any market: a launch past it is refused with EC2's
        InsufficientInstanceCapacity (a gang that finds room for 3 nodes of 4). None lifts it."""
        if instances is None:
            self.capacity.pop((zone, instance_type), None)
        else:
            self.capacity[(zone, instance_type)] = int(instances)

    def stop(self) -> None:
        """Stop serving and release the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> LocalAws:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
