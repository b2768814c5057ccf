"""SQLModel tables: teams and keys, jobs and their attempts and checkpoints, the money ledger."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, DateTime, Index, UniqueConstraint
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in and out, also on SQLite (which stores no offset)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the database")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _ts(*, nullable: bool = False, index: bool = False) -> Any:
    return Field(default=None, sa_column=Column(UTCDateTime(), nullable=nullable, index=index))


def _micros(*, nullable: bool = False, default: int | None = 0) -> Any:
    return Field(default=default, sa_column=Column(BigInteger, nullable=nullable))


class Team(SQLModel, table=True):
    """A team: owner of jobs, holder of one budget (hard limit) with an alert threshold."""

    id: str = Field(primary_key=True, max_length=40)
    name: str = Field(max_length=100, unique=True)
    budget_limit_micros: int = _micros()
    budget_period: str = Field(max_length=10)  # "month" | "total"
    alert_at: float = 0.8
    created_at: datetime = _ts()
    updated_at: datetime = _ts()


class ApiKey(SQLModel, table=True):
    """A team key: only its SHA-256 hash and a short prefix are kept."""

    __tablename__ = "api_key"

    id: str = Field(primary_key=True, max_length=40)
    team_id: str = Field(foreign_key="team.id", index=True, max_length=40)
    name: str = Field(max_length=100)
    prefix: str = Field(max_length=16)
    token_hash: str = Field(max_length=64, unique=True)
    created_at: datetime = _ts()
    revoked_at: datetime | None = _ts(nullable=True)


class Job(SQLModel, table=True):
    """A training job: its spec as submitted, the chosen plan, status and progress."""

    __table_args__ = (
        UniqueConstraint("team_id", "idempotency_key", name="uq_job_team_idempotency_key"),
        Index("ix_job_team_id_id", "team_id", "id"),
    )

    id: str = Field(primary_key=True, max_length=40)
    team_id: str = Field(foreign_key="team.id", max_length=40)
    name: str = Field(max_length=200)
    status: str = Field(max_length=20, index=True)
    status_reason: str | None = Field(default=None, max_length=500)
    spec: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    plan: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    market: str = Field(max_length=10)
    total_work: float
    work_done: float = 0.0
    checkpointed_work: float = 0.0
    deadline: datetime = _ts()
    # The latest start that still meets the deadline on the job's plan (the deadline less the
    # plan's expected hours): waiting jobs launch in this order, least slack first.
    start_by: datetime | None = _ts(nullable=True)
    max_cost_micros: int = _micros()
    # Expected cost of the cheapest on-time on-demand plan at admission (the quote's figure,
    # what the reservation is a multiple of).
    on_demand_cost_micros: int | None = _micros(nullable=True, default=None)
    # What the job would spend run on that plan alone, booked as spend is, priced at admission
    # (``broker.core.spend``): what spot saves against.
    on_demand_only_micros: int | None = _micros(nullable=True, default=None)
    priority: int = 0
    idempotency_key: str | None = Field(default=None, max_length=200)
    request_hash: str | None = Field(default=None, max_length=64)
    created_at: datetime = _ts()
    updated_at: datetime = _ts()
    finished_at: datetime | None = _ts(nullable=True)
    # When the work was observed complete (broker clock): the first checkpoint holding all of
    # it, or the program's exit 0; None while the work is not complete.
    completed_at: datetime | None = _ts(nullable=True)


class Attempt(SQLModel, table=True):
    """One instance launched for a job, with what it has cost so far."""

    id: str = Field(primary_key=True, max_length=40)
    job_id: str = Field(foreign_key="job.id", index=True, max_length=40)
    team_id: str = Field(foreign_key="team.id", max_length=40)
    provider: str = Field(max_length=20)
    region: str = Field(max_length=40)
    zone: str = Field(max_length=40)
    instance_type: str = Field(max_length=60)
    gpu: str = Field(max_length=40)
    gpu_count: int  # per node
    market: str = Field(max_length=10)
    price_micros_per_hour: int = _micros()  # the whole gang's: nodes x the instance's price
    instance_id: str | None = Field(default=None, max_length=100)  # node 0's
    # A gang (multi-node attempt): ``nodes`` identical instances in one zone, each in
    # ``attempt_node``; node 0's agent reports where the program's rendezvous listens.
    nodes: int = Field(default=1, sa_column_kwargs={"server_default": "1"})
    master_addr: str | None = Field(default=None, max_length=100)
    master_port: int | None = None
    status: str = Field(max_length=20, index=True)  # launching | running | ended
    token_hash: str = Field(max_length=64)
    work_at_start: float = 0.0
    work_done: float = 0.0
    started_at: datetime | None = _ts(nullable=True)
    ended_at: datetime | None = _ts(nullable=True)
    end_reason: str | None = Field(default=None, max_length=20)
    billed_seconds: float = 0.0
    cost_micros: int = _micros()
    # Spend is granted up to here (broker clock): booking stops at it, the beat's lease sweep
    # renews it within the job's money, and an attempt whose lease lapses is stopped.
    lease_until: datetime | None = _ts(nullable=True, index=True)
    # The agent's last accepted call (broker clock): an agent silent for too long is lost.
    last_heard_at: datetime | None = _ts(nullable=True)
    # The beat tick (its broker time) whose observation claimed this attempt: a batch of a
    # tick observes only the attempts it claims, so two workers never observe one twice.
    observed_tick: datetime | None = _ts(nullable=True)
    exit_code: int | None = None  # the training program's, as its agent reported it
    # The program's output stored so far (bytes, with the truncation line) and in how many
    # chunks: the next chunk's number and the log limit's count.
    log_bytes: int = Field(
        default=0, sa_column=Column(BigInteger, nullable=False, server_default="0")
    )
    log_chunks: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    created_at: datetime = _ts()


class AttemptNode(SQLModel, table=True):
    """One instance of a gang attempt (``Attempt.nodes > 1``): its rank and cloud id.

    Rank 0's instance id is also ``Attempt.instance_id``. A row is written as each node's
    launch returns, so a partial gang's instances are known and terminated.
    """

    __tablename__ = "attempt_node"

    attempt_id: str = Field(foreign_key="attempt.id", primary_key=True, max_length=40)
    rank: int = Field(primary_key=True)
    instance_id: str | None = Field(default=None, max_length=100)
    created_at: datetime = _ts()


class Checkpoint(SQLModel, table=True):
    """A checkpoint the training side saved: the work it holds and where it lies."""

    id: str = Field(primary_key=True, max_length=40)
    job_id: str = Field(foreign_key="job.id", index=True, max_length=40)
    attempt_id: str | None = Field(default=None, foreign_key="attempt.id", max_length=40)
    work_done: float
    object_key: str = Field(max_length=500)
    created_at: datetime = _ts()


class LedgerEntry(SQLModel, table=True):
    """One movement of money: a reservation, its release, or spend."""

    __tablename__ = "ledger_entry"
    __table_args__ = (Index("ix_ledger_team_kind_created", "team_id", "kind", "created_at"),)

    id: int | None = Field(default=None, primary_key=True)
    team_id: str = Field(foreign_key="team.id", max_length=40)
    job_id: str | None = Field(default=None, foreign_key="job.id", index=True, max_length=40)
    attempt_id: str | None = Field(default=None, foreign_key="attempt.id", max_length=40)
    kind: str = Field(max_length=10)  # reserve | release | spend
    amount_micros: int = _micros()
    created_at: datetime = _ts()


class ThroughputCorrection(SQLModel, table=True):
    """A learned factor on the throughput model's speed for one (model, GPU type)."""

    __tablename__ = "throughput_correction"

    model: str = Field(primary_key=True, max_length=60)
    gpu: str = Field(primary_key=True, max_length=40)
    factor: float = 1.0
    observations: int = 0
    updated_at: datetime = _ts()


class PriceSnapshot(SQLModel, table=True):
    """One price refresh: where prices came from, when, and whether it worked."""

    __tablename__ = "price_snapshot"

    id: int | None = Field(default=None, primary_key=True)
    source: str = Field(max_length=40)
    taken_at: datetime = _ts(index=True)
    offers: int = 0
    error: str | None = Field(default=None, max_length=1000)


class PriceRecord(SQLModel, table=True):
    """One price a cloud's pricing API gave: the history every process plans on.

    Each refresh appends the prices it observed; the newest row per (provider, zone,
    instance type, gpu, market) is the current price. ``micros_per_hour`` is -1 where the cloud
    no longer offers that market. The highest ``id`` is the version a process compares to
    notice a refresh.
    """

    __tablename__ = "price_observation"
    __table_args__ = (
        Index(
            "ix_price_observation_key", "provider", "zone", "instance_type", "gpu", "market", "id"
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    provider: str = Field(max_length=20)
    region: str = Field(max_length=40)
    zone: str = Field(max_length=40)
    instance_type: str = Field(max_length=60)
    gpu: str = Field(default="", max_length=40)  # where the type alone doesn't say (GCP N1)
    market: str = Field(max_length=10)  # spot | on_demand
    micros_per_hour: int = _micros()
    observed_at: datetime = _ts(index=True)
    source: str = Field(max_length=40)


class SpotModelRow(SQLModel, table=True):
    """The spot model of one (provider, zone, instance family), shared by every process.

    The runs it is fitted on, in hours, oldest first: the prior's (a sample of the bundled
    traces, ``prior_runs`` of them) then those the broker's attempts saw; at most the newest
    ``broker.core.spot_model.MAX_RUNS`` of each kind, so a row stays a few KB. The rates are
    those of the chain the policy fits on these runs. ``fitted_at`` moves only when the fit
    changed; its maximum is the version processes compare.
    """

    __tablename__ = "spot_model"

    provider: str = Field(primary_key=True, max_length=20)
    zone: str = Field(primary_key=True, max_length=40)
    family: str = Field(primary_key=True, max_length=40)
    up_runs: list[float] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    down_runs: list[float] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    last_available: bool = False  # the current state, as the attempts last saw it
    age_hours: float = 0.0  # how long the current state has lasted (0: not seen)
    prior: str = Field(max_length=500)  # "fleet" or the trace names the prior came from
    prior_runs: int = 0  # of the runs above, how many are the prior's (windows + outages)
    observations: int = 0  # spot attempts read (launched or refused)
    preemptions_per_hour: float = 0.0  # per hour on spot
    mean_window_hours: float = 0.0
    mean_outage_hours: float = 0.0
    fitted_at: datetime = _ts(index=True)
