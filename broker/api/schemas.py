"""Request and response bodies of the REST API (money as decimal strings, aware times)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field

from broker.services.job_spec import Money, Name

ID_PATTERN = r"^[A-Za-z0-9_\-]+$"
ResourceId = Annotated[str, Path(min_length=1, max_length=64, pattern=ID_PATTERN)]
"""An id in a path (``job_0190a1b2...``); anything else is a 422, never a database error."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BudgetIn(Strict):
    limit: Money
    period: Literal["month", "total"] = "month"
    alert_at: float = Field(default=0.8, ge=0, le=1)


class BudgetPatch(Strict):
    limit: Money | None = None
    period: Literal["month", "total"] | None = None
    alert_at: float | None = Field(default=None, ge=0, le=1)


class TeamIn(Strict):
    name: Name
    budget: BudgetIn


class TeamPatch(Strict):
    budget: BudgetPatch


class KeyIn(Strict):
    name: Name


class BudgetOut(BaseModel):
    limit: str
    period: str
    period_start: datetime | None
    spent: str
    reserved: str
    available: str
    alert: bool
    alert_at: float


class TeamOut(BaseModel):
    id: str
    name: str
    budget: BudgetOut
    created_at: datetime


class KeyCreated(BaseModel):
    id: str
    name: str
    token: str
    prefix: str


class PlanOut(BaseModel):
    provider: str
    region: str
    zone: str
    instance_type: str
    gpu: str
    gpu_count: int  # per machine
    nodes: int = 1  # machines (a gang when > 1), all of instance_type in zone
    total_gpus: int  # nodes x gpu_count
    market: str
    price_per_hour: str  # the whole gang's
    expected_hours: float
    expected_cost: str
    worst_case_cost: str
    p_deadline: float
    price_observed_at: datetime | None = None  # None: the bundled snapshot's price
    price_source: str = "bundled"


class PriceOut(BaseModel):
    provider: str
    region: str
    zone: str
    instance_type: str
    gpu: str
    gpu_count: int
    market: str
    price_per_hour: str
    observed_at: datetime | None  # None: the bundled snapshot's price
    source: str


class PricePage(BaseModel):
    items: list[PriceOut]
    total: int
    next_offset: int | None


class AttemptOut(BaseModel):
    id: str
    provider: str
    region: str
    zone: str
    instance_type: str
    gpu: str
    gpu_count: int  # per machine
    nodes: int = 1  # machines of a gang attempt
    market: str
    price_per_hour: str  # the whole gang's
    instance_id: str | None  # node 0's for a gang
    status: str
    started_at: datetime | None
    ended_at: datetime | None
    end_reason: str | None
    billed_seconds: float
    cost: str
    work_done: float
    exit_code: int | None = None


class CheckpointOut(BaseModel):
    id: str
    attempt_id: str | None
    work_done: float
    object_key: str
    created_at: datetime


class ProgressOut(BaseModel):
    work_done: float
    checkpointed_work: float
    total_work: float
    fraction: float


class JobOut(BaseModel):
    id: str
    name: str
    status: str
    status_reason: str | None
    spec: dict[str, Any]
    plan: PlanOut | None
    attempts: list[AttemptOut]
    checkpoints: list[CheckpointOut]
    spent: str
    reserved: str
    max_cost: str
    deadline: datetime
    progress: ProgressOut
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    completed_at: datetime | None
    deadline_met: bool | None
    on_demand_only_cost: str | None
    saved_vs_on_demand: str | None


class JobSummary(BaseModel):
    id: str
    name: str
    status: str
    market: str
    plan: PlanOut | None
    max_cost: str
    deadline: datetime
    progress: ProgressOut
    created_at: datetime
    finished_at: datetime | None
    completed_at: datetime | None
    deadline_met: bool | None


class JobPage(BaseModel):
    items: list[JobSummary]
    next_cursor: str | None


class SpendRow(BaseModel):
    key: str
    amount: str


class SpendOut(BaseModel):
    rows: list[SpendRow]
    total: str
