"""A job spec in a YAML file, read as the JSON body of ``POST /v1/jobs`` and ``/v1/quotes``."""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import typer
import yaml

from broker.cli.output import fail
from broker.core.timespan import is_span, parse_span

SPEC_HELP = (
    "YAML job spec with the fields of POST /v1/jobs (name, workload, resources, deadline, "
    "max_cost, run: {command, setup, image, env, workdir}, ...). deadline: an ISO time with "
    "an offset, or a span the broker counts from its clock when it admits the job (so a "
    "scaled demo clock is honoured, and a retry with the same --idempotency-key is the same "
    "job) as +8h, +90m, +2d or +1d12h; max_cost may be a number or a string."
)
JOB_FILE = typer.Argument(..., exists=True, dir_okay=False, readable=True, help=SPEC_HELP)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, date):  # YAML reads unquoted timestamps as datetimes
        return value.isoformat()
    return value


def load_spec(path: Path) -> dict[str, Any]:
    """The job spec in a YAML file as the API's JSON body. A relative deadline (``+12h``) is
    checked here and sent as written: the broker resolves it at admission."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        fail(f"cannot read {path}: {error.strerror or error}")
    except yaml.YAMLError as error:
        fail(f"{path} is not valid YAML: {' '.join(str(error).split())}")
    if not isinstance(data, dict):
        fail(f"{path} must be a mapping of job spec fields (name, workload, resources, ...)")
    deadline = data.get("deadline")
    if isinstance(deadline, str) and is_span(deadline):
        try:
            parse_span(deadline)
        except ValueError:
            fail(f"deadline {deadline!r} in {path}: use an ISO time or a span like +8h, +2d")
    cost = data.get("max_cost")
    if isinstance(cost, int | float) and not isinstance(cost, bool):
        data["max_cost"] = str(Decimal(repr(cost)))  # the API takes money as strings only
    return dict(_jsonable(data))
