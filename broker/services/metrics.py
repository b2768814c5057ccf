"""Prometheus metrics: the workers' own timings and errors, and figures read from the database.

Two kinds, both rendered by ``GET /metrics`` (``render``):

- worker metrics (``TICK_SECONDS``, ``PROVIDER_ERRORS``), recorded in whatever process does the
  work. Celery workers run prometheus_client in multiprocess mode (``tasks.celery_app`` sets
  ``PROMETHEUS_MULTIPROC_DIR`` to ``Settings.resolved_metrics_dir`` before this module is
  imported), so each process writes its own file there and a scrape adds them up;
- database metrics (``DatabaseCollector``): jobs by status, team money, launches, preemptions
  and capacity refusals, counted at scrape time with a few aggregate queries, so they are right
  whichever process did the work and survive restarts.

Only aggregate numbers are exposed: no tokens, no job specs. Team names and money
(``broker_team_*``) only when the caller may see them (``render(..., teams=True)``; the API asks
for the admin or metrics token). Money stays integer micro-dollars until here, where it becomes
float USD.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy import case, func, or_
from sqlmodel import Session, col, select

from broker.core.job_status import JobStatus
from broker.core.money import from_micros
from broker.db.models import Attempt, Job, LedgerEntry, Team
from broker.services import spend_control
from broker.services.ledger import RELEASE, RESERVE, SPENT_KINDS, period_start

TICK_SECONDS = Histogram(
    "broker_tick_seconds",
    "Wall time of one beat tick, one observe of an attempt or one observe batch, in seconds.",
    ["task"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
POLICY_PLANS = Counter(
    "broker_policy_plans_total",
    "Spot plans the policy asked for, by result: hit (kept from an earlier ask), shared (solved"
    " by another process, loaded from the plan store) or miss (solved).",
    ["result"],
)
BUDGET_HOLDS = Counter(
    "broker_budget_holds_total",
    "Times the budget net asked a job to hold more of its team's budget rather than leave"
    " spot (or not take it), by result: held, or short (max_cost or the team's free budget"
    " could not give it: the net took on-demand).",
    ["result"],
)
PROVIDER_ERRORS = Counter(
    "broker_provider_errors_total",
    "Errors the runner caught from a cloud provider, by kind "
    "(capacity, quota, transient, not_found, other).",
    ["provider", "kind"],
)


def _usd(micros: int) -> float:
    return float(from_micros(int(micros)))


class DatabaseCollector(Collector):
    """Figures counted from the database when Prometheus scrapes (three aggregate queries)."""

    def __init__(self, session: Session, now: datetime, *, teams: bool = False) -> None:
        self.session = session
        self.now = now
        self.teams = teams

    def collect(self) -> Iterator[Metric]:
        yield self._jobs()
        if self.teams:
            yield from self._team_money()
        yield from self._attempts()
        yield from self._leases()

    def _leases(self) -> Iterator[Metric]:
        lapsed, late = spend_control.lapsed(self.session, self.now)
        yield GaugeMetricFamily(
            "broker_leases_lapsed",
            "Running attempts past their spend lease (the control loop is behind).",
            value=lapsed,
        )
        yield GaugeMetricFamily(
            "broker_loop_late_seconds",
            "How far (broker seconds) the oldest lapsed spend lease is past its end.",
            value=late,
        )

    def _jobs(self) -> Metric:
        counts = {status.value: 0 for status in JobStatus}
        rows = self.session.exec(select(Job.status, func.count()).group_by(Job.status)).all()
        counts.update({status: int(count) for status, count in rows})
        jobs = GaugeMetricFamily("broker_jobs", "Jobs by status.", labels=["status"])
        for status, count in sorted(counts.items()):
            jobs.add_metric([status], count)
        return jobs

    def _team_money(self) -> Iterator[Metric]:
        # As ledger.team_budget, for every team at once: spend of the current period
        # ("month" teams) or of all time ("total" teams), and what is still reserved.
        month_start = period_start("month", self.now)
        in_period = col(LedgerEntry.kind).in_(SPENT_KINDS) & or_(
            Team.budget_period == "total", LedgerEntry.created_at >= month_start
        )
        spent = func.coalesce(func.sum(case((in_period, LedgerEntry.amount_micros), else_=0)), 0)
        reserved = func.coalesce(
            func.sum(
                case(
                    (LedgerEntry.kind == RESERVE, LedgerEntry.amount_micros),
                    (LedgerEntry.kind == RELEASE, -LedgerEntry.amount_micros),
                    else_=0,
                )
            ),
            0,
        )
        rows = self.session.exec(
            select(Team.name, spent, reserved)
            .select_from(Team)
            .join(LedgerEntry, LedgerEntry.team_id == Team.id, isouter=True)
            .group_by(Team.id, Team.name)
            .order_by(Team.name)
        ).all()
        spent_usd = GaugeMetricFamily(
            "broker_team_spent_usd",
            "Spend in the team's current budget period, USD.",
            labels=["team"],
        )
        reserved_usd = GaugeMetricFamily(
            "broker_team_reserved_usd",
            "Budget held for the team's unfinished jobs, USD.",
            labels=["team"],
        )
        for name, spent_micros, reserved_micros in rows:
            spent_usd.add_metric([name], _usd(spent_micros))
            reserved_usd.add_metric([name], _usd(reserved_micros))
        yield spent_usd
        yield reserved_usd

    def _attempts(self) -> Iterator[Metric]:
        def ended(reason: str) -> object:
            return func.coalesce(func.sum(case((Attempt.end_reason == reason, 1), else_=0)), 0)

        rows = self.session.exec(
            select(
                Attempt.provider,
                Attempt.zone,
                Attempt.market,
                func.count(Attempt.started_at),
                ended("preempted"),
                ended("capacity"),
            )
            .group_by(Attempt.provider, Attempt.zone, Attempt.market)
            .order_by(Attempt.provider, Attempt.zone, Attempt.market)
        ).all()
        launches = CounterMetricFamily(
            "broker_launches_total",
            "Attempts whose instance started, by provider, zone and market.",
            labels=["provider", "zone", "market"],
        )
        preemptions: dict[tuple[str, str], int] = {}
        capacity: dict[tuple[str, str], int] = {}
        for provider, zone, market, started, preempted, refused in rows:
            launches.add_metric([provider, zone, market], int(started))
            where = (provider, zone)
            preemptions[where] = preemptions.get(where, 0) + int(preempted)
            capacity[where] = capacity.get(where, 0) + int(refused)
        yield launches
        yield _per_zone(
            "broker_preemptions_total", "Attempts the cloud took back (spot).", preemptions
        )
        yield _per_zone(
            "broker_capacity_errors_total", "Launches refused for lack of capacity.", capacity
        )


def _per_zone(name: str, documentation: str, counts: dict[tuple[str, str], int]) -> Metric:
    family = CounterMetricFamily(name, documentation, labels=["provider", "zone"])
    for (provider, zone), count in sorted(counts.items()):
        family.add_metric([provider, zone], count)
    return family


def render(session: Session, now: datetime, metrics_dir: Path, *, teams: bool = False) -> bytes:
    """The Prometheus text exposition of every process's files in ``metrics_dir`` and of the
    database figures at ``now``; the per-team money (team names) only with ``teams``."""
    metrics_dir.mkdir(parents=True, exist_ok=True)
    registry = CollectorRegistry(auto_describe=False)
    MultiProcessCollector(registry, path=str(metrics_dir))
    registry.register(DatabaseCollector(session, now, teams=teams))
    return generate_latest(registry)
