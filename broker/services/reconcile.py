"""Reconcile: make the clouds and the database agree about the broker's instances.

A pass lists the clouds first (one ``list_managed`` per region, no transaction open), then
reads the live attempts in one short transaction, then acts: it terminates the orphans and
ends the attempts whose instance is gone, each in its own transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.engine import Engine
from sqlmodel import col, select

from broker import clock
from broker.db.engine import open_session
from broker.db.models import Attempt, AttemptNode
from broker.services import lifecycle
from broker.services.lifecycle import ENDED, LAUNCHING, RUNNING
from providers.base import TAG_ATTEMPT, ManagedInstance, Provider, ProviderError

log = logging.getLogger(__name__)

DEFAULT_MIN_AGE_SECONDS = 600.0


@dataclass(frozen=True)
class ReconcileFailure:
    """One cloud call of a pass that failed; the pass went on without it."""

    provider: str
    region: str
    action: str  # "list" or "terminate"
    instance_id: str | None  # None when a whole region could not be listed
    error: str


@dataclass
class ReconcileReport:
    """What one reconcile pass did, and what it could not do."""

    # Instances the database knows no attempt of (a crash between launch and commit).
    orphans_terminated: list[str] = field(default_factory=list)
    # Instances still running for an attempt that has ended (its terminate is on its way, or
    # failed): terminated as the attempt's end asked.
    ended_terminated: list[str] = field(default_factory=list)
    attempts_marked_gone: list[str] = field(default_factory=list)
    failures: list[ReconcileFailure] = field(default_factory=list)
    # Unknown instances younger than the minimum age: left for a later pass.
    young_unknown: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Live:
    """A launching or running attempt as the comparison read it."""

    status: str
    provider: str
    region: str
    started_at: datetime | None
    # A gang's node instances (every rank's, once launched); empty for a single instance.
    nodes: frozenset[str] = frozenset()


def _fail(
    report: ReconcileReport,
    provider: str,
    region: str,
    action: str,
    instance_id: str | None,
    error: ProviderError,
) -> None:
    report.failures.append(ReconcileFailure(provider, region, action, instance_id, str(error)))
    log.warning(
        "reconcile could not %s %s, going on: %s",
        action,
        instance_id or f"{provider} {region}",
        error,
        extra={"provider": provider, "region": region, "instance_id": instance_id},
    )


def _list_clouds(
    providers: Mapping[str, Provider], report: ReconcileReport
) -> tuple[list[tuple[Provider, ManagedInstance]], set[tuple[str, str]]]:
    """Every managed instance of every region, and the (provider, region)s listed whole."""
    listed: list[tuple[Provider, ManagedInstance]] = []
    whole: set[tuple[str, str]] = set()
    for name, provider in providers.items():
        for region in provider.regions():
            try:
                found = provider.list_managed(region)
            except ProviderError as error:
                _fail(report, name, region, "list", None, error)
                continue
            whole.add((name, region))
            listed.extend((provider, instance) for instance in found)
    return listed, whole


def _live_attempts(engine: Engine) -> dict[str, _Live]:
    """The launching and running attempts, read in one short transaction."""
    with open_session(engine) as session:
        rows = session.exec(
            select(Attempt).where(col(Attempt.status).in_((LAUNCHING, RUNNING)))
        ).all()
        gangs = [a.id for a in rows if a.nodes > 1]
        nodes: dict[str, set[str]] = {}
        if gangs:
            for attempt_id, instance_id in session.exec(
                select(AttemptNode.attempt_id, AttemptNode.instance_id).where(
                    col(AttemptNode.attempt_id).in_(gangs)
                )
            ).all():
                if instance_id:
                    nodes.setdefault(attempt_id, set()).add(instance_id)
        return {
            a.id: _Live(
                a.status, a.provider, a.region, a.started_at, frozenset(nodes.get(a.id, ()))
            )
            for a in rows
        }


def _ended_attempts(engine: Engine, attempt_ids: list[str]) -> set[str]:
    """Which of ``attempt_ids`` are attempts that have ended (one short read)."""
    wanted = sorted({a for a in attempt_ids if a})
    if not wanted:
        return set()
    with open_session(engine) as session:
        return set(
            session.exec(
                select(Attempt.id).where(col(Attempt.id).in_(wanted), Attempt.status == ENDED)
            ).all()
        )


def _whole(attempt: _Live, listed: set[str] | None) -> bool:
    """Whether a live attempt's instances are all in the listing: its one instance, or every
    node of a gang."""
    if not listed:
        return False
    return attempt.nodes <= listed


def reconcile(
    engine: Engine,
    providers: Mapping[str, Provider],
    *,
    min_age_seconds: float = DEFAULT_MIN_AGE_SECONDS,
) -> ReconcileReport:
    """Terminate tagged instances the database does not know as live; mark vanished ones.

    Every region of every provider (``Provider.regions``) is listed; a live instance carrying
    the broker's tags whose attempt is not launching or running, and that is at least
    ``min_age_seconds`` (broker clock) old, is an orphan (a crash between launch and commit,
    a terminate that failed) and is terminated; a younger one is left to a later pass (its
    launch may still be on its way to the database). An attempt that was running before the
    listing began and whose instance is in no listing has lost it (a gang: any node's): it
    ends as preempted, a gang's other nodes are terminated, and the job resumes from its
    latest checkpoint. A cloud call that fails is logged and counted
    in ``failures`` and the pass goes on; attempts of a region that was not listed whole are
    not marked gone on this pass.
    """
    report = ReconcileReport()
    listing_began = clock.now()
    listed, whole = _list_clouds(providers, report)
    live = _live_attempts(engine)  # after the listing: every listed launch has its row by now
    now = clock.now()

    seen: dict[str, set[str]] = {}  # live attempt -> its instances listed alive
    listed_alive: dict[str, tuple[Provider, ManagedInstance]] = {}
    orphans: list[tuple[Provider, ManagedInstance]] = []
    for provider, instance in listed:
        if instance.state.status in ("terminated", "preempted"):
            continue
        attempt_id = instance.state.tags.get(TAG_ATTEMPT, "")
        if attempt_id in live:  # every node of a gang carries its attempt's tag
            seen.setdefault(attempt_id, set()).add(instance.instance_id)
            listed_alive[instance.instance_id] = (provider, instance)
        elif (now - (instance.state.launched_at or now)).total_seconds() < min_age_seconds:
            report.young_unknown.append(instance.instance_id)
        else:
            orphans.append((provider, instance))

    ended = _ended_attempts(engine, [i.state.tags.get(TAG_ATTEMPT, "") for _, i in orphans])
    for provider, instance in orphans:
        try:
            provider.terminate(instance)
        except ProviderError as error:
            where = (instance.provider, instance.region)
            _fail(report, *where, "terminate", instance.instance_id, error)
            continue
        attempt_id = instance.state.tags.get(TAG_ATTEMPT, "")
        extra = {"instance_id": instance.instance_id, "attempt_id": attempt_id}
        if attempt_id in ended:  # its terminate was sent, or failed: cleanup, not an orphan
            report.ended_terminated.append(instance.instance_id)
            log.info("instance of an ended attempt terminated", extra=extra)
        else:
            report.orphans_terminated.append(instance.instance_id)
            log.warning("orphan terminated", extra=extra)

    for attempt_id, attempt in live.items():
        if attempt.status != RUNNING or _whole(attempt, seen.get(attempt_id)):
            continue
        if (attempt.provider, attempt.region) not in whole:
            continue  # its region's listing failed (or no provider lists it)
        if attempt.started_at is None or attempt.started_at > listing_began:
            continue  # launched while the listing ran: its instance may not be in it
        with open_session(engine) as session:
            ended = lifecycle.preempted(session, attempt_id, now)
        report.attempts_marked_gone.append(attempt_id)
        # A gang whose node is gone stops whole: its nodes still listed are terminated.
        for item in ended:
            if item.instance_id in listed_alive:
                provider, instance = listed_alive[item.instance_id]
                try:
                    provider.terminate(instance)
                except ProviderError as error:
                    where = (instance.provider, instance.region)
                    _fail(report, *where, "terminate", instance.instance_id, error)

    if report.failures:
        log.warning(
            "reconcile pass finished with %d failed cloud calls",
            len(report.failures),
            extra={"failures": len(report.failures)},
        )
    return report
