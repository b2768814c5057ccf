"""The local instances' metadata server: EC2's IMDSv2 and GCE's metadata paths, per instance.

Every path is under ``/<instance id>`` (an instance's ``BROKER_METADATA_URL``):

- ``PUT /latest/api/token`` (``X-aws-ec2-metadata-token-ttl-seconds``) -> a session token;
- ``GET /latest/meta-data/spot/instance-action`` (``X-aws-ec2-metadata-token``) -> 404 until a
  spot notice, then ``{"action": "terminate", "time": ...}``; ``/latest/meta-data/instance-id``;
- ``GET /computeMetadata/v1/instance/preempted`` (``Metadata-Flavor: Google``) -> ``FALSE`` or
  ``TRUE``, with ``wait_for_change=true&timeout_sec=N`` (capped at 30 s; once ``TRUE`` it
  answers at once, since a preemption never goes back); ``/computeMetadata/v1/instance/name``;
- ``GET /broker-local/pace?workload=<json>`` -> ``{"seconds_per_work_unit": wall seconds}``.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from werkzeug.wrappers import Request, Response

if TYPE_CHECKING:
    from providers.local.instance_record import InstanceBook, LocalInstance

WAIT_CAP_SECONDS = 30.0
MAX_TOKEN_TTL = 21600


def _text(body: str, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(body, status=status, mimetype="text/plain", headers=headers)


def _json(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, mimetype="application/json")


def metadata_app(instances: InstanceBook) -> Callable[..., Any]:
    """The WSGI application answering for every instance of ``instances``."""

    def aws_token(request: Request, record: LocalInstance) -> Response:
        raw = request.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_TOKEN_TTL:
            return _text("X-aws-ec2-metadata-token-ttl-seconds must be 1..21600", 400)
        token = secrets.token_urlsafe(32)
        with instances.changed:
            record.tokens[token] = time.monotonic() + int(raw)
        return _text(token, headers={"X-aws-ec2-metadata-token-ttl-seconds": raw})

    def aws_authorized(request: Request, record: LocalInstance) -> bool:
        token = request.headers.get("X-aws-ec2-metadata-token", "")
        with instances.changed:
            return record.tokens.get(token, 0.0) > time.monotonic()

    def instance_action(request: Request, record: LocalInstance) -> Response:
        if not aws_authorized(request, record):
            return _text("Unauthorized", 401)
        reclaim = record.reclaim_at
        if reclaim is None:
            return _text("Not Found", 404)
        when = reclaim.strftime("%Y-%m-%dT%H:%M:%SZ")
        return _text(json.dumps({"action": "terminate", "time": when}))

    def instance_id(request: Request, record: LocalInstance) -> Response:
        if not aws_authorized(request, record):
            return _text("Unauthorized", 401)
        return _text(record.instance_id)

    def google(body: str, status: int = 200, etag: str = "") -> Response:
        headers = {"Metadata-Flavor": "Google"}
        if etag:
            headers["ETag"] = etag
        return Response(body, status=status, mimetype="application/text", headers=headers)

    def preempted(request: Request, record: LocalInstance) -> Response:
        if request.headers.get("Metadata-Flavor") != "Google":
            return google("Missing Metadata-Flavor:Google header.", 403)

        def value() -> str:
            return "TRUE" if record.reclaim_at is not None else "FALSE"

        if request.args.get("wait_for_change", "").lower() == "true":
            try:
                timeout = min(
                    float(request.args.get("timeout_sec", WAIT_CAP_SECONDS)), WAIT_CAP_SECONDS
                )
            except ValueError:
                return google("timeout_sec must be a number", 400)
            last_etag = request.args.get("last_etag")
            deadline = time.monotonic() + max(timeout, 0.0)
            with instances.changed:
                seen = value()
                wait = seen == "FALSE" if last_etag is None else last_etag == _etag(seen)
                while (
                    wait
                    and value() == seen
                    and not record.killed
                    and not instances.closing.is_set()
                    and (left := deadline - time.monotonic()) > 0
                ):
                    instances.changed.wait(left)
        current = value()
        return google(current, etag=_etag(current))

    def name(request: Request, record: LocalInstance) -> Response:
        if request.headers.get("Metadata-Flavor") != "Google":
            return google("Missing Metadata-Flavor:Google header.", 403)
        return google(record.instance_id)

    def pace(request: Request, record: LocalInstance) -> Response:
        try:
            workload = json.loads(request.args.get("workload", ""))
            if not isinstance(workload, dict):
                raise ValueError("workload must be a JSON object")
            seconds = instances.seconds_per_work_unit(record.instance_id, workload)
        except (ValueError, TypeError) as error:
            return _json({"detail": f"workload: {error}"}, 422)
        return _json({"seconds_per_work_unit": seconds})

    Handler = Callable[[Request, "LocalInstance"], Response]
    routes: dict[tuple[str, str], tuple[str | None, Handler]] = {
        ("PUT", "latest/api/token"): ("aws", aws_token),
        ("GET", "latest/meta-data/spot/instance-action"): ("aws", instance_action),
        ("GET", "latest/meta-data/instance-id"): ("aws", instance_id),
        ("GET", "computeMetadata/v1/instance/preempted"): ("gcp", preempted),
        ("GET", "computeMetadata/v1/instance/name"): ("gcp", name),
        ("GET", "broker-local/pace"): (None, pace),
    }

    @Request.application  # type: ignore[arg-type]
    def app(request: Request) -> Response:
        instance, _, rest = request.path.strip("/").partition("/")
        record = instances.get(instance)
        if record is None:
            return _text(f"no local instance {instance!r}", 404)
        route = routes.get((request.method, rest.rstrip("/")))
        if route is None or route[0] not in (None, record.provider):
            return _text("Not Found", 404)
        return route[1](request, record)

    return app


def _etag(value: str) -> str:
    return f"preempted-{value.lower()}"
