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
from providers.base import TAG_ATTEMPT, InstanceRef, Provider, ProviderError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReconcileFailure:
    """One cloud call of a pass that failed; the pass went on without it."""

    provider: str
    region: str
    action: str  # "list", "describe" or "terminate"
    instance_id: str | None  # None when a whole region could not be listed
    error: str


@dataclass
class ReconcileReport:
    """What one reconcile pass did, and what it could not do."""

    orphans_terminated: list[str] = field(default_factory=list)
    attempts_marked_gone: list[str] = field(default_factory=list)
    failures: list[ReconcileFailure] = field(default_factory=list)


def _launched_since(session: Session, attempt_id: str) -> bool:
    """Whether an attempt the first read missed is live now (begun during this pass)."""
    if not attempt_id:
        return False
    session.rollback()  # a new transaction: see attempts committed since the first read
    attempt = session.get(Attempt, attempt_id)
    return attempt is not None and attempt.status in (LAUNCHING, RUNNING)


class _Pass:
    """One reconcile pass: the live attempts read at its start and what it has seen since."""

    def __init__(self, session: Session, report: ReconcileReport) -> None:
        self.session = session
        self.report = report
        self.live = {
            a.id: a
            for a in session.exec(
                select(Attempt).where(col(Attempt.status).in_((LAUNCHING, RUNNING)))
            ).all()
        }
        self.seen: set[str] = set()
        # (provider, region) whose listing is incomplete: their attempts are not marked gone.
        self.uncertain: set[tuple[str, str]] = set()

    def failed(self, ref: InstanceRef, action: str, error: ProviderError) -> None:
        instance_id = ref.instance_id or None
        if action != "terminate":  # a listing or a description missed: the region is unclear
            self.uncertain.add((ref.provider, ref.region))
        self.report.failures.append(
            ReconcileFailure(ref.provider, ref.region, action, instance_id, str(error))
        )
        log.warning(
            "reconcile could not %s %s, going on: %s",
            action,
            instance_id or f"{ref.provider} {ref.region}",
            error,
            extra={"provider": ref.provider, "region": ref.region, "instance_id": instance_id},
        )

    def region(self, name: str, provider: Provider, region: str) -> None:
        try:
            refs = provider.list_managed(region)
        except ProviderError as error:
            self.failed(InstanceRef(name, region, "", ""), "list", error)
            return
        for ref in refs:
            self.instance(provider, ref)

    def instance(self, provider: Provider, ref: InstanceRef) -> None:
        try:
            state = provider.describe(ref)
        except ProviderError as error:
            self.failed(ref, "describe", error)
            return
        if state.status in ("terminated", "preempted"):
            return
        attempt_id = state.tags.get(TAG_ATTEMPT, "")
        if attempt_id in self.live or _launched_since(self.session, attempt_id):
            self.seen.add(attempt_id)
            return
        try:
            provider.terminate(ref)
        except ProviderError as error:
            self.failed(ref, "terminate", error)
            return
        self.report.orphans_terminated.append(ref.instance_id)
        log.warning(
            "orphan terminated", extra={"instance_id": ref.instance_id, "attempt_id": attempt_id}
        )

    def mark_gone(self) -> None:
        now = clock.now()
        for attempt_id, attempt in self.live.items():
            if attempt.status != RUNNING or attempt_id in self.seen:
                continue
            if (attempt.provider, attempt.region) in self.uncertain:
                continue  # its instance may be the one a failed call was about
            lifecycle.preempted(self.session, attempt_id, now)
            self.report.attempts_marked_gone.append(attempt_id)


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
    checkpoint. A cloud call that fails (an instance that refuses to terminate, a region that
    does not answer) is logged and counted in ``failures``, and the pass goes on; attempts in
    a region with a failure are not marked gone on this pass.
    """
    report = ReconcileReport()
    with open_session(engine) as session:
        run = _Pass(session, report)
        for name, provider in providers.items():
            for region in regions_of(name):
                run.region(name, provider, region)
        run.mark_gone()
    if report.failures:
        log.warning(
            "reconcile pass finished with %d failed cloud calls",
            len(report.failures),
            extra={"failures": len(report.failures)},
        )
    return report
