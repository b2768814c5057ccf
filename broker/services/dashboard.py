"""What the dashboard shows: budgets, spend over time, jobs, a job's history and the market
prices per GPU type (read only).

Every function takes the teams the viewer may see (one team for a team key, all for the
admin token) and returns plain data the templates and charts render; money stays integer
micro-dollars until the page formats it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func
from sqlmodel import Session, col, select

from broker.core.job_status import deadline_met
from broker.core.offers import OfferTable
from broker.core.spend import on_demand_saving
from broker.db.models import Attempt, Checkpoint, Job, LedgerEntry, Team
from broker.services.ledger import SPENT_KINDS, BudgetFigures, team_budget


@dataclass(frozen=True)
class TeamBudget:
    team: Team
    figures: BudgetFigures


@dataclass(frozen=True)
class JobRow:
    job: Job
    spent_micros: int

    @property
    def deadline_met(self) -> bool | None:
        """The job's deadline outcome (``job_status.deadline_met``; None while it runs)."""
        return deadline_met(self.job.status, self.job.completed_at, self.job.deadline)


@dataclass
class SpendSeries:
    """Cumulative spend at hourly points: per team and per provider."""

    labels: list[str] = field(default_factory=list)
    by_team: dict[str, list[int]] = field(default_factory=dict)
    by_provider: dict[str, list[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Segment:
    """One attempt on the job's timeline, in hours from the job's creation."""

    attempt: Attempt
    start_hours: float
    end_hours: float


@dataclass
class JobHistory:
    job: Job
    segments: list[Segment]
    checkpoints: list[tuple[float, float]]  # (hours from creation, work done)
    spend_curve: list[tuple[float, int]]  # (hours from creation, cumulative micro-USD)
    spent_micros: int

    @property
    def deadline_met(self) -> bool | None:
        """The job's deadline outcome (``job_status.deadline_met``; None while it runs)."""
        return deadline_met(self.job.status, self.job.completed_at, self.job.deadline)

    @property
    def saved_micros(self) -> int | None:
        """What the finished job saved against its on-demand-only cost (None while it runs)."""
        return on_demand_saving(self.job.status, self.job.on_demand_only_micros, self.spent_micros)


@dataclass(frozen=True)
class GpuPrices:
    """One GPU type's cheapest price per GPU-hour in each (provider, region), per market
    (micro-USD; None where that market is not offered there)."""

    gpu: str
    places: list[str]  # "aws us-east-1"
    spot: list[int | None]
    on_demand: list[int | None]
    observed_at: datetime | None  # the newest of these prices' observations (None: bundled)


def price_chart(offers: OfferTable) -> list[GpuPrices]:
    """Per GPU type, the cheapest spot and on-demand price per GPU-hour in each provider and
    region of ``offers`` (the planning's current, overlaid table)."""
    cheapest: dict[tuple[str, str, str], int] = {}  # (gpu, place, market) -> micros per GPU-h
    places: dict[str, set[str]] = defaultdict(set)
    newest: dict[str, datetime] = {}
    for offer in offers.offers():
        place = f"{offer.provider} {offer.region}"
        places[offer.gpu].add(place)
        count = max(offer.gpu_count, 1)
        for market, price, at in (
            ("spot", offer.spot_micros_per_hour, offer.spot_as_of),
            ("on_demand", offer.on_demand_micros_per_hour, offer.on_demand_as_of),
        ):
            if price < 0:
                continue
            key = (offer.gpu, place, market)
            cheapest[key] = min(cheapest.get(key, price // count), price // count)
            if at is not None and (offer.gpu not in newest or at > newest[offer.gpu]):
                newest[offer.gpu] = at
    return [
        GpuPrices(
            gpu=gpu,
            places=sorted(places[gpu]),
            spot=[cheapest.get((gpu, p, "spot")) for p in sorted(places[gpu])],
            on_demand=[cheapest.get((gpu, p, "on_demand")) for p in sorted(places[gpu])],
            observed_at=newest.get(gpu),
        )
        for gpu in sorted(places)
    ]


def visible_teams(session: Session, team_id: str | None) -> list[Team]:
    """The teams a viewer sees: its own, or all of them for the admin (team_id None)."""
    query = select(Team).order_by(col(Team.name))
    if team_id is not None:
        query = query.where(Team.id == team_id)
    return list(session.exec(query).all())


def budgets(session: Session, teams: list[Team], now: datetime) -> list[TeamBudget]:
    """Each team's limit, spend, reservations and alert for the current period."""
    return [TeamBudget(team, team_budget(session, team, now)) for team in teams]


def jobs(session: Session, teams: list[Team], limit: int = 200) -> list[JobRow]:
    """The teams' latest jobs with what each has spent."""
    ids = [t.id for t in teams]
    rows = session.exec(
        select(Job).where(col(Job.team_id).in_(ids)).order_by(col(Job.id).desc()).limit(limit)
    ).all()
    spent = dict(
        session.exec(
            select(LedgerEntry.job_id, func.sum(LedgerEntry.amount_micros))
            .where(col(LedgerEntry.team_id).in_(ids), col(LedgerEntry.kind).in_(SPENT_KINDS))
            .group_by(LedgerEntry.job_id)
        ).all()
    )
    return [JobRow(job, int(spent.get(job.id) or 0)) for job in rows]


def spend_series(
    session: Session, teams: list[Team], now: datetime, points: int = 48
) -> SpendSeries:
    """Cumulative spend per team and per provider at up to ``points`` hourly steps to now."""
    names = {t.id: t.name for t in teams}
    entries = session.exec(
        select(
            LedgerEntry.team_id, LedgerEntry.created_at, LedgerEntry.amount_micros, Attempt.provider
        )
        .join(Attempt, Attempt.id == LedgerEntry.attempt_id, isouter=True)
        .where(col(LedgerEntry.team_id).in_(list(names)), col(LedgerEntry.kind).in_(SPENT_KINDS))
        .order_by(col(LedgerEntry.created_at))
    ).all()
    series = SpendSeries()
    if not entries:
        return series
    first = entries[0][1]
    hours = max((now - first).total_seconds() / 3600, 1e-9)
    step = max(hours / (points - 1), 1 / 60)
    count = int(hours // step) + 2
    edges = [first.timestamp() + i * step * 3600 for i in range(count)]
    series.labels = [datetime.fromtimestamp(e, first.tzinfo).strftime("%m-%d %H:%M") for e in edges]
    team_totals: dict[str, list[int]] = defaultdict(lambda: [0] * count)
    provider_totals: dict[str, list[int]] = defaultdict(lambda: [0] * count)
    for team_id, at, amount, provider in entries:
        index = min(int((at.timestamp() - edges[0]) // (step * 3600)) + 1, count - 1)
        team_totals[names[team_id]][index] += int(amount)
        provider_totals[provider or "other"][index] += int(amount)
    for target, totals in ((series.by_team, team_totals), (series.by_provider, provider_totals)):
        for key, values in sorted(totals.items()):
            running, cumulative = 0, []
            for value in values:
                running += value
                cumulative.append(running)
            target[key] = cumulative
    return series


def job_history(
    session: Session, teams: list[Team], job_id: str, now: datetime
) -> JobHistory | None:
    """A job's attempts, checkpoints and spend curve, or None if the viewer cannot see it."""
    job = session.get(Job, job_id)
    if job is None or job.team_id not in {t.id for t in teams}:
        return None

    def hours(at: datetime | None) -> float:
        return ((at or now) - job.created_at).total_seconds() / 3600

    attempts = session.exec(
        select(Attempt).where(Attempt.job_id == job_id).order_by(col(Attempt.id))
    ).all()
    segments = [
        Segment(a, hours(a.started_at or a.created_at), hours(a.ended_at)) for a in attempts
    ]
    checkpoints = [
        (hours(c.created_at), c.work_done)
        for c in session.exec(
            select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(col(Checkpoint.id))
        ).all()
    ]
    running = 0
    curve: list[tuple[float, int]] = [(0.0, 0)]
    for at, amount in session.exec(
        select(LedgerEntry.created_at, LedgerEntry.amount_micros)
        .where(LedgerEntry.job_id == job_id, col(LedgerEntry.kind).in_(SPENT_KINDS))
        .order_by(col(LedgerEntry.created_at))
    ).all():
        running += int(amount)
        curve.append((hours(at), running))
    return JobHistory(job, segments, checkpoints, curve, running)
