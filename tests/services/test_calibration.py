"""Calibration: an ended attempt's observed speed corrects later quotes."""

from __future__ import annotations

from broker.core.job_status import JobStatus
from broker.db.models import ThroughputCorrection
from broker.services import agent_reports, lifecycle
from broker.services.calibration import calibrate
from broker.services.job_spec import JobSpec
from broker.services.quoting import get_planning, quote_job


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
