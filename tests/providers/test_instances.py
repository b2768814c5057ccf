"""LocalInstances on its own: processes, their kill, the metadata server and the pace endpoint."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from broker.clock import ManualClock, ScaledClock
from providers.local import LocalInstances
from providers.local.pace import work_per_hour

START = datetime(2024, 3, 1, tzinfo=UTC)
IDLE = "#!/bin/bash\nsleep 300\n"
REFERENCE = {"reference_gpu_hours": 2.0}


def wait_for(condition: Callable[[], object], timeout: float = 20.0) -> None:
    """Poll until ``condition()`` is true (a loaded CI machine starts processes slowly)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def instances(tmp_path: Path) -> Iterator[LocalInstances]:
    with LocalInstances(tmp_path / "instances", clock=ManualClock(START)) as running:
        yield running


@pytest.fixture
def light(tmp_path: Path) -> Iterator[LocalInstances]:
    """No processes: for the metadata paths alone."""
    clock = ScaledClock(600.0, START)
    with LocalInstances(tmp_path / "light", runner="light", clock=clock) as running:
        yield running


def test_a_boot_script_runs_in_its_own_folder_with_only_the_instance_environment(
    instances: LocalInstances, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BROKER_ADMIN_TOKEN", "adm_do_not_leak")
    monkeypatch.setenv("BROKER_AGENT_SECRET", "secret_do_not_leak")
    monkeypatch.setenv("BROKER_DATABASE_URL", "postgresql://leak")
    script = (
        "#!/bin/bash\n"
        "python3 -c 'import json, os, sys; "
        'json.dump({"env": dict(os.environ), "python": sys.executable}, open("seen.json", "w"))\''
        "\necho booted\n"
    )
    record = instances.start("i-0123abcd", "aws", script, "V100", 1, {"broker-job": "job_1"})
    seen_file = record.directory / "seen.json"
    wait_for(lambda: "booted" in (record.directory / "console.log").read_text())
    seen = json.loads(seen_file.read_text())
    env = seen["env"]
    base = f"{instances.metadata_url}/i-0123abcd"
    assert {k: env[k] for k in env if k not in ("PWD", "SHLVL", "_")} == {
        "PATH": env["PATH"],
        "HOME": str(record.directory),
        "LANG": env["LANG"],
        "BROKER_INSTANCE_DIR": str(record.directory),
        "BROKER_LOCAL_INSTANCE": "1",
        "BROKER_METADATA_URL": base,
        "BROKER_LOCAL_PACE_URL": f"{base}/broker-local/pace",
    }
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert Path(seen["python"]).parent == Path(sys.executable).parent
    assert record.directory.parent == instances.instances_dir
    assert record.directory.stat().st_mode & 0o777 == 0o700
    assert (record.directory / "console.log").stat().st_mode & 0o777 == 0o600


def test_kill_ends_the_whole_tree_even_a_program_in_a_session_of_its_own(
    instances: LocalInstances,
) -> None:
    script = (
        "#!/bin/bash\n"
        "echo $$ > bash.pid\n"
        "python3 -c 'import subprocess; "
        'p = subprocess.Popen(["sleep", "300"], start_new_session=True); '
        'open("program.pid", "w").write(str(p.pid)); p.wait()\'\n'
    )
    record = instances.start("i-tree", "aws", script, "V100", 1, {})
    program = record.directory / "program.pid"
    wait_for(lambda: program.exists() and program.read_text())
    pids = [int((record.directory / "bash.pid").read_text()), int(program.read_text())]
    assert all(alive(pid) for pid in pids)
    assert instances.running() == ["i-tree"]
    assert instances.kill("i-tree")
    assert not any(alive(pid) for pid in pids)
    assert instances.running() == []
    assert [p.name for p in record.directory.iterdir()] == ["console.log"]  # the disk is gone
    assert not instances.kill("i-tree")  # once is enough


def test_a_program_orphaned_by_its_boot_script_still_dies_with_the_instance(
    instances: LocalInstances,
) -> None:
    script = (
        "#!/bin/bash\n"
        "python3 -c 'import subprocess; "
        'p = subprocess.Popen(["sleep", "300"], start_new_session=True); '
        'open("program.pid", "w").write(str(p.pid))\'\n'
    )
    record = instances.start("i-orphan", "aws", script, "V100", 1, {})
    wait_for(lambda: record.exit_code is not None)  # the script is done; its program is not
    program = int((record.directory / "program.pid").read_text())
    assert alive(program)
    assert instances.stop_all() == 1
    assert not alive(program)


def test_an_instance_that_exits_by_itself_is_reaped(instances: LocalInstances) -> None:
    record = instances.start("i-short", "gcp", "#!/bin/bash\nexit 3\n", "T4", 1, {})
    wait_for(lambda: record.exit_code is not None)
    assert record.exit_code == 3
    assert instances.running() == []


def test_imdsv2_needs_a_token_and_shows_the_notice_once_given(light: LocalInstances) -> None:
    light.start("i-aws", "aws", IDLE, "V100", 1, {})
    base = light.instance_url("i-aws")
    action = f"{base}/latest/meta-data/spot/instance-action"
    assert httpx.put(f"{base}/latest/api/token").status_code == 400
    assert httpx.get(action).status_code == 401
    assert httpx.get(action, headers={"X-aws-ec2-metadata-token": "forged"}).status_code == 401
    token = httpx.put(
        f"{base}/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    ).text
    headers = {"X-aws-ec2-metadata-token": token}
    assert httpx.get(action, headers=headers).status_code == 404
    assert httpx.get(f"{base}/latest/meta-data/instance-id", headers=headers).text == "i-aws"
    reclaim = datetime(2024, 3, 1, 12, 2, tzinfo=UTC)
    assert light.notice("i-aws", "aws", reclaim)
    answer = httpx.get(action, headers=headers)
    assert answer.status_code == 200
    assert json.loads(answer.text) == {"action": "terminate", "time": "2024-03-01T12:02:00Z"}
    assert httpx.get(f"{base}/computeMetadata/v1/instance/preempted").status_code == 404
    assert httpx.get(f"{light.metadata_url}/i-other/latest/api/token").status_code == 404


def test_gce_preempted_needs_the_flavor_header_and_waits_for_the_change(
    light: LocalInstances,
) -> None:
    light.start("broker-vm-1", "gcp", IDLE, "T4", 1, {})
    base = light.instance_url("broker-vm-1")
    url = f"{base}/computeMetadata/v1/instance/preempted"
    google = {"Metadata-Flavor": "Google"}
    assert httpx.get(url).status_code == 403
    assert httpx.get(url, headers=google).text == "FALSE"
    assert httpx.get(f"{base}/computeMetadata/v1/instance/name", headers=google).text == (
        "broker-vm-1"
    )
    started = time.monotonic()
    quiet = httpx.get(url, params={"wait_for_change": "true", "timeout_sec": "0.3"}, headers=google)
    assert quiet.text == "FALSE"
    assert time.monotonic() - started >= 0.3
    timer = threading.Timer(0.3, lambda: light.notice("broker-vm-1", "gcp"))
    timer.start()
    started = time.monotonic()
    changed = httpx.get(
        url, params={"wait_for_change": "true", "timeout_sec": "25"}, headers=google, timeout=30
    )
    assert changed.text == "TRUE"
    assert time.monotonic() - started < 10  # woken by the notice, not by the timeout
    timer.join()
    record = light.get("broker-vm-1")
    assert record is not None and record.reclaim_at is not None
    again = httpx.get(url, params={"wait_for_change": "true"}, headers=google)
    assert again.text == "TRUE"  # a preemption never goes back: no need to wait


def test_pace_follows_the_throughput_model_the_override_and_the_clock(tmp_path: Path) -> None:
    paces = []
    for scale in (600.0, 1200.0):
        clock = ScaledClock(scale, START)
        with LocalInstances(tmp_path / f"x{scale:g}", runner="light", clock=clock) as light:
            light.start("i-pace", "aws", IDLE, "V100", 2, {"broker-job": "job_slow"})
            url = f"{light.instance_url('i-pace')}/broker-local/pace"
            answer = httpx.get(url, params={"workload": json.dumps(REFERENCE)})
            assert answer.status_code == 200
            paces.append(answer.json()["seconds_per_work_unit"])
            light.speed_overrides["job_slow"] = 0.5
            slow = httpx.get(url, params={"workload": json.dumps(REFERENCE)})
            assert slow.json()["seconds_per_work_unit"] == pytest.approx(2 * paces[-1])
    assert paces[0] == pytest.approx(3600 / work_per_hour(REFERENCE, "V100", 2) / 600)
    assert paces[1] == pytest.approx(paces[0] / 2)


def test_pace_refuses_what_it_cannot_rate(light: LocalInstances) -> None:
    light.start("i-cpu", "aws", IDLE, "", 1, {})
    light.start("i-gpu", "aws", IDLE, "V100", 1, {})
    for instance, workload in [
        ("i-cpu", json.dumps(REFERENCE)),  # no GPU: zero throughput
        ("i-gpu", json.dumps({"model": "NoSuchNet", "steps": 10})),
        ("i-gpu", "not json"),
        ("i-gpu", "[1, 2]"),
    ]:
        url = f"{light.instance_url(instance)}/broker-local/pace"
        answer = httpx.get(url, params={"workload": workload})
        assert answer.status_code == 422, (instance, workload)
        assert "workload" in answer.json()["detail"]


def test_close_kills_everything_and_removes_a_temporary_folder() -> None:
    instances = LocalInstances(clock=ManualClock(START)).serve()
    record = instances.start("i-left", "aws", IDLE, "V100", 1, {})
    folder = instances.instances_dir
    assert folder is not None and folder.is_dir()
    wait_for(lambda: record.process is not None and alive(record.process.pid))
    instances.close()
    assert record.process is not None and record.process.returncode is not None
    assert not folder.exists()
