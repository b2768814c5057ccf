"""The agent routes over HTTP (issue 17): the run spec with presigned URLs that work against a
real S3 server (moto's), checkpoint uploads, log chunks and their limit, exits and preemption
notices; one attempt's token reaches no other attempt, an ended attempt's token nothing."""

from __future__ import annotations

import importlib
import os
import sys
import urllib.request
from collections.abc import Iterator
from importlib.resources import files

import pytest
from sqlmodel import Session, func, select

import broker
from broker.core.agent_tokens import token_expiry
from broker.db.models import Attempt, Job, LedgerEntry
from broker.services import agent_channel, agent_reports, lifecycle
from broker.services.job_spec import JobSpec
from broker.services.launch_request import agent_token
from broker.services.ledger import SPENT_KINDS
from broker.services.plans import job_plan
from broker.settings import get_settings
from tests.helpers import LEASE, job_spec

BUCKET = "broker-checkpoints"
RUN = {"command": "python train.py --epochs 90", "env": {"WANDB_MODE": "offline"}}


def submitted(**overrides: object) -> dict:
    """A job spec to submit: with a ``run`` once the spec model has it (it becomes required)."""
    spec = job_spec(**overrides)
    if "run" in JobSpec.model_fields:
        spec.setdefault("run", RUN)
    return spec


def with_spec(db_engine, job_id: str, **fields: object) -> None:  # type: ignore[no-untyped-def]
    """Store ``fields`` in the job's spec as admission stores them."""
    with Session(db_engine) as session:
        row = session.get(Job, job_id)
        row.spec = {**row.spec, **fields}
        session.add(row)
        session.commit()


def attempt_row(db_engine, attempt_id: str) -> Attempt:  # type: ignore[no-untyped-def]
    with Session(db_engine, expire_on_commit=False) as session:
        return session.get(Attempt, attempt_id)


def job_row(db_engine, job_id: str) -> Job:  # type: ignore[no-untyped-def]
    with Session(db_engine, expire_on_commit=False) as session:
        return session.get(Job, job_id)


@pytest.fixture
def running(client, make_team, db_engine, clock, store):  # type: ignore[no-untyped-def]
    """Submit a job and launch an attempt on its plan; (job id, attempt id, token, team id)."""

    def _running() -> tuple[str, str, str, str]:
        team, headers = make_team()
        job = client.post("/v1/jobs", json=submitted(), headers=headers)
        assert job.status_code == 201, job.text
        with Session(db_engine, expire_on_commit=False) as session:
            row = session.get(Job, job.json()["id"])
            attempt, token = lifecycle.begin_attempt(
                session,
                row.id,
                job_plan(row),
                clock.now(),
                token_for=lambda attempt_id: agent_token("s", attempt_id, row.deadline),
            )
            lifecycle.launch_succeeded(session, attempt.id, "i-1", clock.now(), lease_seconds=LEASE)
        return row.id, attempt.id, token, team["id"]

    return _running


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def fetch(url: str, data: bytes | None = None, method: str = "GET") -> bytes:
    # A PUT names its type: urllib's default (a form) makes moto's server parse the body away.
    headers = {"Content-Type": "application/gzip"} if data is not None else {}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(request) as reply:
        return reply.read()


# -- the run spec -------------------------------------------------------------------------


def test_run_spec_holds_the_program_and_presigned_urls_that_download_from_s3(
    client, running, db_engine, store, clock
):
    job_id, attempt_id, token, team_id = running()
    workdir = f"workdirs/{team_id}/{'ab' * 32}.tar.gz"
    store.put(workdir, b"workdir tarball")
    checkpoint = f"jobs/{job_id}/checkpoints/{attempt_id}/1000-1.tar.gz"
    store.put(checkpoint, b"checkpoint tarball")
    run = {**RUN, "setup": "pip install -r requirements.txt", "workdir": f"s3://{BUCKET}/{workdir}"}
    with_spec(db_engine, job_id, run=run)
    with Session(db_engine) as session:
        agent_reports.record_progress(session, attempt_id, token, 1000, checkpoint, clock.now())
    clock.advance(60)

    response = client.get(f"/v1/attempts/{attempt_id}/run", headers=bearer(token))
    assert response.status_code == 200, response.text
    spec = response.json()
    restore, source = spec.pop("restore"), spec.pop("workdir")
    assert restore["key"] == checkpoint
    assert fetch(restore["url"]) == b"checkpoint tarball"
    assert fetch(source["url"]) == b"workdir tarball"
    assert spec == {
        "attempt_id": attempt_id,
        "job_id": job_id,
        "provider": "aws",
        "command": "python train.py --epochs 90",
        "setup": "pip install -r requirements.txt",
        "image": None,
        "env": {"WANDB_MODE": "offline"},
        "workload": {"model": "ResNet-50", "batch_size": 128, "steps": 40000},
        "work_unit": "steps",
        "total_work": 40000.0,
        "start_work": 0.0,
        "gpu": spec["gpu"],
        "gpu_count": 1,
        "clock_scale": 1.0,
        "report_seconds": 60.0,
        "log_flush_seconds": 2.0,
        "log_limit_bytes": 4 * 1024 * 1024,
        "notice_seconds": 120.0,
        "lease_seconds_left": LEASE - 60,
    }
    assert attempt_row(db_engine, attempt_id).last_heard_at == clock.now()


def test_on_a_fast_clock_the_run_spec_gives_wall_seconds_and_reports_once_a_second_at_most(
    client, running, db_engine, clock
):
    job_id, attempt_id, token, _ = running()
    with_spec(db_engine, job_id, run=RUN)
    clock.scale = 900.0
    response = client.get(f"/v1/attempts/{attempt_id}/run", headers=bearer(token))
    assert response.status_code == 200, response.text
    spec = response.json()
    assert spec["clock_scale"] == 900.0
    assert spec["report_seconds"] == 1.0  # 60 broker s would be 1/15 s
    assert spec["notice_seconds"] == pytest.approx(120 / 900)
    assert spec["log_flush_seconds"] == 2.0
    assert spec["lease_seconds_left"] == LEASE  # broker seconds, unscaled


def test_a_workdir_outside_the_teams_own_folder_is_handed_over_as_written(
    client, running, db_engine, store
):
    job_id, attempt_id, token, team_id = running()
    cases = {
        f"s3://{BUCKET}/workdirs/team_other/{'cd' * 32}.tar.gz": "s3",  # another team's
        f"s3://{BUCKET}/workdirs/{team_id}/../team_other/x.tar.gz": "s3",  # not one name
        f"s3://elsewhere/workdirs/{team_id}/x.tar.gz": "s3",
        "https://example.com/code.tar.gz": "url",
    }
    for workdir, kind in cases.items():
        with_spec(db_engine, job_id, run={**RUN, "workdir": workdir})
        spec = client.get(f"/v1/attempts/{attempt_id}/run", headers=bearer(token)).json()
        assert spec["workdir"] == {kind: workdir}
    with_spec(db_engine, job_id, run=RUN)
    assert (
        client.get(f"/v1/attempts/{attempt_id}/run", headers=bearer(token)).json()["workdir"]
        is None
    )


def test_a_job_without_a_program_has_no_run_spec(client, running, db_engine):
    job_id, attempt_id, token, _ = running()
    with_spec(db_engine, job_id, run=None)
    response = client.get(f"/v1/attempts/{attempt_id}/run", headers=bearer(token))
    assert response.status_code == 409 and "run.command" in response.json()["detail"]["message"]


# -- who may call -------------------------------------------------------------------------


def _agent_calls(attempt_id: str) -> list[tuple[str, str, dict]]:
    base = f"/v1/attempts/{attempt_id}"
    return [
        ("GET", f"{base}/run", {}),
        ("POST", f"{base}/progress", {"json": {"work_done": 1}}),
        ("POST", f"{base}/checkpoints", {"json": {"work_done": 1}}),
        (
            "POST",
            f"{base}/logs",
            {"content": b"hello\n", "headers": {"Content-Type": "text/plain"}},
        ),
        ("POST", f"{base}/exit", {"json": {"exit_code": 0, "tail": ""}}),
        ("POST", f"{base}/preempted", {"json": {"reason": "notice"}}),
        ("POST", f"{base}/lapsed", {"json": {}}),
        ("GET", "/v1/agent", {"params": {"attempt": attempt_id}}),
        ("GET", "/v1/agent/sdk", {"params": {"attempt": attempt_id}}),
    ]


def _call(client, method: str, url: str, token: str, request: dict):  # type: ignore[no-untyped-def]
    headers = {**request.get("headers", {}), **bearer(token)}
    options = {k: v for k, v in request.items() if k != "headers"}
    return client.request(method, url, headers=headers, **options)


def test_one_attempts_token_reaches_no_other_attempt(client, running, db_engine, clock):
    a_job, a_attempt, a_token, _ = running()
    b_job, b_attempt, b_token, _ = running()
    clock.advance(600)
    for method, url, request in _agent_calls(b_attempt):
        response = _call(client, method, url, a_token, request)
        assert response.status_code == 404, (method, url, response.text)
    b = attempt_row(db_engine, b_attempt)
    assert (b.status, b.last_heard_at, b.log_chunks, b.work_done) == ("running", None, 0, 0.0)
    assert job_row(db_engine, b_job).status == "running"
    # B's own token is good for B.
    own = client.post(
        f"/v1/attempts/{b_attempt}/progress", json={"work_done": 1}, headers=bearer(b_token)
    )
    assert own.status_code == 200, own.text


def test_an_ended_attempts_token_is_refused_with_409_everywhere(client, running, db_engine, clock):
    job_id, attempt_id, token, team_id = running()
    with Session(db_engine) as session:
        lifecycle.cancel(session, team_id, job_id, clock.now())
    for method, url, request in _agent_calls(attempt_id):
        response = _call(client, method, url, token, request)
        assert response.status_code == 409, (method, url, response.text)


def test_an_expired_token_is_401_on_the_new_routes(client, running, db_engine, clock):
    job_id, attempt_id, token, _ = running()
    clock.set(token_expiry(job_row(db_engine, job_id).deadline))
    for method, url, request in _agent_calls(attempt_id):
        response = _call(client, method, url, token, request)
        assert response.status_code == 401, (method, url, response.text)
        assert "expired" in response.json()["detail"]["message"]


# -- progress and checkpoints -------------------------------------------------------------


def test_the_progress_ack_says_whether_to_stop_and_how_long_the_lease_lasts(client, running, clock):
    _, attempt_id, token, _ = running()
    clock.advance(600)
    ack = client.post(
        f"/v1/attempts/{attempt_id}/progress", json={"work_done": 10}, headers=bearer(token)
    )
    assert ack.status_code == 200, ack.text
    assert ack.json() == {
        "job_status": "running",
        "work_done": 10.0,
        "total_work": 40000.0,
        "should_stop": False,
        "lease_seconds_left": LEASE - 600,
    }


def test_a_checkpoint_upload_goes_under_the_attempts_prefix_and_then_counts(
    client, running, store, db_engine, clock
):
    job_id, attempt_id, token, _ = running()
    clock.advance(3600)
    handed = client.post(
        f"/v1/attempts/{attempt_id}/checkpoints", json={"work_done": 1200}, headers=bearer(token)
    )
    assert handed.status_code == 200, handed.text
    key = handed.json()["key"]
    assert key == f"jobs/{job_id}/checkpoints/{attempt_id}/1200-1.tar.gz"
    fetch(handed.json()["url"], data=b"saved state", method="PUT")
    assert store.get(key) == b"saved state"
    reported = client.post(
        f"/v1/attempts/{attempt_id}/progress",
        json={"work_done": 1200, "checkpoint_key": key},
        headers=bearer(token),
    )
    assert reported.status_code == 200, reported.text
    assert job_row(db_engine, job_id).checkpointed_work == 1200
    again = client.post(
        f"/v1/attempts/{attempt_id}/checkpoints", json={"work_done": 1200}, headers=bearer(token)
    )
    assert again.json()["key"].endswith("/1200-2.tar.gz")  # a reported one is never reused


# -- logs ---------------------------------------------------------------------------------


@pytest.fixture
def log_limit() -> Iterator[int]:
    """A 16-byte log limit for the test."""
    os.environ["BROKER_AGENT_LOG_LIMIT_BYTES"] = "16"
    get_settings.cache_clear()
    yield 16
    del os.environ["BROKER_AGENT_LOG_LIMIT_BYTES"]
    get_settings.cache_clear()


def post_log(client, attempt_id: str, token: str, text: bytes):  # type: ignore[no-untyped-def]
    return client.post(
        f"/v1/attempts/{attempt_id}/logs",
        content=text,
        headers={**bearer(token), "Content-Type": "text/plain; charset=utf-8"},
    )


def test_log_chunks_are_stored_in_order_and_cut_once_past_the_limit(
    client, running, store, db_engine, log_limit
):
    job_id, attempt_id, token, _ = running()
    prefix = f"jobs/{job_id}/logs/{attempt_id}/"
    for text, ack in (
        (b"step 1\n", {"accepted_bytes": 7, "truncated": False}),
        (b"step 2\n", {"accepted_bytes": 7, "truncated": False}),
        (b"step 3\n", {"accepted_bytes": 2, "truncated": True}),
        (b"step 4\n", {"accepted_bytes": 0, "truncated": True}),
    ):
        response = post_log(client, attempt_id, token, text)
        assert response.status_code == 200, response.text
        assert response.json() == ack
    keys = store.list_keys(prefix)
    assert sorted(keys) == [f"{prefix}{n:06d}.log" for n in range(3)]
    log = b"".join(store.get(key) for key in sorted(keys))
    assert log == b"step 1\nstep 2\nst\n[broker: log truncated after 16 bytes]\n"
    row = attempt_row(db_engine, attempt_id)
    assert (row.log_chunks, row.log_bytes) == (3, len(log))


def test_a_log_chunk_may_be_256_kib_other_bodies_keep_the_64_kib_limit(client, running):
    _, attempt_id, token, _ = running()
    assert post_log(client, attempt_id, token, b"x" * (256 * 1024)).status_code == 200
    too_large = post_log(client, attempt_id, token, b"x" * (256 * 1024 + 1))
    assert too_large.status_code == 413 and too_large.json()["detail"]["code"] == "too_large"
    padded = {"exit_code": 0, "tail": "", "pad": "x" * (100 * 1024)}
    response = client.post(f"/v1/attempts/{attempt_id}/exit", json=padded, headers=bearer(token))
    assert response.status_code == 413


def test_bytes_of_a_log_chunk_that_are_not_utf8_are_kept_as_replacement_characters(
    client, running, store
):
    job_id, attempt_id, token, _ = running()
    response = post_log(client, attempt_id, token, b"\xff\xfe bad\n")
    assert response.status_code == 200, response.text
    assert response.json() == {"accepted_bytes": 11, "truncated": False}
    stored = store.get(agent_channel.log_key(job_id, attempt_id, 0))
    assert stored.decode("utf-8") == "\ufffd\ufffd bad\n"


# -- exits and notices --------------------------------------------------------------------


def exit_(client, attempt_id: str, token: str, code: int, tail: str = ""):  # type: ignore[no-untyped-def]
    return client.post(
        f"/v1/attempts/{attempt_id}/exit",
        json={"exit_code": code, "tail": tail},
        headers=bearer(token),
    )


def test_exit_0_succeeds_the_job(client, running, db_engine, clock):
    job_id, attempt_id, token, _ = running()
    clock.advance(900)
    response = exit_(client, attempt_id, token, 0, "all done\n")
    assert response.status_code == 200 and response.json() == {"job_status": "succeeded"}
    job = job_row(db_engine, job_id)
    assert (job.status, job.status_reason) == ("succeeded", "program exited 0")
    attempt = attempt_row(db_engine, attempt_id)
    assert (attempt.exit_code, attempt.billed_seconds) == (0, 900)


def test_exit_3_relaunches_once_then_fails_with_the_tails_last_line(
    client, running, db_engine, clock
):
    job_id, first, token, _ = running()
    with_spec(db_engine, job_id, max_restarts_on_errors=1)
    assert exit_(client, first, token, 3, "oops\n").json() == {"job_status": "provisioning"}
    job = job_row(db_engine, job_id)
    assert job.status_reason.endswith("(restart 1 of 1)")
    with Session(db_engine, expire_on_commit=False) as session:
        second, token = lifecycle.begin_attempt(
            session,
            job_id,
            job_plan(job),
            clock.now(),
            token_for=lambda attempt_id: agent_token("s", attempt_id, job.deadline),
        )
        lifecycle.launch_succeeded(session, second.id, "i-2", clock.now(), lease_seconds=LEASE)
    tail = "loading\nRuntimeError: CUDA out of memory\n"
    assert exit_(client, second.id, token, 3, tail).json() == {"job_status": "failed"}
    job = job_row(db_engine, job_id)
    assert job.status_reason.startswith("exit code 3: ")
    assert job.status_reason.endswith("RuntimeError: CUDA out of memory")


def test_an_exit_code_out_of_range_or_a_long_tail_is_a_422(client, running):
    _, attempt_id, token, _ = running()
    assert exit_(client, attempt_id, token, 256).status_code == 422
    assert exit_(client, attempt_id, token, 1, "x" * 4097).status_code == 422


def test_a_preemption_notice_ends_the_attempt_at_once(client, running, db_engine, clock):
    job_id, attempt_id, token, _ = running()
    clock.advance(300)
    response = client.post(
        f"/v1/attempts/{attempt_id}/preempted",
        json={"reason": "instance-action: terminate"},
        headers=bearer(token),
    )
    assert response.status_code == 200 and response.json() == {"job_status": "preempted"}
    attempt = attempt_row(db_engine, attempt_id)
    assert (attempt.end_reason, attempt.billed_seconds) == ("preempted", 300)
    assert job_row(db_engine, job_id).status_reason.endswith(": instance-action: terminate")


def _spent(db_engine, attempt_id: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    with Session(db_engine) as session:
        rows = session.exec(
            select(LedgerEntry.kind, func.sum(LedgerEntry.amount_micros))
            .where(LedgerEntry.attempt_id == attempt_id)
            .group_by(LedgerEntry.kind)
        ).all()
    return {kind: int(amount) for kind, amount in rows if kind in SPENT_KINDS}


def test_a_lapsed_lease_report_ends_the_attempt_then_booking_the_rest_as_an_overrun(
    client, running, db_engine, clock
):
    job_id, attempt_id, token, _ = running()
    clock.advance(LEASE + 120)  # the loop fell behind: nobody renewed the lease
    response = client.post(f"/v1/attempts/{attempt_id}/lapsed", json={}, headers=bearer(token))
    assert response.status_code == 200 and response.json() == {"job_status": "preempted"}
    attempt = attempt_row(db_engine, attempt_id)
    assert (attempt.end_reason, attempt.billed_seconds) == ("lease", LEASE + 120)
    spent = _spent(db_engine, attempt_id)
    assert spent["spend"] + spent["overrun"] == attempt.cost_micros
    assert abs(spent["overrun"] - attempt.price_micros_per_hour * 120 / 3600) <= 1
    assert job_row(db_engine, job_id).status_reason.startswith("spend lease lapsed at ")
    again = client.post(f"/v1/attempts/{attempt_id}/lapsed", json={}, headers=bearer(token))
    assert again.status_code == 409  # ended: nothing more to say


def test_a_lapsed_lease_report_ahead_of_the_brokers_clock_books_no_overrun(
    client, running, db_engine, clock
):
    _, attempt_id, token, _ = running()
    clock.advance(LEASE - 30)  # the agent's clock ran a little ahead of the broker's
    response = client.post(f"/v1/attempts/{attempt_id}/lapsed", json={}, headers=bearer(token))
    assert response.status_code == 200, response.text
    attempt = attempt_row(db_engine, attempt_id)
    assert (attempt.end_reason, attempt.billed_seconds) == ("lease", LEASE - 30)
    assert set(_spent(db_engine, attempt_id)) == {"spend"}


# -- the agent's own code -----------------------------------------------------------------


@pytest.fixture
def agent_files(tmp_path, monkeypatch) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The files ``broker.agent`` serves; a placeholder package in tmp while it has none."""
    module = importlib.import_module("broker.agent")
    names = ("agent.py", "broker_sdk.py")
    if hasattr(module, "__path__") and all(
        files("broker.agent").joinpath(n).is_file() for n in names
    ):
        return {n: files("broker.agent").joinpath(n).read_text(encoding="utf-8") for n in names}
    package = tmp_path / "agent"
    package.mkdir()
    (package / "__init__.py").write_text('"""A placeholder for the test."""\n')
    texts = {"agent.py": "print('the agent')\n", "broker_sdk.py": "def report(step): ...\n"}
    for name, text in texts.items():
        (package / name).write_text(text)
    monkeypatch.setattr(broker, "__path__", [str(tmp_path), *broker.__path__])
    monkeypatch.delitem(sys.modules, "broker.agent")
    monkeypatch.delattr(broker, "agent", raising=False)
    importlib.invalidate_caches()
    return texts


def test_the_agent_and_its_sdk_are_served_as_python_to_a_live_attempts_token(
    client, running, agent_files, db_engine, clock
):
    _, attempt_id, token, _ = running()
    clock.advance(5)
    for path, name in (("/v1/agent", "agent.py"), ("/v1/agent/sdk", "broker_sdk.py")):
        response = client.get(path, params={"attempt": attempt_id}, headers=bearer(token))
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/x-python")
        assert response.text == agent_files[name]
    assert attempt_row(db_engine, attempt_id).last_heard_at == clock.now()
    assert client.get("/v1/agent", params={"attempt": attempt_id}).status_code == 401
