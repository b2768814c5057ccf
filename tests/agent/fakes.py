"""A fake broker for the agent's tests: the agent routes of the protocol, a presigned-URL-like
object store, an instance metadata server (EC2 IMDSv2 and GCE paths) and the local clouds' pace
endpoint, all on one stdlib HTTP server on a free loopback port. It records every call."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "broker" / "agent" / "agent.py"
SDK = ROOT / "broker" / "agent" / "broker_sdk.py"
TOKEN = "att_1999999999.secret-agent-token-value"
ATTEMPT, JOB = "att_t1", "job_t1"
ATTEMPT_ROUTE = re.compile(r"^/v1/attempts/([^/]+)/([a-z]+)$")

Answer = tuple[int, Any]  # status, JSON body (or bytes)


@dataclass
class Call:
    route: str
    body: Any
    headers: dict[str, str]
    at: float = field(default_factory=time.monotonic)


def tar_gz(files: dict[str, str]) -> bytes:
    """A tar.gz holding ``files`` (name -> text)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def untar(data: bytes) -> dict[str, bytes]:
    """The files in a tar.gz (name -> content)."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


class FakeBroker:
    """The server and what it recorded; set ``answers[route]`` to change an agent route's
    answer (a function of the call number and the body, returning (status, JSON))."""

    def __init__(self, provider: str = "aws") -> None:
        self.provider = provider
        self.calls: list[Call] = []
        self.store: dict[str, bytes] = {}
        self.store_types: dict[str, str] = {}
        self.answers: dict[str, Callable[[int, Any], Answer]] = {}
        self.notice = threading.Event()
        self.seconds_per_work_unit = 0.01
        self.changed = threading.Condition()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.spec: dict[str, Any] = {
            "attempt_id": ATTEMPT,
            "job_id": JOB,
            "provider": provider,
            "command": "true",
            "setup": None,
            "image": None,
            "env": {},
            "workdir": None,
            "restore": None,
            "workload": {"reference_gpu_hours": 1.0},
            "work_unit": "reference_gpu_hours",
            "total_work": 100.0,
            "start_work": 0.0,
            "gpu": "V100",
            "gpu_count": 1,
            "clock_scale": 1.0,
            "report_seconds": 0.2,
            "log_flush_seconds": 0.2,
            "log_limit_bytes": 1 << 20,
            "notice_seconds": 4.0,
            "lease_seconds_left": 600.0,
        }
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- what was recorded -----------------------------------------------------------------

    def of(self, route: str) -> list[Call]:
        with self.changed:
            return [c for c in self.calls if c.route == route]

    def routes(self) -> list[str]:
        with self.changed:
            return [c.route for c in self.calls]

    def log_text(self) -> str:
        return "".join(c.body for c in self.of("logs"))

    def wait_for(self, check: Callable[[], bool], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not check():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out; calls: {[c.route for c in self.calls]}")
                self.changed.wait(min(left, 0.1))

    def record(self, route: str, body: Any, headers: dict[str, str]) -> int:
        with self.changed:
            self.calls.append(Call(route, body, headers))
            self.changed.notify_all()
            return sum(1 for c in self.calls if c.route == route)

    # -- the agent -------------------------------------------------------------------------

    def agent_env(self, instance_dir: Path, **extra: str) -> dict[str, str]:
        """The environment the boot script gives the agent on a local instance."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
        env.update(
            BROKER_API_URL=self.url,
            BROKER_ATTEMPT_ID=ATTEMPT,
            BROKER_AGENT_TOKEN=TOKEN,
            BROKER_PROVIDER=self.provider,
            BROKER_INSTANCE_DIR=str(instance_dir),
            BROKER_LOCAL_INSTANCE="1",
            BROKER_METADATA_URL=f"{self.url}/meta",
        )
        env.update(extra)
        return env

    def start_agent(
        self, instance_dir: Path, python: str = sys.executable, **extra: str
    ) -> subprocess.Popen:
        """``python3 agent.py`` as the boot script runs it (``python``: the interpreter)."""
        return subprocess.Popen(
            [python, str(AGENT)],
            env=self.agent_env(instance_dir, **extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    # -- the HTTP side ---------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake.serve(self, "GET")

            def do_POST(self) -> None:
                fake.serve(self, "POST")

            def do_PUT(self) -> None:
                fake.serve(self, "PUT")

        return Handler

    def serve(self, request: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(request.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in request.headers.items()}
        path = parts.path
        if path.startswith("/meta/"):
            status, answer, extra = self.metadata(method, path[len("/meta") :], query, headers)
        elif path.startswith("/store/"):
            status, answer, extra = self.object(method, path[len("/store/") :], body, headers)
        elif path == "/pace":
            self.record("pace", query.get("workload"), headers)
            status, answer, extra = 200, {"seconds_per_work_unit": self.seconds_per_work_unit}, {}
        else:
            status, answer = self.agent_route(method, path, query, body, headers)
            extra = {}
        data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        request.send_response(status)
        for name, value in extra.items():
            request.send_header(name, value)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    def agent_route(
        self, method: str, path: str, query: dict[str, str], body: bytes, headers: dict[str, str]
    ) -> Answer:
        if headers.get("authorization") != f"Bearer {TOKEN}":
            return 404, {"detail": "not found"}
        if (method, path) == ("GET", "/v1/agent/sdk"):
            self.record("sdk", query, headers)
            return 200, SDK.read_bytes()
        match = ATTEMPT_ROUTE.match(path)
        if match is None or match.group(1) != ATTEMPT:
            return 404, {"detail": "not found"}
        route = match.group(2)
        parsed: Any = body.decode() if route == "logs" else json.loads(body or b"null")
        number = self.record(route, parsed, headers)
        if route in self.answers:
            return self.answers[route](number, parsed)
        return self.default_answer(route, number, parsed)

    def default_answer(self, route: str, number: int, body: Any) -> Answer:
        if route == "run":
            return 200, self.spec
        if route == "progress":
            return 200, {
                "job_status": "running",
                "work_done": body["work_done"],
                "total_work": self.spec["total_work"],
                "should_stop": False,
                "lease_seconds_left": 600.0,
            }
        if route == "checkpoints":
            key = f"jobs/{JOB}/checkpoints/{ATTEMPT}/{body['work_done']:.6g}-{number}.tar.gz"
            return 200, {"key": key, "url": f"{self.url}/store/{key}?X-Signature=abc"}
        if route == "logs":
            return 200, {"accepted_bytes": len(body.encode()), "truncated": False}
        if route == "exit":
            return 200, {"job_status": "succeeded" if body["exit_code"] == 0 else "failed"}
        if route == "preempted":
            return 200, {"job_status": "preempted"}
        if route == "lapsed":
            return 200, {"job_status": "preempted"}
        return 404, {"detail": "no such route"}

    def object(
        self, method: str, key: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, Any, dict[str, str]]:
        self.record(f"store {method}", key, headers)
        if "authorization" in headers:  # a presigned URL takes no other credentials
            return 400, {"detail": "only one auth mechanism allowed"}, {}
        if method == "PUT":
            self.store[key] = body
            self.store_types[key] = headers.get("content-type", "")
            return 200, b"", {}
        if key in self.store:
            return 200, self.store[key], {}
        return 404, {"detail": "no such key"}, {}

    def metadata(
        self, method: str, path: str, query: dict[str, str], headers: dict[str, str]
    ) -> tuple[int, Any, dict[str, str]]:
        if (method, path) == ("PUT", "/latest/api/token"):
            if not headers.get("x-aws-ec2-metadata-token-ttl-seconds", "").isdigit():
                return 400, b"ttl missing", {}
            return 200, b"imds-token", {}
        if (method, path) == ("GET", "/latest/meta-data/spot/instance-action"):
            self.record("aws notice poll", None, headers)
            if headers.get("x-aws-ec2-metadata-token") != "imds-token":
                return 401, b"Unauthorized", {}
            if not self.notice.is_set():
                return 404, b"Not Found", {}
            action = {"action": "terminate", "time": "2026-12-03T12:02:00Z"}
            return 200, json.dumps(action).encode(), {}
        if (method, path) == ("GET", "/computeMetadata/v1/instance/preempted"):
            self.record("gce notice poll", query, headers)
            if headers.get("metadata-flavor") != "Google":
                return 403, b"Missing Metadata-Flavor:Google header.", {}
            if query.get("wait_for_change") == "true":
                self.notice.wait(float(query.get("timeout_sec", "30")))
            value = "TRUE" if self.notice.is_set() else "FALSE"
            return 200, value.encode(), {"ETag": f"etag-{value.lower()}"}
        return 404, b"Not Found", {}


@contextmanager
def fake_broker(provider: str = "aws") -> Iterator[FakeBroker]:
    fake = FakeBroker(provider)
    try:
        yield fake
    finally:
        fake.close()
