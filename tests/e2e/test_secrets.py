"""Tokens never appear in logs: a full job and a cancel through the embedded stack, then grep
every log for the admin token, the team key, the agent secret and the per-attempt agent tokens.

The stack logs at "info": the API's and the Celery worker's output go to <data_dir>/api.log and
worker.log; the instances' (boot script, agent, program) under <data_dir>/instances; this
process (local clouds, moto's and the GCE fake's request logs, the metadata server) is
captured with caplog at DEBUG. The broker's log handler redacts token values as a second line
of defence, so a "[redacted]" in a log is a leak at the source too (something logged a token).
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import time
from pathlib import Path

import pytest
from sqlmodel import Session, select

from tests.e2e.support import Api, backend_stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REDACTED = "[redacted]"
# base64 runs long enough to carry a token (user data is base64 on EC2).
_BASE64 = re.compile(r"[A-Za-z0-9+/]{40,}={0,2}")


_SIGNING_HEADER = re.compile(r"'Authorization': b'\[redacted\]'")


def _leaks(text: str, tokens: dict[str, str]) -> list[str]:
    """Which tokens ``text`` holds, as is or inside base64 (how EC2 carries user data)."""
    found = [f"{name} (plain)" for name, value in tokens.items() if value in text]
    for blob in _BASE64.findall(text):
        try:
            decoded = base64.b64decode(blob + "=" * (-len(blob) % 4)).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            continue
        found += [f"{name} (base64)" for name, value in tokens.items() if value in decoded]
    # botocore logs each request's SigV4 signing header (a signature of the cloud credentials,
    # not a broker token) at DEBUG; the handler redacts it whole. Anything else redacted means
    # one of our tokens reached a log line.
    if REDACTED in _SIGNING_HEADER.sub("", text):
        found.append(f"something the handler had to redact: {REDACTED}")
    return sorted(set(found))


def _where(lines: list[str], tokens: dict[str, str]) -> list[str]:
    return [line[:300] for line in lines if _leaks(line, tokens)][:5]


def test_tokens_never_appear_in_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from broker.db.models import Attempt, Job
    from broker.services.launch_request import agent_token

    caplog.set_level(logging.DEBUG)
    with backend_stack(tmp_path / "stack", celery="filesystem", log_level="info") as (stack, _):
        api = Api(stack)
        spec = api.spec(hours=2.0, deadline_hours=10.0, max_cost="100.00")
        done = api.finish(api.submit(spec)["id"])
        assert done["status"] == "succeeded", done

        job = api.submit(api.spec(hours=20.0, deadline_hours=40.0, max_cost="100.00"))
        running = api.wait(job["id"], lambda j: j["status"] == "running")
        instance = running["attempts"][-1]["instance_id"]
        assert api.client.cancel_job(job["id"])["status"] == "cancelled"
        deadline = time.monotonic() + 20
        while instance in stack.running_instances():
            assert time.monotonic() < deadline, f"{instance} still running after cancel"
            time.sleep(0.3)

        from broker.db.engine import get_engine

        with Session(get_engine()) as session:
            deadlines = dict(
                session.exec(select(Attempt.id, Job.deadline).where(Attempt.job_id == Job.id)).all()
            )
        attempt_ids = list(deadlines)
        agent_secret = stack.env["BROKER_AGENT_SECRET"]
        admin_token = stack.admin_token
        api.close()
    # Both jobs ran at least one attempt each: their agents reported with their tokens.
    assert len(attempt_ids) >= 2, attempt_ids

    tokens = {
        "admin token": admin_token,
        "team key": api.key,
        "agent secret": agent_secret,
        **{f"agent token of {a}": agent_token(agent_secret, a, d) for a, d in deadlines.items()},
    }
    failures: list[str] = []
    for name in ("api", "worker"):
        lines = (stack.data_dir / f"{name}.log").read_text(errors="replace").splitlines()
        assert lines, f"{name}.log is empty: the stack did not log at info"
        if leaks := _leaks("\n".join(lines), tokens):
            failures.append(f"{name}.log: {leaks}: {_where(lines, tokens)}")
    # What the instances wrote (the boot script, the agent, the program) that is left on disk.
    for log in sorted((stack.data_dir / "instances").rglob("*.log")):
        text = log.read_text(errors="replace")
        if leaks := _leaks(text, tokens):
            failures.append(f"{log}: {leaks}: {_where(text.splitlines(), tokens)}")
    # This process: each record's message, arguments, extra fields and traceback.
    records = [
        repr(record.__dict__) + "\n" + caplog.handler.format(record) for record in caplog.records
    ]
    assert records, "nothing captured from this process"
    # moto's request log is among them (the GCE fake serves without an access log).
    assert any(r.name == "providers.local.aws" and "POST" in r.getMessage() for r in caplog.records)
    if leaks := _leaks("\n".join(records), tokens):
        failures.append(f"captured records: {leaks}: {_where(records, tokens)}")
    assert not failures, "tokens in logs:\n" + "\n".join(failures)
