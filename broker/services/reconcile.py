"""Reconcile: make the clouds and the database agree about the broker's instances."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from broker import clock
from broker.db.engine import open_session
from broker.db.models import Attempt
from broker.services import lifecycle
from broker.services.lifecycle import LAUNCHING, RUNNING
from providers.base import TAG_ATTEMPT, Provider

log = logging.getLogger(__name__)


@dataclass
class ReconcileReport:
    """What one reconcile pass did."""

    orphans_terminated: list[str] = field(default_factory=list)
    attempts_marked_gone: list[str] = field(default_factory=list)


def _launched_since(session: Session, attempt_id: str) -> bool:
    """Whether an attempt the first read missed is live now (begun during this pass)."""
    if not attempt_id:
        return False
    session.rollback()  # a new transaction: see attempts committed since the first read
    attempt = session.get(Attempt, attempt_id)
    return attempt is not None and attempt.status in (LAUNCHING, RUNNING)


def reconcile(
    engine: Engine,
    providers: Mapping[str, Provider],
    regions_of: Callable[[str], list[str]],
) -> ReconcileReport:
    """Terminate tagged instances the database does not know as live; mark vanished ones.

    Every region of every provider is listed; an instance carrying the broker's tags whose
    attempt is not launching or running is an orphan (a crash between launch and commit, a
    terminate that failed) and is terminated. A running attempt whose instance is in no
    listing has lost it: the attempt ends as preempted and the job resumes from its latest
    checkpoint.
    """
    report = ReconcileReport()
    with open_session(engine) as session:
        live = {
            a.id: a
            for a in session.exec(
                select(Attempt).where(col(Attempt.status).in_((LAUNCHING, RUNNING)))
            ).all()
        }
        seen: set[str] = set()
        for name, provider in providers.items():
            for region in regions_of(name):
                for ref in provider.list_managed(region):
                    state = provider.describe(ref)
                    if state.status in ("terminated", "preempted"):
                        continue
                    attempt_id = state.tags.get(TAG_ATTEMPT, "")
                    if attempt_id in live or _launched_since(session, attempt_id):
                        seen.add(attempt_id)
                        continue
                    provider.terminate(ref)
                    report.orphans_terminated.append(ref.instance_id)
                    log.warning(
                        "orphan terminated",
                        extra={"instance_id": ref.instance_id, "attempt_id": attempt_id},
                    )
        now = clock.now()
        for attempt_id, attempt in live.items():
            if attempt.status == RUNNING and attempt_id not in seen:
                lifecycle.preempted(session, attempt_id, now)
                report.attempts_marked_gone.append(attempt_id)
    return report
