"""The job spec of API.md as validated pydantic models (unknown fields are rejected)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PlainSerializer,
    PlainValidator,
    Tag,
    TypeAdapter,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)

from broker.core.gangs import MAX_TOTAL_GPUS
from broker.core.node_scaling import MAX_NODES
from broker.core.timespan import SPAN_PATTERN, is_span, parse_span


def _money_in(value: Any) -> Any:
    if isinstance(value, float):
        raise ValueError('money must be a decimal string such as "12.50", not a JSON number')
    return value


Money = Annotated[
    Decimal,
    BeforeValidator(_money_in),
    Field(ge=0, le=Decimal("10000000"), max_digits=14, decimal_places=6),
    PlainSerializer(lambda v: str(v), return_type=str),
    # Pydantic's own schema for a constrained Decimal says "number or any string" and leaks
    # the bounds as unknown keywords; state what is accepted instead.
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^(10000000(\.0{1,6})?|\d{1,7}(\.\d{1,6})?)$"},
                {"type": "integer", "minimum": 0, "maximum": 10_000_000},
            ],
            "examples": ["12.50"],
        }
    ),
]
"""USD as a decimal string ("12.50"); at most 6 decimals, at most 10 million."""


def _utc_representable(value: datetime) -> datetime:
    # An offset can move a time at either end of the calendar out of range once it is
    # turned into UTC, as the database and the planner do.
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise ValueError("time is out of range once converted to UTC") from None
    return value


Time = Annotated[AwareDatetime, AfterValidator(_utc_representable)]
"""An ISO 8601 time with an offset (naive times are rejected) that UTC can represent."""

_TIME: TypeAdapter[datetime] = TypeAdapter(Time)
MAX_SPAN = timedelta(days=3653)
"""Longer relative deadlines are refused outright (admission refuses beyond a year anyway);
the bound keeps "now + span" inside the calendar."""


def _deadline_in(value: Any) -> datetime | str:
    # A span is kept as written, so that a retried submission hashes the same; admission
    # resolves it against the broker's clock (JobSpec.resolved).
    if isinstance(value, str) and is_span(value):
        if len(value) > 64:
            raise ValueError("a time span has at most 64 characters")
        if parse_span(value) > MAX_SPAN:
            raise ValueError(f"{value!r} is more than ten years ahead")
        return value
    return _TIME.validate_python(value)


Deadline = Annotated[
    datetime | str,
    PlainValidator(_deadline_in),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "format": "date-time"},
                {"type": "string", "pattern": SPAN_PATTERN, "maxLength": 64},
            ],
            "examples": ["2026-12-05T12:00:00Z", "+12h"],
        }
    ),
]
"""An ISO 8601 time with an offset, or a span (``+8h``, ``+1d12h``) from the broker's clock
at admission, kept as written until JobSpec.resolved."""

Name = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][\w .\-]*$")]
PRINTABLE = r"^[^\x00-\x1f\x7f]+$"
"""No control characters: PostgreSQL text and JSON cannot hold NUL, and none belongs in a
name, a key or a label."""

Short = Annotated[str, Field(min_length=1, max_length=40, pattern=PRINTABLE)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelWorkload(Strict):
    """A model the throughput model knows, trained for ``steps`` iterations."""

    model: Short
    batch_size: int | None = Field(default=None, ge=1, le=1_000_000)
    steps: int = Field(ge=1, le=10**12)


class ReferenceWorkload(Strict):
    """Work given as GPU-hours on a reference GPU."""

    reference_gpu_hours: float = Field(gt=0, le=1_000_000)
    reference_gpu: Short = "V100"


class Resources(Strict):
    """GPU constraints; lists restrict, absence allows all. ``gpus`` is GPUs per machine
    when ``nodes`` is given, else in all (more than one machine holds: the planner splits
    them over identical machines, ``broker.core.gangs``)."""

    gpus: int = Field(ge=1, le=MAX_TOTAL_GPUS)
    nodes: int | None = Field(default=None, ge=1, le=MAX_NODES)
    gpu_types: list[Short] | None = Field(default=None, max_length=50)
    min_gpu_memory_gb: float | None = Field(default=None, ge=0, le=1024)
    providers: list[Literal["aws", "gcp"]] | None = Field(default=None, max_length=10)
    regions: list[Short] | None = Field(default=None, max_length=100)
    vcpus_per_gpu: float | None = Field(default=None, ge=0, le=512)
    ram_gb_per_gpu: float | None = Field(default=None, ge=0, le=4096)

    @field_validator("nodes")
    @classmethod
    def _gang_size(cls, nodes: int | None, info: ValidationInfo) -> int | None:
        gpus = info.data.get("gpus")
        if nodes is not None and gpus is not None and nodes * gpus > MAX_TOTAL_GPUS:
            raise ValueError(
                f"{nodes} nodes x {gpus} GPUs each is {nodes * gpus} GPUs; a job may have at "
                f"most {MAX_TOTAL_GPUS} GPUs in all"
            )
        return nodes


class CheckpointSpec(Strict):
    interval_minutes: float = Field(default=30, gt=0, le=24 * 60)
    size_gb: float = Field(default=5, ge=0, le=10_000)


def _no_nul(value: str) -> str:
    # PostgreSQL text and JSON cannot hold NUL, and no shell command or variable can either.
    if "\x00" in value:
        raise ValueError("must not contain a NUL character")
    return value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


# Docker's image reference grammar (github.com/distribution/reference, regexp.go):
# [host[:port]/]path[:tag][@digest], the path lower case.
_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
IMAGE_PATTERN = (
    rf"^(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
"""A docker image reference: ``pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime``,
``ghcr.io/org/trainer@sha256:<hex>``, ``registry:5000/team/img:tag@sha256:<hex>``."""
_IMAGE = re.compile(IMAGE_PATTERN, re.ASCII)


def _image(value: str) -> str:
    if not _IMAGE.fullmatch(value):
        raise ValueError(
            f"{value[:80]!r} is not a docker image reference "
            "([registry[:port]/]name[:tag][@sha256:digest], the name in lower case)"
        )
    return value


ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
_ENV_NAME = re.compile(ENV_NAME_PATTERN)
RESERVED_ENV_PREFIX = "BROKER_"
"""The agent sets these for the program (BROKER_JOB_ID, BROKER_CHECKPOINT_DIR, ...)."""


def _env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise ValueError(f"{value[:80]!r} is not a variable name (letters, digits, _)")
    if value.startswith(RESERVED_ENV_PREFIX):
        raise ValueError(f"{value!r}: names starting with {RESERVED_ENV_PREFIX} are the broker's")
    return value


S3_URI_PATTERN = r"^s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])/(.+)$"
_S3_URI = re.compile(S3_URI_PATTERN, re.DOTALL)
_HTTPS_URL = re.compile(r"^https://[^\s/?#@]+(?:[/?#]\S*)?$")


def _workdir(value: str) -> str:
    s3 = _S3_URI.fullmatch(value)
    if s3:
        if not s3.group(2).isprintable():
            raise ValueError("the object key must not contain control characters")
        return value
    if _HTTPS_URL.fullmatch(value) and value.isprintable():
        return value
    raise ValueError(
        "must be s3://<bucket>/<key> (a tar.gz; POST /v1/workdirs uploads one) "
        "or an https:// URL of a tar.gz"
    )


def parse_s3_uri(uri: str) -> tuple[str, str] | None:
    """(bucket, key) of an ``s3://bucket/key`` URI, None for anything else."""
    match = _S3_URI.fullmatch(uri)
    return (match.group(1), match.group(2)) if match else None


Command = Annotated[
    str, Field(min_length=1, max_length=10_000), AfterValidator(_no_nul), AfterValidator(_not_blank)
]
Script = Annotated[str, Field(max_length=16_384), AfterValidator(_no_nul)]
Image = Annotated[str, Field(min_length=1, max_length=255), AfterValidator(_image)]
EnvName = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_env_name)]
EnvValue = Annotated[str, Field(max_length=4096), AfterValidator(_no_nul)]
Workdir = Annotated[str, Field(min_length=1, max_length=2048), AfterValidator(_workdir)]


class RunSpec(Strict):
    """The program a job runs on its instances: ``setup`` then ``command`` (bash), in
    ``image`` if given, with ``env``, in the unpacked ``workdir`` tar.gz."""

    command: Command
    setup: Script | None = None
    image: Image | None = None
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, max_length=64)
    workdir: Workdir | None = None


def _workload_kind(value: Any) -> str:
    # Pick the variant by its keys so that errors name the fields of the right one.
    if isinstance(value, dict):
        return "reference" if "reference_gpu_hours" in value else "model"
    return "reference" if isinstance(value, ReferenceWorkload) else "model"


class JobSpec(Strict):
    """What a team quotes (and submits): work, resources, deadline, max cost; ``run``, the
    program, is optional here (a quote ignores it) and required in a JobSubmission."""

    name: Name
    workload: Annotated[
        Annotated[ModelWorkload, Tag("model")] | Annotated[ReferenceWorkload, Tag("reference")],
        Discriminator(_workload_kind),
    ]
    resources: Resources
    deadline: Deadline
    max_cost: Money
    market: Literal["auto", "spot", "on_demand"] = "auto"
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    priority: int = Field(default=0, ge=0, le=100)
    run: RunSpec | None = None
    max_restarts_on_errors: int = Field(default=0, ge=0, le=10)

    @property
    def total_work(self) -> float:
        """Steps for a model workload, reference GPU-hours otherwise."""
        if isinstance(self.workload, ModelWorkload):
            return float(self.workload.steps)
        return float(self.workload.reference_gpu_hours)

    @property
    def deadline_at(self) -> datetime:
        """The deadline as a time; a spec still holding a span must be resolved first."""
        if not isinstance(self.deadline, datetime):
            raise TypeError(f"deadline {self.deadline!r} is relative: call resolved(now) first")
        return self.deadline

    def resolved(self, now: datetime) -> JobSpec:
        """This spec with its deadline absolute: a span (``+12h``) becomes ``now`` plus it."""
        if isinstance(self.deadline, datetime):
            return self
        return self.model_copy(update={"deadline": now + parse_span(self.deadline)})


class JobSubmission(JobSpec):
    """A job spec as ``POST /v1/jobs`` takes it: the program to ``run`` is required."""

    run: RunSpec
