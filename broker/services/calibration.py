"""Learning how fast GPUs really are: throughput corrections per (model, GPU type).

An ended attempt's observed speed is folded into its (model, GPU) correction
(``calibrate``); quotes, re-plans and steering read the corrections back
(``quoting.corrections``) and run the throughput model with them. A gang's speed is learnt
under its own key (``node_scaling.gang_key``: the GPU and the node count), so a gang's
progress never moves the single-machine correction; once learnt it replaces, for that
gang shape, the GPU's correction and the scaling model's figure.
"""

from __future__ import annotations

import logging

import numpy as np
from sqlmodel import Session, select

from broker.core.node_scaling import gang_key
from broker.core.throughput import Workload, update_correction
from broker.db.engine import begin_write, is_postgres
from broker.db.models import Attempt, Job, ThroughputCorrection
from broker.services.job_spec import JobSpec
from broker.services.quoting import Planning

log = logging.getLogger(__name__)

MIN_CALIBRATION_HOURS = 0.25  # attempts shorter than this (after restart) teach nothing


def calibrate(planning: Planning, session: Session, attempt_id: str) -> float | None:
    """Fold an ended attempt's observed speed into its (model, GPU) correction.

    Speed = work the attempt did / its running hours after the restart overhead, against
    the uncorrected prediction of ``planning``'s model for its GPU (its whole gang, keyed
    apart, for a gang); attempts too short to say are skipped. Returns the new factor, or
    None when nothing was learnt.
    """
    begin_write(session)  # reads then a write: on SQLite take the write lock first
    attempt = session.get(Attempt, attempt_id)
    job = session.get(Job, attempt.job_id) if attempt else None
    if attempt is None or job is None or attempt.started_at is None or attempt.ended_at is None:
        session.rollback()
        return None
    model_name = job.spec.get("workload", {}).get("model")
    if not model_name:
        session.rollback()
        return None
    hours = (attempt.ended_at - attempt.started_at).total_seconds() / 3600
    hours -= planning.restart_hours(job)
    work = attempt.work_done - attempt.work_at_start
    if hours < MIN_CALIBRATION_HOURS or work <= 0:
        session.rollback()
        return None
    spec = JobSpec.model_validate(job.spec)
    workload = Workload.from_mapping(spec.workload.model_dump(exclude_none=True))
    nodes = max(attempt.nodes, 1)
    predicted = float(
        planning.model.work_per_hour(
            workload,
            np.array([attempt.gpu]),
            np.array([attempt.gpu_count]),
            nodes=np.array([nodes]),
        )[0]
    )
    key = gang_key(attempt.gpu, nodes)
    statement = select(ThroughputCorrection).where(
        ThroughputCorrection.model == model_name, ThroughputCorrection.gpu == key
    )
    if is_postgres(session):
        statement = statement.with_for_update()
    row = session.exec(statement).first()
    if row is None:
        row = ThroughputCorrection(model=model_name, gpu=key, factor=1.0, observations=0)
    row.factor = update_correction(row.factor, predicted, work / hours, row.observations)
    row.observations += 1
    row.updated_at = attempt.ended_at
    session.add(row)
    session.commit()
    planning.forget_learnt()
    log.info(
        "throughput calibrated",
        extra={"model": model_name, "gpu": key, "factor": round(row.factor, 4)},
    )
    return row.factor
