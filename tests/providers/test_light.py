"""Light instances play the agent in-process against a tiny fake broker."""

from __future__ import annotations

import io
import json
import tarfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from werkzeug.serving import BaseWSGIServer, make_server
from werkzeug.wrappers import Request, Response

from broker.clock import ScaledClock
from providers.boot import script_exports
from providers.local import LocalInstances
from tests.providers.test_instances import wait_for

TOKEN = "tok en/with+odd chars"


class FakeBroker:
    """The agent routes of one attempt, recording every call."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.calls: list[tuple[str, str, Any]] = []
        self.uploads: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.server: BaseWSGIServer = make_server("127.0.0.1", 0, self.app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def actions(self) -> list[str]:
        with self.lock:
            return [
                path.rsplit("/", 1)[-1] if method != "PUT" else "PUT"
                for method, path, _ in self.calls
            ]

    def bodies(self, action: str) -> list[Any]:
        with self.lock:
            return [body for _, path, body in self.calls if path.endswith("/" + action)]

    @Request.application  # type: ignore[arg-type]
    def app(self, request: Request) -> Response:
        if request.method == "PUT":
            with self.lock:
                self.uploads[request.path] = request.get_data()
                self.calls.append(("PUT", request.path, None))
            return Response("")
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return Response("wrong token", status=404)
        body = request.get_json(silent=True)
        with self.lock:
            self.calls.append((request.method, request.path, body))
            count = len(self.calls)
        action = request.path.rsplit("/", 1)[-1]
        if action == "run":
            reply: Any = self.spec
        elif action == "checkpoints":
            key = f"jobs/job_1/checkpoints/att_1/{body['work_done']:.6g}-{count}.tar.gz"
            reply = {"key": key, "url": f"{self.url}/upload/{count}"}
        elif action == "progress":
            reply = {
                "job_status": "running",
                "work_done": body["work_done"],
                "total_work": self.spec["total_work"],
                "should_stop": False,
                "lease_seconds_left": 3600.0,
            }
        else:
            reply = {"job_status": "succeeded" if action == "exit" else "preempted"}
        return Response(json.dumps(reply), mimetype="application/json")

    def __enter__(self) -> FakeBroker:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def boot_script(api_url: str) -> str:
    return (
        "#!/bin/bash\nset -euo pipefail\n"
        f"export BROKER_API_URL='{api_url}'\n"
        "export BROKER_ATTEMPT_ID=att_1\n"
        f"export BROKER_AGENT_TOKEN='{TOKEN}'\n"
        "export BROKER_PROVIDER=aws\n"
        'dir="${BROKER_INSTANCE_DIR:-/opt/broker}"\n'
        'python3 "$dir/agent.py"\n'
    )


def run_spec(total_work: float) -> dict[str, Any]:
    return {
        "attempt_id": "att_1",
        "job_id": "job_1",
        "workload": {"reference_gpu_hours": total_work},
        "work_unit": "reference_gpu_hours",
        "total_work": total_work,
        "start_work": 0.01,
        "gpu": "V100",
        "gpu_count": 1,
        "clock_scale": 3600.0,
        "report_seconds": 0.05,
        "notice_seconds": 120 / 3600,
        "lease_seconds_left": 7200.0,
    }


@pytest.fixture
def light(tmp_path: Path) -> Iterator[LocalInstances]:
    clock = ScaledClock(3600.0, datetime.now(UTC))  # an hour of work takes about a second
    with LocalInstances(tmp_path, runner="light", clock=clock, watch_seconds=0.05) as running:
        yield running


def test_boot_script_exports_are_read_as_the_shell_would() -> None:
    exports = script_exports(boot_script("http://127.0.0.1:8000"))
    assert exports == {
        "BROKER_API_URL": "http://127.0.0.1:8000",
        "BROKER_ATTEMPT_ID": "att_1",
        "BROKER_AGENT_TOKEN": TOKEN,
        "BROKER_PROVIDER": "aws",
    }


def test_a_light_instance_runs_the_attempt_to_the_end_and_exits_zero(
    light: LocalInstances,
) -> None:
    with FakeBroker(run_spec(0.05)) as broker:
        light.start("i-light", "aws", boot_script(broker.url), "V100", 1, {"broker-job": "job_1"})
        wait_for(lambda: "exit" in broker.actions(), timeout=30)
        actions = broker.actions()
        assert actions[0] == "run"
        assert actions[-4:] == ["checkpoints", "PUT", "progress", "exit"]
        final = broker.bodies("progress")[-1]
        assert final["work_done"] == pytest.approx(0.05)
        assert final["checkpoint_key"].startswith("jobs/job_1/checkpoints/att_1/")
        assert broker.bodies("exit") == [{"exit_code": 0, "tail": "light instance: done"}]
        upload = next(iter(broker.uploads.values()))
        with tarfile.open(fileobj=io.BytesIO(upload), mode="r:gz") as archive:
            member = archive.extractfile("work.json")
            assert member is not None
            assert json.loads(member.read())["work_done"] == pytest.approx(0.05)
        count = len(broker.calls)
        time.sleep(0.3)  # several steps of the runner
        assert len(broker.calls) == count  # nothing more once it exited


def test_a_light_instance_answers_a_notice_with_a_checkpoint_then_preempted(
    light: LocalInstances,
) -> None:
    with FakeBroker(run_spec(1000.0)) as broker:
        light.start("i-noticed", "aws", boot_script(broker.url), "V100", 1, {})
        wait_for(lambda: broker.bodies("progress"))
        light.notice("i-noticed", "aws")
        wait_for(lambda: "preempted" in broker.actions())
        assert broker.actions()[-4:] == ["checkpoints", "PUT", "progress", "preempted"]
        work = broker.bodies("progress")[-1]["work_done"]
        assert 0.01 <= work < 1000.0
        assert broker.bodies("preempted") == [{"reason": "spot interruption notice"}]
