"""Calibration: an ended attempt's observed speed corrects later quotes."""

from __future__ import annotations

import dataclasses
import time

import pytest

from broker.core.job_status import JobStatus
from broker.db.models import ThroughputCorrection
from broker.services import agent_reports, lifecycle
from broker.services.calibration import calibrate
from broker.services.job_spec import JobSpec
from broker.services.quoting import get_planning, quote_job
from tests.helpers import LEASE, SPOT_PLAN, SPOT_PRICE, chosen


def test_calibration_folds_observed_speed_into_later_quotes(session, clock, submit, run_spot):
    job = submit()
    planning = get_planning()
    spec = JobSpec.model_validate(job.spec)
    before = quote_job(spec, clock.now(), session).plans
    attempt, token = run_spot(job)
    rate = planning.rate(session, job, "V100", 1)  # predicted work per hour
    hours = 2.0
    clock.advance(hours * 3600)
    # The GPU ran at half the predicted speed once past the restart overhead.
    agent_reports.record_progress(session, attempt.id, token, rate * 0.5 * hours, None, clock.now())
    lifecycle.stop(session, job.id, JobStatus.CANCELLED, "test", clock.now())
    factor = calibrate(planning, session, attempt.id)
    assert factor is not None and factor < 0.8
    row = session.get(ThroughputCorrection, (job.spec["workload"]["model"], "V100"))
    assert row is not None and row.observations == 1
    after = quote_job(spec, clock.now(), session)
    v100_before = min(p.expected_hours for p in before if p.gpu == "V100")
    v100_after = min(p.expected_hours for p in after.plans if p.gpu == "V100")
    assert v100_after > v100_before * 1.2


def test_a_gang_s_speed_is_learnt_apart_from_one_machine_s(session, clock, submit):
    job = submit()
    planning = get_planning()
    gang = dataclasses.replace(chosen(SPOT_PLAN, 4 * SPOT_PRICE), nodes=4)
    begun = lifecycle.begin_attempt(session, job.id, gang, clock.now())
    assert begun is not None
    attempt, token = begun
    lifecycle.launch_succeeded(session, attempt.id, "i-1", clock.now(), lease_seconds=LEASE)
    one = planning.rate(session, job, "V100", 1)
    predicted = planning.rate(session, job, "V100", 1, nodes=4)
    assert one < predicted < 4 * one  # 4 machines, less than linear
    hours = 1.0  # 36000 of the job's 40000 steps
    clock.advance(hours * 3600)
    # The gang scaled perfectly: 4 x one machine's speed, past the restart overhead.
    agent_reports.record_progress(session, attempt.id, token, one * 4 * hours, None, clock.now())
    lifecycle.stop(session, job.id, JobStatus.CANCELLED, "test", clock.now())
    factor = calibrate(planning, session, attempt.id)
    assert factor is not None and factor > 1.15
    model = job.spec["workload"]["model"]
    assert session.get(ThroughputCorrection, (model, "V100 x4 nodes")) is not None
    assert session.get(ThroughputCorrection, (model, "V100")) is None
    assert planning.rate(session, job, "V100", 1) == pytest.approx(one)
    assert planning.rate(session, job, "V100", 1, nodes=4) == pytest.approx(predicted * factor)


def test_a_correction_learnt_elsewhere_reaches_quotes_within_the_price_check(
    session, clock, db_engine
):
    """Each process reads the corrections with its price check, not on every quote; one
    that calibrates drops its copy at once."""
    from sqlmodel import Session as Other

    from broker.services.quoting import Planning
    from broker.settings import get_settings

    planning = Planning.from_settings(
        get_settings().model_copy(update={"price_check_seconds": 0.5})
    )
    assert planning.learnt(session) == {}
    read = time.monotonic()
    with Other(db_engine) as other:  # another worker's calibration
        other.add(
            ThroughputCorrection(
                model="ResNet-50", gpu="V100", factor=0.5, observations=1, updated_at=clock.now()
            )
        )
        other.commit()
    session.rollback()  # end this session's read transaction, as a request's end does
    if time.monotonic() - read < 0.4:
        assert planning.learnt(session) == {}
    time.sleep(max(0.0, 0.5 - (time.monotonic() - read)) + 0.05)
    assert planning.learnt(session) == {("ResNet-50", "V100"): 0.5}
    with Other(db_engine) as other:
        row = other.get(ThroughputCorrection, ("ResNet-50", "V100"))
        assert row is not None
        row.factor = 0.25
        other.commit()
    session.rollback()
    planning.forget_learnt()  # what calibrate does after its commit
    assert planning.learnt(session) == {("ResNet-50", "V100"): 0.25}
