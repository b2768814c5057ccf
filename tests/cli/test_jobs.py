"""``broker jobs``: submit, list, show, cancel and watch, against a real uvicorn server."""

from __future__ import annotations

import io
import tarfile
import threading
import time
from datetime import timedelta
from decimal import Decimal

import httpx
import pytest
from sqlmodel import Session

from broker.core.job_status import JobStatus
from broker.db.models import Job
from broker.services import lifecycle
from broker.services.plans import job_plan
from tests.cli.support import failed, job_file, ok, printed, submitted_id
from tests.conftest import START
from tests.helpers import LEASE


def test_submit_list_show_and_cancel(broker_cli, team_key, tmp_path, client):
    _, token = team_key
    spec = job_file(tmp_path, max_cost="80")  # a number: sent as the string "80"
    out = ok(broker_cli("jobs", "submit", str(spec), token=token))
    job_id = submitted_id(out)
    assert "queued" in out and "reserved" in out
    job = client.get(f"/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"}).json()
    assert job["max_cost"] == "80.00"
    assert job["deadline"].startswith((START + timedelta(hours=12)).strftime("%Y-%m-%dT%H:%M"))

    again = ok(broker_cli("jobs", "submit", str(spec), "--idempotency-key", "k1", token=token))
    same = ok(broker_cli("jobs", "submit", str(spec), "--idempotency-key", "k1", token=token))
    assert f"job {submitted_id(again)} was already submitted" in same

    listed = ok(broker_cli("jobs", "list", "--page-size", "1", token=token))  # a page per job
    assert job_id in listed and submitted_id(again) in listed and "2 job(s)" in listed
    assert "queued" in ok(broker_cli("jobs", "list", "--status", "queued", token=token))

    shown = ok(broker_cli("jobs", "show", job_id, token=token))
    assert job_id in shown and "queued" in shown and "checkpoints" in shown
    assert "no attempts yet" in shown

    cancelled = ok(broker_cli("jobs", "cancel", job_id, token=token))
    assert "cancelled" in cancelled
    out = failed(broker_cli("jobs", "cancel", job_id, token=token))
    assert "conflict" in out and "HTTP 409" in out


def test_retried_submit_with_a_relative_deadline_is_the_same_job(
    broker_cli, team_key, tmp_path, clock
):
    _, token = team_key
    spec = str(job_file(tmp_path, deadline="+12h"))
    first = ok(broker_cli("jobs", "submit", spec, "--idempotency-key", "nightly", token=token))
    clock.advance(900)  # the retry resolves +12h against a later broker clock
    retry = ok(broker_cli("jobs", "submit", spec, "--idempotency-key", "nightly", token=token))
    assert f"job {submitted_id(first)} was already submitted with this idempotency key" in retry
    deadline = (START + timedelta(hours=12)).strftime("%Y-%m-%d %H:%M UTC")
    assert deadline in first and deadline in retry


@pytest.mark.timeout(30)  # a watch that never ends fails here, not at the suite's limit
def test_show_and_watch_a_job_that_runs(
    broker_cli, team_key, tmp_path, db_engine, clock, live_server, client
):
    _, token = team_key
    job_id = submitted_id(ok(broker_cli("jobs", "submit", str(job_file(tmp_path)), token=token)))
    plan = client.get(f"/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"}).json()[
        "plan"
    ]
    # Play the worker's part: an attempt on the job's plan, reporting progress and a checkpoint.
    with Session(db_engine, expire_on_commit=False) as session:
        attempt, attempt_token = lifecycle.begin_attempt(
            session, job_id, job_plan(session.get(Job, job_id)), clock.now()
        )
        lifecycle.launch_succeeded(session, attempt.id, "i-1", clock.now(), lease_seconds=LEASE)
    agent = {"Authorization": f"Bearer {attempt_token}"}
    progress = f"{live_server}/v1/attempts/{attempt.id}/progress"
    clock.advance(2 * 3600)  # the broker believes 10,000 steps only after the GPU ran a while
    key = f"jobs/{job_id}/ckpt-1"
    report = httpx.post(progress, json={"work_done": 10000, "checkpoint_key": key}, headers=agent)
    assert report.status_code == 200, report.text
    clock.advance(3600)

    shown = ok(broker_cli("jobs", "show", job_id, token=token))
    assert attempt.id in shown and plan["instance_type"] in shown and "running" in shown
    assert f"checkpoints  1 (latest at 10,000: {key})" in shown

    def finish_soon() -> None:
        time.sleep(0.5)
        clock.advance(3 * 3600)
        httpx.post(progress, json={"work_done": 40000}, headers=agent)
        with Session(db_engine, expire_on_commit=False) as session:
            lifecycle.stop(session, job_id, JobStatus.SUCCEEDED, "work reached", clock.now())

    worker = threading.Thread(target=finish_soon)
    worker.start()
    watched = ok(broker_cli("jobs", "watch", "--interval", "0.1", token=token))  # no ids
    worker.join()
    assert job_id in watched and "succeeded" in watched and "40,000 / 40,000" in watched
    assert "all 1 finished: 1 succeeded; deadline met by 1" in watched
    shown = ok(broker_cli("jobs", "show", job_id, token=token))
    figure = client.get(f"/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"}).json()
    assert "(met)" in shown and figure["completed_at"] is not None
    assert f"on-demand    ${Decimal(figure['on_demand_only_cost']):,.2f}" in shown
    assert f"saved        ${Decimal(figure['saved_vs_on_demand']):,.2f} (" in shown
    listed = ok(broker_cli("jobs", "list", token=token))
    assert next(line for line in listed.splitlines() if job_id in line).count(" met ") == 1


@pytest.mark.timeout(30)
def test_watch_ends_at_once_for_a_cancelled_job(broker_cli, team_key, tmp_path):
    _, token = team_key
    job_id = submitted_id(ok(broker_cli("jobs", "submit", str(job_file(tmp_path)), token=token)))
    ok(broker_cli("jobs", "cancel", job_id, token=token))
    started = time.monotonic()
    out = ok(broker_cli("jobs", "watch", job_id, "--interval", "5", token=token))
    assert time.monotonic() - started < 3
    assert job_id in out and "cancelled" in out and "1 cancelled" in out
    assert "no unfinished jobs" in ok(broker_cli("jobs", "watch", token=token))


def test_submit_with_a_workdir_packs_and_uploads_the_folder(
    broker_cli, team_key, tmp_path, store, client
):
    team, token = team_key
    code = tmp_path / "code"
    (code / ".git").mkdir(parents=True)
    (code / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (code / "pkg" / "__pycache__").mkdir(parents=True)
    (code / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")
    (code / "pkg" / "m.py").write_text("X = 1\n")
    (code / "train.py").write_text("print('training')\n")
    spec = job_file(tmp_path)
    out = ok(broker_cli("jobs", "submit", str(spec), "--workdir", str(code), token=token))
    job = client.get(
        f"/v1/jobs/{submitted_id(out)}", headers={"Authorization": f"Bearer {token}"}
    ).json()
    workdir = job["spec"]["run"]["workdir"]
    prefix = f"s3://{store.bucket}/workdirs/{team['id']}/"
    assert workdir.startswith(prefix) and workdir.endswith(".tar.gz")
    assert job["spec"]["run"]["command"] == "python train.py --steps 40000"
    with tarfile.open(
        fileobj=io.BytesIO(store.get(workdir.removeprefix(f"s3://{store.bucket}/")))
    ) as tar:
        assert sorted(tar.getnames()) == ["pkg", "pkg/m.py", "train.py"]
        assert tar.extractfile("train.py").read() == b"print('training')\n"


def test_submit_with_a_workdir_needs_a_run_block_and_a_folder(broker_cli, team_key, tmp_path):
    _, token = team_key
    no_run = tmp_path / "norun.yaml"
    no_run.write_text(job_file(tmp_path).read_text().replace("run:", "# run:"))
    out = failed(broker_cli("jobs", "submit", str(no_run), "--workdir", str(tmp_path), token=token))
    assert "run block" in out
    out = failed(broker_cli("jobs", "submit", str(no_run), token=token))
    assert "run" in out and "HTTP 422" in out
    missing = tmp_path / "nowhere"
    out = failed(
        broker_cli(
            "jobs", "submit", str(job_file(tmp_path)), "--workdir", str(missing), token=token
        )
    )
    assert "nowhere" in out


def test_logs_prints_every_attempt_or_one_and_follows_to_the_end(
    broker_cli, team_key, tmp_path, db_engine, clock, live_server, store
):
    _, token = team_key
    job_id = submitted_id(ok(broker_cli("jobs", "submit", str(job_file(tmp_path)), token=token)))
    assert printed(broker_cli("jobs", "logs", job_id, token=token)) == ""
    with Session(db_engine, expire_on_commit=False) as session:
        attempt, attempt_token = lifecycle.begin_attempt(
            session, job_id, job_plan(session.get(Job, job_id)), clock.now()
        )
        lifecycle.launch_succeeded(session, attempt.id, "i-1", clock.now(), lease_seconds=LEASE)
    agent = {"Authorization": f"Bearer {attempt_token}", "Content-Type": "text/plain"}
    url = f"{live_server}/v1/attempts/{attempt.id}/logs"
    for text in ("epoch 1\n", "epoch 2\nepoch 3\n"):
        assert httpx.post(url, content=text, headers=agent).status_code == 200

    whole = printed(broker_cli("jobs", "logs", job_id, token=token))
    assert whole == f"==> attempt {attempt.id} ({attempt.zone}, {attempt.market}) <==\n" + (
        "epoch 1\nepoch 2\nepoch 3\n"
    )
    assert (
        printed(
            broker_cli("jobs", "logs", job_id, "--attempt", attempt.id, "--tail", "1", token=token)
        )
        == "epoch 3\n"
    )
    out = failed(broker_cli("jobs", "logs", job_id, "--attempt", "att_nope", token=token))
    assert "not found" in out and "HTTP 404" in out
    assert failed(broker_cli("jobs", "logs", job_id, "--tail", "0", token=token))

    def finish_soon() -> None:
        time.sleep(1.2)
        httpx.post(url, content="done\n", headers=agent)
        with Session(db_engine, expire_on_commit=False) as session:
            lifecycle.program_exited(session, attempt.id, 0, "done", clock.now())

    worker = threading.Thread(target=finish_soon)
    worker.start()
    followed = printed(
        broker_cli("jobs", "logs", job_id, "-f", "--attempt", attempt.id, token=token)
    )
    worker.join()
    assert followed == "epoch 1\nepoch 2\nepoch 3\ndone\n"


def test_show_a_gang_job_names_its_machines(broker_cli, team_key, tmp_path, db_engine, clock):
    _, token = team_key
    spec = job_file(tmp_path, resources="{gpus: 32, gpu_types: [H100]}", max_cost='"900.00"')
    job_id = submitted_id(ok(broker_cli("jobs", "submit", str(spec), token=token)))
    with Session(db_engine, expire_on_commit=False) as session:
        plan = job_plan(session.get(Job, job_id))
        assert plan is not None and (plan.nodes, plan.gpu_count) == (4, 8)
        attempt, _ = lifecycle.begin_attempt(session, job_id, plan, clock.now())
        lifecycle.launch_succeeded(session, attempt.id, "i-1", clock.now(), lease_seconds=LEASE)
    shown = ok(broker_cli("jobs", "show", job_id, token=token))
    assert f"4 x {plan.instance_type} H100 x8 (32 GPUs)" in shown
    assert "nodes" in shown
    row = next(line for line in shown.splitlines() if attempt.id in line)
    cells = [c.strip() for c in row.replace("│", "|").split("|") if c.strip()]
    assert cells[cells.index(plan.instance_type) + 1] == "4"
