"""The agent routes for a gang (issue 20): a node's run spec names its rank and node 0's
rendezvous; only node 0 reports the rendezvous, work and checkpoints; a non-zero exit of any
node ends the gang's attempt, an exit 0 of node k >= 1 does not; a notice from any node ends
it as preempted; each node's log is kept and read on its own. Bad input is a 422 naming the
field."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlmodel import Session

from broker.db.models import Attempt, Job
from broker.services import lifecycle
from broker.services.launch_request import agent_token
from broker.services.plans import job_plan
from tests.helpers import LEASE, job_spec


@pytest.fixture
def gang(client, make_team, db_engine, clock, store):  # type: ignore[no-untyped-def]
    """Submit a job and launch an attempt of ``nodes`` nodes on its plan; (job id, attempt
    id, token, team headers)."""

    def _gang(nodes: int = 2, **spec: object) -> tuple[str, str, str, dict[str, str]]:
        _, headers = make_team()
        job = client.post("/v1/jobs", json=job_spec(**spec), headers=headers)
        assert job.status_code == 201, job.text
        with Session(db_engine, expire_on_commit=False) as session:
            row = session.get(Job, job.json()["id"])
            attempt, token = lifecycle.begin_attempt(
                session,
                row.id,
                replace(job_plan(row), nodes=nodes),
                clock.now(),
                token_for=lambda attempt_id: agent_token("s", attempt_id, row.deadline),
            )
            lifecycle.launch_succeeded(session, attempt.id, "i-1", clock.now(), lease_seconds=LEASE)
        return row.id, attempt.id, token, headers

    return _gang


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def attempt_row(db_engine, attempt_id: str) -> Attempt:  # type: ignore[no-untyped-def]
    with Session(db_engine, expire_on_commit=False) as session:
        return session.get(Attempt, attempt_id)


def job_row(db_engine, job_id: str) -> Job:  # type: ignore[no-untyped-def]
    with Session(db_engine, expire_on_commit=False) as session:
        return session.get(Job, job_id)


def refused_field(response) -> list:  # type: ignore[no-untyped-def]
    assert response.status_code == 422, response.text
    return [error["loc"] for error in response.json()["detail"]]


def test_a_nodes_run_spec_names_its_rank_and_node_0s_rendezvous_once_reported(
    client, gang, db_engine, clock
):
    _, attempt_id, token, _ = gang(3)
    run = f"/v1/attempts/{attempt_id}/run"
    before = client.get(run, params={"node": 2}, headers=bearer(token))
    assert before.status_code == 200, before.text
    assert before.json()["gang"] == {
        "node_rank": 2,
        "nodes": 3,
        "master_addr": None,
        "master_port": None,
    }
    clock.advance(5)
    said = client.post(
        f"/v1/attempts/{attempt_id}/rendezvous",
        json={"node": 0, "addr": "10.0.3.7", "port": 29500},
        headers=bearer(token),
    )
    assert said.status_code == 200, said.text
    assert said.json() == {
        "node_rank": 0,
        "nodes": 3,
        "master_addr": "10.0.3.7",
        "master_port": 29500,
    }
    row = attempt_row(db_engine, attempt_id)
    assert (row.master_addr, row.master_port, row.last_heard_at) == ("10.0.3.7", 29500, clock.now())
    after = client.get(run, params={"node": 1}, headers=bearer(token)).json()["gang"]
    assert after == {"node_rank": 1, "nodes": 3, "master_addr": "10.0.3.7", "master_port": 29500}
    assert client.get(run, headers=bearer(token)).json()["gang"]["node_rank"] == 0


def test_a_single_node_attempts_run_spec_has_no_gang_and_no_rendezvous(client, gang):
    _, attempt_id, token, _ = gang(1)
    spec = client.get(f"/v1/attempts/{attempt_id}/run", headers=bearer(token))
    assert spec.status_code == 200 and "gang" not in spec.json()
    said = client.post(
        f"/v1/attempts/{attempt_id}/rendezvous",
        json={"addr": "10.0.0.1", "port": 1234},
        headers=bearer(token),
    )
    assert refused_field(said) == [["body", "node"]]
    assert "single-node" in said.json()["detail"][0]["msg"]
    other = client.get(f"/v1/attempts/{attempt_id}/run?node=1", headers=bearer(token))
    assert refused_field(other) == [["query", "node"]]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"node": 1, "addr": "10.0.0.2", "port": 29500}, "node"),
        ({"node": 0, "addr": "10.0.0.2", "port": 0}, "port"),
        ({"node": 0, "addr": "10.0.0.2", "port": 65536}, "port"),
        ({"node": 0, "addr": "x" * 101, "port": 29500}, "addr"),
        ({"node": 0, "addr": "", "port": 29500}, "addr"),
        ({"node": 0, "addr": "host; rm -rf /", "port": 29500}, "addr"),
        ({"node": 0, "port": 29500}, "addr"),
        ({"node": -1, "addr": "10.0.0.2", "port": 29500}, "node"),
    ],
)
def test_a_bad_rendezvous_is_a_422_naming_the_field_and_changes_nothing(
    client, gang, db_engine, body, field
):
    _, attempt_id, token, _ = gang(2)
    said = client.post(f"/v1/attempts/{attempt_id}/rendezvous", json=body, headers=bearer(token))
    assert refused_field(said) == [["body", field]]
    assert attempt_row(db_engine, attempt_id).master_addr is None


def test_a_rank_the_gang_does_not_have_is_a_422_naming_node_on_every_route(client, gang):
    _, attempt_id, token, _ = gang(2)
    base = f"/v1/attempts/{attempt_id}"
    text = {**bearer(token), "Content-Type": "text/plain; charset=utf-8"}
    assert refused_field(client.get(f"{base}/run?node=2", headers=bearer(token))) == [
        ["query", "node"]
    ]
    assert refused_field(client.get(f"{base}/run?node=-1", headers=bearer(token))) == [
        ["query", "node"]
    ]
    logs = client.post(f"{base}/logs?node=2", content=b"x\n", headers=text)
    assert refused_field(logs) == [["query", "node"]]
    for route, body in (
        ("progress", {"work_done": 0, "node": 2}),
        ("exit", {"exit_code": 1, "node": 2}),
        ("preempted", {"reason": "x", "node": 2}),
        ("lapsed", {"node": 2}),
    ):
        answer = client.post(f"{base}/{route}", json=body, headers=bearer(token))
        assert refused_field(answer) == [["body", "node"]], route


def test_node_1s_progress_is_a_heartbeat_only_and_it_reports_no_checkpoint(
    client, gang, db_engine, clock
):
    job_id, attempt_id, token, team = gang(2)
    clock.advance(3600)
    base = f"/v1/attempts/{attempt_id}"
    ack = client.post(f"{base}/progress", json={"work_done": 500, "node": 1}, headers=bearer(token))
    assert ack.status_code == 200, ack.text
    assert ack.json()["should_stop"] is False and ack.json()["lease_seconds_left"] > 0
    assert job_row(db_engine, job_id).work_done == 0
    assert attempt_row(db_engine, attempt_id).last_heard_at == clock.now()
    key = f"jobs/{job_id}/checkpoints/{attempt_id}/500-1.tar.gz"
    with_key = {"work_done": 500, "checkpoint_key": key, "node": 1}
    refused = client.post(f"{base}/progress", json=with_key, headers=bearer(token))
    assert refused_field(refused) == [["body", "checkpoint_key"]]
    upload = client.post(
        f"{base}/checkpoints", json={"work_done": 500, "node": 1}, headers=bearer(token)
    )
    assert refused_field(upload) == [["body", "node"]]
    assert client.get(f"/v1/jobs/{job_id}", headers=team).json()["checkpoints"] == []
    node0 = client.post(f"{base}/progress", json={"work_done": 500}, headers=bearer(token))
    assert node0.status_code == 200 and job_row(db_engine, job_id).work_done == 500


def exit_(client, attempt_id: str, token: str, node: int, code: int, tail: str = ""):  # type: ignore[no-untyped-def]
    return client.post(
        f"/v1/attempts/{attempt_id}/exit",
        json={"exit_code": code, "tail": tail, "node": node},
        headers=bearer(token),
    )


def test_node_1s_exit_0_is_only_logged_its_exit_3_ends_the_gangs_attempt(
    client, gang, db_engine, clock
):
    job_id, attempt_id, token, _ = gang(2)
    clock.advance(600)
    done = exit_(client, attempt_id, token, 1, 0, "train: done\n")
    assert done.status_code == 200 and done.json() == {"job_status": "running"}
    row = attempt_row(db_engine, attempt_id)
    assert (row.status, row.exit_code) == ("running", None)

    failed = exit_(client, attempt_id, token, 1, 3, "loading\nboom at step 5\n")
    assert failed.status_code == 200 and failed.json() == {"job_status": "failed"}
    row = attempt_row(db_engine, attempt_id)
    assert (row.status, row.end_reason, row.exit_code) == ("ended", "exit code 3", 3)
    assert job_row(db_engine, job_id).status_reason == (
        "exit code 3: node 1: loading | node 1: boom at step 5"
    )
    assert exit_(client, attempt_id, token, 0, 1).status_code == 409


def test_a_notice_from_node_1_ends_the_gang_as_preempted(client, gang, db_engine, clock):
    job_id, attempt_id, token, _ = gang(2)
    clock.advance(300)
    notice = client.post(
        f"/v1/attempts/{attempt_id}/preempted",
        json={"reason": "spot instance-action: terminate", "node": 1},
        headers=bearer(token),
    )
    assert notice.status_code == 200 and notice.json() == {"job_status": "preempted"}
    row = attempt_row(db_engine, attempt_id)
    assert (row.end_reason, row.billed_seconds) == ("preempted", 300)
    reason = job_row(db_engine, job_id).status_reason
    assert reason.endswith(": node 1: spot instance-action: terminate")


def post_log(client, attempt_id: str, token: str, text: bytes, node: int | None = None):  # type: ignore[no-untyped-def]
    return client.post(
        f"/v1/attempts/{attempt_id}/logs",
        params={} if node is None else {"node": node},
        content=text,
        headers={**bearer(token), "Content-Type": "text/plain; charset=utf-8"},
    )


def test_each_nodes_log_is_kept_and_read_on_its_own(client, gang, store, db_engine):
    job_id, attempt_id, token, team = gang(2)
    for text, node in ((b"zero a\n", None), (b"one a\n", 1), (b"zero b\n", 0), (b"one b\n", 1)):
        assert post_log(client, attempt_id, token, text, node).status_code == 200
    prefix = f"jobs/{job_id}/logs/{attempt_id}/"
    assert sorted(store.list_keys(prefix)) == [
        f"{prefix}000000.log",
        f"{prefix}000002.log",
        f"{prefix}node1/000001.log",
        f"{prefix}node1/000003.log",
    ]
    logs = f"/v1/jobs/{job_id}/logs"
    row = attempt_row(db_engine, attempt_id)
    header = f"==> attempt {attempt_id} ({row.zone}, {row.market}) <==\n"
    assert client.get(logs, headers=team).text == header + "zero a\nzero b\n"
    node1 = client.get(logs, params={"node": 1}, headers=team)
    assert node1.status_code == 200, node1.text
    assert node1.text == header.replace(attempt_id, f"{attempt_id} node 1") + "one a\none b\n"
    one = client.get(logs, params={"node": 1, "attempt": attempt_id, "tail": 1}, headers=team)
    assert one.text == "one b\n"
    assert (
        client.get(logs, params={"node": 2, "attempt": attempt_id}, headers=team).status_code == 404
    )
    assert client.get(logs, params={"node": 2}, headers=team).text == ""
    assert client.get(logs, params={"node": -1}, headers=team).status_code == 422

    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=team).status_code == 202
    followed = client.get(logs, params={"node": 1, "follow": "true"}, headers=team)
    assert followed.text.endswith("one a\none b\n")


def test_a_gangs_nodes_share_a_log_limit_of_the_limit_times_the_nodes(
    client, gang, store, monkeypatch
):
    from broker.settings import get_settings

    monkeypatch.setenv("BROKER_AGENT_LOG_LIMIT_BYTES", "8")
    get_settings.cache_clear()
    try:
        _, attempt_id, token, _ = gang(2)
        assert post_log(client, attempt_id, token, b"12345678\n", 1).json()["truncated"] is False
        cut = post_log(client, attempt_id, token, b"abcdefghij\n", 0).json()
        assert cut == {"accepted_bytes": 7, "truncated": True}
    finally:
        monkeypatch.delenv("BROKER_AGENT_LOG_LIMIT_BYTES")
        get_settings.cache_clear()
