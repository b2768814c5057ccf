"""How an agent's word ends attempts: the program's exit code, a preemption notice, silence
(issue 17); and how much of a program's log is kept."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlmodel import Session, select

from broker.core.errors import Conflict, NotFound
from broker.db.models import Attempt, Job, ThroughputCorrection
from broker.services import agent_channel, agent_reports, lifecycle
from broker.services.agent_channel import cut_log
from broker.services.ledger import job_reserved, job_spent
from broker.services.lifecycle import exit_summary
from broker.services.quoting import get_planning
from broker.services.runner import Runner
from providers.base import InstanceRef, InstanceState, LaunchRequest, TransientError

SILENCE, GRACE = 600.0, 300.0


def with_spec(session: Session, job: Job, **fields: object) -> Job:
    """Store ``fields`` in the job's spec as admission stores them (``run``,
    ``max_restarts_on_errors``), whether or not the spec model knows them yet."""
    row = session.get(Job, job.id)
    row.spec = {**row.spec, **fields}
    session.add(row)
    session.commit()
    return row


def reloaded(session: Session, job: Job) -> tuple[Job, list[Attempt]]:
    session.rollback()  # end a read transaction that predates the runner's own sessions
    session.expire_all()
    attempts = session.exec(select(Attempt).where(Attempt.job_id == job.id)).all()
    return session.get(Job, job.id), sorted(attempts, key=lambda a: a.created_at)


# -- exit codes ---------------------------------------------------------------------------


def test_exit_0_succeeds_the_job_and_releases_its_reservation(session, clock, submit, run_spot):
    job = submit()
    attempt, token = run_spot(job)
    clock.advance(1800)
    end = agent_channel.program_exited(session, attempt.id, token, 0, "done\n", clock.now())
    assert end.job_status == "succeeded" and not end.relaunch
    assert [t.instance_id for t in end.terminate] == ["i-1"]
    job, [ended] = reloaded(session, job)
    assert job.status_reason == "program exited 0" and job.finished_at == clock.now()
    assert ended.status == "ended" and ended.exit_code == 0 and ended.billed_seconds == 1800
    assert job_reserved(session, job.id) == 0 and job_spent(session, job.id) > 0


def test_an_exit_and_a_notice_teach_the_speed_correction_as_the_runner_does(
    session, clock, submit, run_spot
):
    planning = get_planning()
    job = submit()
    attempt, token = run_spot(job)
    clock.advance(3 * 3600)
    predicted = planning.rate(session, job, attempt.gpu, attempt.gpu_count)
    agent_reports.record_progress(session, attempt.id, token, predicted * 1.5, None, clock.now())
    agent_channel.preemption_notice(session, attempt.id, token, "spot notice", clock.now())
    # Three hours less the restart overhead at half the predicted speed: a correction below 1.
    row = session.exec(select(ThroughputCorrection)).one()
    assert (row.model, row.gpu, row.observations) == ("ResNet-50", attempt.gpu, 1)
    assert row.factor < 1.0

    second, token = run_spot(session.get(Job, job.id))
    clock.advance(3 * 3600)
    agent_reports.record_progress(
        session, second.id, token, second.work_at_start + predicted * 1.5, None, clock.now()
    )
    agent_channel.program_exited(session, second.id, token, 0, "", clock.now())
    session.expire_all()
    assert session.exec(select(ThroughputCorrection)).one().observations == 2


def test_exit_3_restarts_once_from_the_checkpoint_then_fails_with_the_tail(
    session, clock, submit, run_spot
):
    job = with_spec(session, submit(), max_restarts_on_errors=1)
    first, token = run_spot(job)
    clock.advance(1800)
    agent_reports.record_progress(
        session,
        first.id,
        token,
        700,
        f"jobs/{job.id}/checkpoints/{first.id}/700-1.tar.gz",
        clock.now(),
    )
    agent_reports.record_progress(session, first.id, token, 900, None, clock.now())
    end = agent_channel.program_exited(session, first.id, token, 3, "boom\n", clock.now())
    assert end.job_status == "provisioning" and end.relaunch
    assert [t.instance_id for t in end.terminate] == ["i-1"]
    job, [ended] = reloaded(session, job)
    assert job.status_reason == (
        "exit code 3: restarting from the latest checkpoint (restart 1 of 1)"
    )
    assert job.work_done == job.checkpointed_work == 700
    assert (ended.end_reason, ended.exit_code, ended.billed_seconds) == ("exit code 3", 3, 1800)

    second, token = run_spot(job)
    assert second.work_at_start == 700
    clock.advance(600)
    tail = (
        "epoch 3\n\n  Traceback (most recent call last):\n  File x\n"
        "\x1b[31mValueError: nan loss\x1b[0m\n\n"
    )
    end = agent_channel.program_exited(session, second.id, token, 3, tail, clock.now())
    assert end.job_status == "failed" and not end.relaunch
    job, attempts = reloaded(session, job)
    assert job.status_reason == (
        "exit code 3: Traceback (most recent call last): | File x | ValueError: nan loss"
    )
    assert [a.end_reason for a in attempts] == ["exit code 3", "exit code 3"]
    assert job_reserved(session, job.id) == 0


def test_without_restarts_a_failed_exit_fails_the_job_at_once(session, clock, submit, run_spot):
    job = submit()
    attempt, token = run_spot(job)
    end = agent_channel.program_exited(session, attempt.id, token, -9, "", clock.now())
    assert end.job_status == "failed"
    job, _ = reloaded(session, job)
    assert job.status_reason == "exit code -9"


def test_a_failed_exit_after_the_final_checkpoint_is_a_success(session, clock, submit, run_spot):
    job = submit()
    attempt, token = run_spot(job)
    clock.advance(3 * 3600)
    final = f"jobs/{job.id}/checkpoints/{attempt.id}/final.tar.gz"
    agent_reports.record_progress(session, attempt.id, token, job.total_work, final, clock.now())
    end = agent_channel.program_exited(session, attempt.id, token, 1, "teardown", clock.now())
    assert end.job_status == "succeeded"


def test_an_exit_of_an_ended_attempt_is_refused_and_changes_nothing(
    session, clock, submit, run_spot
):
    job = submit()
    attempt, token = run_spot(job)
    agent_channel.program_exited(session, attempt.id, token, 0, "", clock.now())
    with pytest.raises(Conflict):
        agent_channel.program_exited(session, attempt.id, token, 1, "", clock.now())
    with pytest.raises(NotFound):
        agent_channel.program_exited(session, attempt.id, "att_other", 0, "", clock.now())
    # Called directly (a race with another ending), the lifecycle step is a no-op.
    assert lifecycle.program_exited(session, attempt.id, 1, "", clock.now()) == []
    job, [ended] = reloaded(session, job)
    assert job.status == "succeeded" and ended.exit_code == 0


def test_exit_summary_keeps_the_last_three_lines_within_500_characters():
    assert exit_summary(2, "a\n\nb\r\nc\nd\n") == "exit code 2: b | c | d"
    assert exit_summary(2, "\x00\x07 \n") == "exit code 2"
    long = exit_summary(1, "x" * 4096)
    assert len(long) == 500 and long.startswith("exit code 1: xxx")


# -- preemption notice --------------------------------------------------------------------


def test_a_preemption_notice_ends_the_attempt_now_and_asks_for_a_relaunch(
    session, clock, submit, run_spot
):
    job = submit()
    attempt, token = run_spot(job)
    clock.advance(1000)
    end = agent_channel.preemption_notice(
        session, attempt.id, token, "spot instance-action terminate", clock.now()
    )
    assert end.job_status == "preempted" and end.relaunch
    assert [t.instance_id for t in end.terminate] == ["i-1"]
    job, [ended] = reloaded(session, job)
    assert job.status_reason == "preempted in use1-az1: spot instance-action terminate"
    assert (ended.end_reason, ended.billed_seconds) == ("preempted", 1000)


# -- silence ------------------------------------------------------------------------------


class Cloud:
    """Instances that run until terminated; ``fail_describe`` makes the next describe a
    transient error."""

    def __init__(self) -> None:
        self.terminated: list[str] = []
        self.fail_describe = False

    def launch(self, request: LaunchRequest) -> InstanceRef:
        return InstanceRef(request.provider, request.region, request.zone, f"i-{request.token}")

    def describe(self, ref: InstanceRef) -> InstanceState:
        if self.fail_describe:
            self.fail_describe = False
            raise TransientError("describe timed out")
        gone = ref.instance_id in self.terminated
        return InstanceState("terminated" if gone else "running", None, datetime.now(UTC))

    def terminate(self, ref: InstanceRef) -> None:
        self.terminated.append(ref.instance_id)

    def list_managed(self, region: str) -> list[InstanceRef]:
        return []


@pytest.fixture
def hands(db_engine):  # type: ignore[no-untyped-def]
    cloud = Cloud()
    runner = Runner(
        db_engine,
        {"aws": cloud, "gcp": cloud},  # type: ignore[dict-item]
        get_planning(),
        agent_secret="secret",
        api_url="http://broker.invalid",
        tick_seconds=5.0,
        agent_silence_seconds=SILENCE,
        agent_boot_grace_seconds=GRACE,
    )
    return runner, cloud


def test_an_agent_never_heard_is_lost_after_silence_plus_boot_grace_billed_to_that_moment(
    session, clock, submit, run_spot, hands
):
    runner, cloud = hands
    job = submit(market="spot")
    attempt, _ = run_spot(job)
    clock.advance(SILENCE + GRACE)
    runner.observe(attempt.id)  # exactly the allowance: still fine
    assert reloaded(session, job)[0].status == "running" and cloud.terminated == []

    clock.advance(1)
    cloud.fail_describe = True
    runner.observe(attempt.id)  # one failed describe poll decides nothing
    assert reloaded(session, job)[0].status == "running"

    runner.observe(attempt.id)
    job, [lost] = reloaded(session, job)
    assert (lost.status, lost.end_reason) == ("ended", "lost")
    assert lost.ended_at == clock.now()
    assert lost.billed_seconds == SILENCE + GRACE + 1
    assert job_spent(session, job.id) == lost.cost_micros
    assert job.status == "preempted" and job.work_done == job.checkpointed_work
    assert job.status_reason.startswith("agent silent for 901 s (never heard")
    assert cloud.terminated == ["i-1"]
    assert job.id in runner.due().launch  # waiting again: the next tick relaunches it


def test_an_agent_heard_lately_is_not_lost_and_silence_counts_from_its_last_call(
    session, clock, submit, run_spot, hands
):
    runner, cloud = hands
    job = submit(market="spot")
    attempt, token = run_spot(job)
    clock.advance(SILENCE + GRACE - 10)
    agent_reports.heard(session, attempt.id, token, clock.now())
    clock.advance(SILENCE)
    runner.observe(attempt.id)  # long since launch, but heard SILENCE ago: no grace, fine
    assert reloaded(session, job)[0].status == "running"
    clock.advance(1)
    runner.observe(attempt.id)
    job, [lost] = reloaded(session, job)
    assert lost.end_reason == "lost" and job.status == "preempted"
    assert "last heard" in job.status_reason


def test_on_a_fast_clock_silence_is_counted_in_the_reports_an_agent_can_send(
    session, clock, submit, run_spot, hands
):
    runner, cloud = hands
    clock.scale = 900.0  # an agent reports once a wall second at most: every 900 broker s
    job = submit(market="spot")
    attempt, token = run_spot(job)
    agent_reports.heard(session, attempt.id, token, clock.now())
    clock.advance(SILENCE * 900 / 60)  # as many missed reports as at 60 s a report
    runner.observe(attempt.id)
    assert reloaded(session, job)[0].status == "running"
    clock.advance(1)
    runner.observe(attempt.id)
    assert reloaded(session, job)[1][0].end_reason == "lost"


def test_lost_changes_nothing_when_the_agent_spoke_after_the_caller_looked(
    session, clock, submit, run_spot
):
    job = submit()
    attempt, token = run_spot(job)
    looked = clock.now()
    clock.advance(10)
    agent_reports.heard(session, attempt.id, token, clock.now())
    assert lifecycle.lost(session, attempt.id, clock.now(), "silent", silent_since=looked) == []
    assert reloaded(session, job)[0].status == "running"


def test_every_accepted_call_marks_the_attempt_heard(session, clock, submit, run_spot):
    job = submit()
    attempt, token = run_spot(job)
    assert session.get(Attempt, attempt.id).last_heard_at is None
    clock.advance(60)
    agent_reports.record_progress(session, attempt.id, token, 1, None, clock.now())
    session.expire_all()
    assert session.get(Attempt, attempt.id).last_heard_at == clock.now()
    with pytest.raises(NotFound):
        agent_reports.heard(session, attempt.id, "att_wrong", clock.now())


# -- logs ---------------------------------------------------------------------------------


def test_a_log_chunk_within_the_limit_is_kept_whole():
    assert cut_log(b"line\n", 0, 10) == (b"line\n", 5, False)
    assert cut_log(b"", 10, 10) == (b"", 0, False)


def test_the_chunk_passing_the_limit_keeps_whole_characters_and_one_truncation_line():
    chunk, accepted, truncated = cut_log("ab\u00e9cd\n".encode(), 5, 8)  # room: 3 bytes
    assert (chunk, accepted, truncated) == (
        b"ab\n[broker: log truncated after 7 bytes]\n",
        2,
        True,
    )
    stored = 5 + len(chunk)
    assert stored > 8
    assert cut_log(b"more\n", stored, 8) == (b"", 0, True)
    assert cut_log(b"x\n", 8, 8) == (b"[broker: log truncated after 8 bytes]\n", 0, True)
