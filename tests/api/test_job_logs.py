"""``GET /v1/jobs/{id}/logs``: the program's output as its agents sent it (through the agent
route, into moto's S3), one attempt or all of them, tails, following, and team isolation."""

from __future__ import annotations

import io
import tarfile
import threading
import time

import pytest
from sqlmodel import Session

from broker.db.models import Job
from broker.services import agent_channel, lifecycle
from broker.services.plans import job_plan
from providers.retry import FAST_RETRY
from providers.storage import S3CheckpointStore
from tests.helpers import LEASE, job_spec


class Agent:
    """Plays the agents of one job: launches attempts, sends output, ends them."""

    def __init__(self, client, db_engine, clock, job_id: str) -> None:  # type: ignore[no-untyped-def]
        self.client, self.db_engine, self.clock, self.job_id = client, db_engine, clock, job_id

    def launch(self) -> tuple[str, str]:
        self.clock.advance(60)
        with Session(self.db_engine, expire_on_commit=False) as session:
            job = session.get(Job, self.job_id)
            begun = lifecycle.begin_attempt(session, job.id, job_plan(job), self.clock.now())
            assert begun is not None
            attempt, token = begun
            lifecycle.launch_succeeded(
                session, attempt.id, f"i-{attempt.id}", self.clock.now(), lease_seconds=LEASE
            )
        return attempt.id, token

    def send(self, attempt_id: str, token: str, text: str) -> None:
        response = self.client.post(
            f"/v1/attempts/{attempt_id}/logs",
            content=text.encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "text/plain"},
        )
        assert response.status_code == 200, response.text

    def exit(self, attempt_id: str, code: int) -> None:
        with Session(self.db_engine) as session:
            lifecycle.program_exited(session, attempt_id, code, "", self.clock.now())


@pytest.fixture
def job(client, make_team, db_engine, clock, store):  # type: ignore[no-untyped-def]
    """A team's job that may restart once after an error: (job id, headers, Agent)."""
    _, headers = make_team()
    response = client.post("/v1/jobs", json=job_spec(max_restarts_on_errors=1), headers=headers)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    return job_id, headers, Agent(client, db_engine, clock, job_id)


def logs(client, job_id: str, headers, **params: object):  # type: ignore[no-untyped-def]
    return client.get(f"/v1/jobs/{job_id}/logs", params=params, headers=headers)


def follow(client, job_id: str, headers, attempt: str):  # type: ignore[no-untyped-def]
    """The streamed ``follow`` of one attempt's log (a context manager)."""
    params = {"follow": "true", "attempt": attempt}
    return client.stream("GET", f"/v1/jobs/{job_id}/logs", params=params, headers=headers)


def test_a_job_without_output_has_an_empty_log(client, job):
    job_id, headers, agent = job
    response = logs(client, job_id, headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert response.text == ""
    first, _ = agent.launch()
    plan = client.get(f"/v1/jobs/{job_id}", headers=headers).json()["plan"]
    header = f"==> attempt {first} ({plan['zone']}, {plan['market']}) <==\n"
    assert logs(client, job_id, headers).text == header
    assert logs(client, job_id, headers, attempt=first).text == ""


def test_every_attempts_chunks_in_order_after_its_header(client, job):
    job_id, headers, agent = job
    first, token = agent.launch()
    for i in range(12):  # more than ten chunks: ordered by number, not by name or time
        agent.send(first, token, f"step {i}\n")
    agent.send(first, token, "Traceback: boom\n")
    agent.exit(first, 3)
    second, token2 = agent.launch()
    agent.send(second, token2, "resuming from checkpoint\nstep 12\n")
    agent.send(second, token2, "step 13\n")

    attempts = {
        a["id"]: a for a in client.get(f"/v1/jobs/{job_id}", headers=headers).json()["attempts"]
    }
    first_log = "".join(f"step {i}\n" for i in range(12)) + "Traceback: boom\n"
    second_log = "resuming from checkpoint\nstep 12\nstep 13\n"

    def header(attempt_id: str) -> str:
        a = attempts[attempt_id]
        return f"==> attempt {attempt_id} ({a['zone']}, {a['market']}) <==\n"

    whole = logs(client, job_id, headers)
    assert whole.status_code == 200, whole.text
    assert whole.text == header(first) + first_log + header(second) + second_log
    assert logs(client, job_id, headers, attempt=first).text == first_log
    assert logs(client, job_id, headers, attempt=second).text == second_log

    tailed = logs(client, job_id, headers, tail=2).text
    assert tailed == header(first) + "step 11\nTraceback: boom\n" + header(second) + (
        "step 12\nstep 13\n"
    )
    assert logs(client, job_id, headers, attempt=second, tail=1).text == "step 13\n"
    assert logs(client, job_id, headers, attempt=second, tail=10_000).text == second_log


def test_bad_parameters_and_unknown_attempts(client, job):
    job_id, headers, agent = job
    agent.launch()
    for params in ({"tail": 0}, {"tail": 10_001}, {"tail": "x"}, {"attempt": "a/b"}):
        response = logs(client, job_id, headers, **params)
        assert response.status_code == 422, (params, response.text)
    missing = logs(client, job_id, headers, attempt="att_unknown")
    assert missing.status_code == 404 and missing.json()["detail"]["code"] == "not_found"


def test_another_teams_job_log_is_404(client, job, make_team):
    job_id, headers, agent = job
    attempt, token = agent.launch()
    agent.send(attempt, token, "private\n")
    _, other = make_team()
    for params in ({}, {"attempt": attempt}, {"follow": "true"}):
        response = logs(client, job_id, other, **params)
        assert response.status_code == 404, (params, response.text)
        assert "private" not in response.text
    assert logs(client, job_id, {}).status_code == 401


def test_following_streams_new_chunks_until_the_job_has_finished(client, job):
    job_id, headers, agent = job
    attempt, token = agent.launch()
    agent.send(attempt, token, "first\n")

    def program() -> None:
        time.sleep(1.5)
        agent.send(attempt, token, "second\n")
        time.sleep(1.0)
        agent.send(attempt, token, "last\n")
        agent.exit(attempt, 0)

    worker = threading.Thread(target=program)
    started = time.monotonic()
    worker.start()
    pieces = []
    with follow(client, job_id, headers, attempt) as response:
        assert response.status_code == 200
        for piece in response.iter_text():
            pieces.append((time.monotonic() - started, piece))
    worker.join()
    text = "".join(p for _, p in pieces)
    assert text == "first\nsecond\nlast\n"
    # What was there came at once: before the program's next chunk (sent at 1.5 s) existed.
    # (Not a tighter bound: a loaded machine's S3 has answered one GET in 1.1 s.)
    assert pieces[0][1] == "first\n" and pieces[0][0] < 1.5
    assert client.get(f"/v1/jobs/{job_id}", headers=headers).json()["status"] == "succeeded"


def test_a_follower_holds_no_database_connection_while_it_waits(client, job, db_engine):
    """A follow lasts up to an hour: its request must not keep a pooled connection (and, on
    SQLite, a read transaction that stops the WAL from being checkpointed) all that time."""
    job_id, headers, agent = job
    attempt, token = agent.launch()
    agent.send(attempt, token, "first\n")
    with follow(client, job_id, headers, attempt) as response:
        assert response.status_code == 200
        assert next(response.iter_text()) == "first\n"
        held = []
        for _ in range(20):  # the follower's own polls take a connection for a moment
            held.append(db_engine.pool.checkedout())
            time.sleep(0.05)
        agent.exit(attempt, 0)
    assert min(held) == 0, held


def test_following_a_finished_job_returns_its_log_and_ends(client, job):
    job_id, headers, agent = job
    attempt, token = agent.launch()
    agent.send(attempt, token, "one\ntwo\n")
    agent.exit(attempt, 0)
    started = time.monotonic()
    response = logs(client, job_id, headers, follow="true", tail=1)
    assert response.status_code == 200
    assert response.text.endswith("<==\ntwo\n")
    assert time.monotonic() - started < 5


def test_the_dashboard_job_page_shows_the_latest_log_escaped(client, job):
    job_id, headers, agent = job
    key = headers["Authorization"].split()[1]
    login = client.post(
        "/ui/login",
        data={"token": key},
        headers={"Origin": "http://testserver"},
        follow_redirects=False,
    )
    assert login.status_code == 303
    page = client.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200 and "no log yet" in page.text
    first, token = agent.launch()
    agent.send(first, token, "".join(f"line {i}\n" for i in range(60)))
    agent.send(first, token, "<script>alert(1)</script>\n")
    page = client.get(f"/ui/jobs/{job_id}").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    assert "line 59" in page and "line 11\n" in page and "line 10\n" not in page  # the last 50
    assert f"attempt {first}" in page
    agent.exit(first, 3)
    second, _ = agent.launch()  # no output yet: the page keeps the last attempt that has some
    page = client.get(f"/ui/jobs/{job_id}").text
    assert f"attempt {first}" in page and "line 59" in page


def test_a_store_that_does_not_answer_is_503_and_ends_a_follow_with_a_note(client, job, app, store):
    job_id, headers, agent = job
    attempt, token = agent.launch()
    agent.send(attempt, token, "partial line without end")
    down = S3CheckpointStore(
        store.bucket,
        endpoint_url="http://127.0.0.1:9",  # the discard port: nothing answers
        access_key_id="testing",
        secret_access_key="testing",
        retry=FAST_RETRY,
    )
    app.dependency_overrides[agent_channel.get_store] = lambda: down
    response = logs(client, job_id, headers)
    assert response.status_code == 503, response.text
    assert response.json()["detail"]["code"] == "unavailable"
    followed = logs(client, job_id, headers, follow="true")
    assert followed.status_code == 200
    assert "[broker: the log store did not answer" in followed.text
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        tar.addfile(tarfile.TarInfo("empty.txt"))
    upload = client.post(
        "/v1/workdirs",
        content=archive.getvalue(),
        headers={**headers, "Content-Type": "application/gzip"},
    )
    assert upload.status_code == 503 and "workdir not stored" in upload.text


def test_a_header_starts_its_own_line_after_output_without_a_final_newline(client, job):
    job_id, headers, agent = job
    first, token = agent.launch()
    agent.send(first, token, "progress 99%")
    agent.exit(first, 1)
    second, token2 = agent.launch()
    agent.send(second, token2, "again\n")
    text = logs(client, job_id, headers).text
    assert f"progress 99%\n==> attempt {second} (" in text
