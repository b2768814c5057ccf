"""``BrokerClient``: the typed, synchronous Python client of the REST API (docs/api.md).

The CLI, the demo, the end-to-end tests and the benchmarks all talk to the broker through it.
Answers are the API's JSON, typed as TypedDicts (plain dicts at run time). A refused request
raises :class:`BrokerApiError` with the API's ``code`` and ``message``; no answer at all
raises :class:`BrokerUnreachable`.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from collections.abc import Iterator, Mapping
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal, TypedDict, cast
from urllib.parse import quote as _quote

import httpx

Period = Literal["month", "total"]
GroupBy = Literal["day", "job", "provider"]
Market = Literal["spot", "on_demand"]
Money = str | Decimal | int  # USD: a Decimal is sent as a string, never a float
When = date | str | None  # an aware datetime, or ISO 8601 text with an offset
WORKDIR_LIMIT_BYTES = 64 * 1024 * 1024
"""The broker's default limit of an uploaded workdir (``BROKER_WORKDIR_LIMIT_BYTES``)."""
SKIPPED_DIRS = frozenset({".git", "__pycache__", ".venv"})
SKIPPED_SUFFIXES = (".pyc",)


class Budget(TypedDict):
    limit: str
    period: str
    period_start: str | None
    spent: str
    reserved: str
    available: str
    alert: bool
    alert_at: float


class Team(TypedDict):
    id: str
    name: str
    budget: Budget
    created_at: str


class KeyCreated(TypedDict):
    id: str
    name: str
    token: str  # shown only in this answer
    prefix: str


class _Offer(TypedDict):
    provider: str
    region: str
    zone: str
    instance_type: str
    gpu: str
    gpu_count: int
    market: str
    price_per_hour: str


class Plan(_Offer):
    expected_hours: float
    expected_cost: str
    worst_case_cost: str
    p_deadline: float
    price_observed_at: str | None  # None: the bundled snapshot's price
    price_source: str


class Price(TypedDict):
    """An offer's current price on one market, as ``GET /v1/prices`` lists it."""

    provider: str
    region: str
    zone: str
    instance_type: str
    gpu: str
    gpu_count: int
    market: str
    price_per_hour: str
    observed_at: str | None  # None: the bundled snapshot's price
    source: str


class PricePage(TypedDict):
    items: list[Price]
    total: int
    next_offset: int | None


class Quote(TypedDict):
    plans: list[Plan]
    cheapest_on_demand: Plan | None


class Progress(TypedDict):
    work_done: float
    checkpointed_work: float
    total_work: float
    fraction: float


class Attempt(_Offer):
    id: str
    instance_id: str | None
    status: str
    started_at: str | None
    ended_at: str | None
    end_reason: str | None
    billed_seconds: float
    cost: str
    work_done: float
    exit_code: int | None


class Checkpoint(TypedDict):
    id: str
    attempt_id: str | None
    work_done: float
    object_key: str
    created_at: str


class _JobFields(TypedDict):
    id: str
    name: str
    status: str
    plan: Plan | None
    max_cost: str
    deadline: str
    progress: Progress
    created_at: str
    finished_at: str | None
    completed_at: str | None  # when the work was observed complete
    deadline_met: bool | None  # None while unfinished


class JobSummary(_JobFields):
    """A job as ``GET /v1/jobs`` lists it; :class:`Job` has attempts, checkpoints, spend."""

    market: str


class Job(_JobFields):
    status_reason: str | None
    spec: dict[str, Any]
    attempts: list[Attempt]
    checkpoints: list[Checkpoint]
    spent: str
    reserved: str
    updated_at: str
    on_demand_only_cost: str | None
    saved_vs_on_demand: str | None  # on_demand_only_cost - spent, once finished


class JobPage(TypedDict):
    items: list[JobSummary]
    next_cursor: str | None


class Workdir(TypedDict):
    workdir: str  # s3://<bucket>/workdirs/<team_id>/<sha256>.tar.gz: a spec's run.workdir
    bytes: int


class SpendRow(TypedDict):
    key: str
    amount: str


class Spend(TypedDict):
    rows: list[SpendRow]
    total: str


class BrokerApiError(Exception):
    """The API refused a request: HTTP ``status``, the error's ``code`` and ``message``
    (for a validation error, the fields at fault), and the body's raw ``detail``."""

    def __init__(self, status: int | None, code: str, message: str, detail: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail

    @property
    def fields(self) -> list[str]:
        """The dotted fields a validation error names (``resources.gpus``), else []."""
        if not isinstance(self.detail, list):
            return []
        return [_field(item) for item in self.detail if isinstance(item, dict)]

    def __str__(self) -> str:
        if isinstance(self.detail, dict):
            return f"{self.message} ({self.code}, HTTP {self.status})"
        if self.detail is not None:
            return f"{self.message} (HTTP {self.status})"
        return self.message


class BrokerUnreachable(BrokerApiError):
    """No answer from the broker: ``code`` is ``timeout`` when it was too slow (a write may
    or may not have been applied), ``unreachable`` otherwise (refused, name, TLS)."""

    def __init__(self, message: str, code: str = "unreachable") -> None:
        super().__init__(None, code, message)


def _field(item: dict[str, Any]) -> str:
    loc = [str(part) for part in item.get("loc", [])]
    if loc[:1] == ["body"]:
        loc = loc[1:]
    return ".".join(loc) or "request body"


def api_error(response: httpx.Response) -> BrokerApiError:
    """The error a failed ``response`` stands for, in the API's own words (docs/api.md)."""
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = None
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, dict) and "message" in detail:
        return BrokerApiError(status, str(detail.get("code", "error")), detail["message"], detail)
    if isinstance(detail, list) and detail:
        message = "; ".join(
            f"{_field(i)}: {i.get('msg', 'invalid')}" if isinstance(i, dict) else str(i)
            for i in detail
        )
        return BrokerApiError(status, "invalid", message, detail)
    if isinstance(detail, str):
        return BrokerApiError(status, "error", detail, detail)
    url = response.request.url
    return BrokerApiError(status, "error", f"HTTP {status} {response.reason_phrase} from {url}")


def _jsonable(value: Any) -> Any:
    """``value`` with times as ISO strings and Decimals as strings (money is never a float)."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, date):  # datetimes too
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def _decode(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        status, url = response.status_code, response.request.url
        raise BrokerApiError(
            status, "not_json", f"{url} answered HTTP {status} without JSON"
        ) from None


def _id(value: str) -> str:
    return _quote(value, safe="")


class WorkdirTooLarge(ValueError):
    """A folder packs to more than the broker takes as a workdir."""


def _skipped(name: str, is_dir: bool) -> bool:
    return name in SKIPPED_DIRS if is_dir else name.endswith(SKIPPED_SUFFIXES)


class _Checked:
    """A file whose every read first checks the archive's size so far (a huge file stops
    the packing at the limit, not after it is all compressed)."""

    def __init__(self, data: Any, check: Any) -> None:
        self._data, self._check = data, check

    def read(self, size: int = -1) -> bytes:
        self._check()
        return bytes(self._data.read(size))


def pack_workdir(folder: Path, limit_bytes: int = WORKDIR_LIMIT_BYTES) -> bytes:
    """A folder as a tar.gz (its contents at the archive's top), without ``.git``,
    ``__pycache__``, ``.venv`` and ``*.pyc``; the same files pack to the same bytes.
    WorkdirTooLarge past ``limit_bytes``; NotADirectoryError if ``folder`` is none."""
    root = Path(folder)
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a folder")
    buffer = io.BytesIO()

    def check() -> None:
        if buffer.tell() > limit_bytes:
            raise WorkdirTooLarge(
                f"{root} packs to more than {limit_bytes / 2**20:.3g} MiB, the limit of a "
                "workdir: leave data sets and outputs out of it (fetch them in the job's "
                "setup) or pack a smaller folder"
            )

    # mtime=0 in the gzip header, sorted names, no owners: the same files, the same bytes
    # (and the same object in the broker's bucket).
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as archive,
    ):
        for current, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not _skipped(d, True))
            base = Path(current)
            for name in [*dirs, *sorted(f for f in files if not _skipped(f, False))]:
                path = base / name
                info = archive.gettarinfo(str(path), path.relative_to(root).as_posix())
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if info.isfile():
                    with path.open("rb") as data:
                        archive.addfile(info, _Checked(data, check))
                elif info.isdir() or info.issym():
                    archive.addfile(info)
                check()
    check()
    return buffer.getvalue()


class BrokerClient:
    """The broker's REST API as methods, with a bearer ``token`` (the admin token or a team
    key); ``transport`` replaces httpx's network transport (tests). Close it, or use it as a
    context manager."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        timeout: float = 30.0,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._transport = transport
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            self._http = httpx.Client(
                base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
            )
        except httpx.InvalidURL as error:
            raise ValueError(f"{base_url!r} is not a valid URL: {error}") from None

    def with_token(self, token: str) -> BrokerClient:
        """A new client on the same API with another token (e.g. a team key just created)."""
        return BrokerClient(self.base_url, token, self.timeout, transport=self._transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
    ) -> httpx.Response:
        """A successful response to ``method path``; BrokerApiError (or a subclass) otherwise."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        body = None if json is None else _jsonable(json)
        try:
            response = self._http.request(
                method, path, json=body, params=query or None, headers=headers, content=content
            )
        except httpx.TimeoutException as error:
            message = f"the broker API at {self.base_url} did not answer in time"
            raise BrokerUnreachable(message, "timeout") from error
        except httpx.TransportError as error:
            reason = " ".join(str(error).split()) or type(error).__name__
            raise BrokerUnreachable(
                f"cannot reach the broker API at {self.base_url} ({reason}); is it running?"
            ) from error
        if response.is_error:
            raise api_error(response)
        return response

    def _json(self, method: str, path: str, **options: Any) -> Any:
        return _decode(self.request(method, path, **options))

    def health(self) -> dict[str, Any]:
        """``GET /healthz``: ``status`` ok, or degraded when workers or beat fell silent (see
        docs/api.md); ``time``, the broker's clock (scaled in demos)."""
        return cast(dict[str, Any], self._json("GET", "/healthz"))

    def metrics(self) -> str:
        """``GET /metrics``: Prometheus' text format (each team's money with the admin or
        metrics token only)."""
        return self.request("GET", "/metrics").text

    def create_team(
        self, name: str, limit: Money, period: Period = "month", alert_at: float = 0.8
    ) -> Team:
        """A new team with a budget of ``limit`` USD per ``period``."""
        budget = {"limit": limit, "period": period, "alert_at": alert_at}
        return cast(Team, self._json("POST", "/v1/teams", json={"name": name, "budget": budget}))

    def list_teams(self) -> list[Team]:
        return cast(list[Team], self._json("GET", "/v1/teams"))

    def get_team(self, team_id: str) -> Team:
        return cast(Team, self._json("GET", f"/v1/teams/{_id(team_id)}"))

    def update_budget(
        self,
        team_id: str,
        *,
        limit: Money | None = None,
        period: Period | None = None,
        alert_at: float | None = None,
    ) -> Team:
        """Change what is given of a team's budget."""
        budget = {"limit": limit, "period": period, "alert_at": alert_at}
        body = {"budget": {k: v for k, v in budget.items() if v is not None}}
        return cast(Team, self._json("PATCH", f"/v1/teams/{_id(team_id)}", json=body))

    def create_key(self, team_id: str, name: str) -> KeyCreated:
        """A new key of the team; its ``token`` is in this answer only."""
        path = f"/v1/teams/{_id(team_id)}/keys"
        return cast(KeyCreated, self._json("POST", path, json={"name": name}))

    def revoke_key(self, team_id: str, key_id: str) -> None:
        """Revoke a key; it stops working at once."""
        self.request("DELETE", f"/v1/teams/{_id(team_id)}/keys/{_id(key_id)}")

    def budget(self) -> Budget:
        """The calling team's budget figures."""
        return cast(Budget, self._json("GET", "/v1/budget"))

    def quote(self, spec: Mapping[str, Any]) -> Quote:
        """Ranked plans for a job spec, cheapest expected cost first; launches nothing."""
        return cast(Quote, self._json("POST", "/v1/quotes", json=spec))

    def prices(
        self,
        gpu: str | None = None,
        provider: str | None = None,
        region: str | None = None,
        market: Market | None = None,
        page_size: int = 1000,
    ) -> list[Price]:
        """Every launchable offer's current price on each market (filters case-insensitive),
        cheapest first per GPU type and count, page after page."""
        params: dict[str, Any] = {
            "gpu": gpu,
            "provider": provider,
            "region": region,
            "market": market,
            "limit": page_size,
        }
        prices: list[Price] = []
        offset: int | None = 0
        while offset is not None:
            page = cast(
                PricePage, self._json("GET", "/v1/prices", params={**params, "offset": offset})
            )
            prices.extend(page["items"])
            offset = page["next_offset"]
        return prices

    def submit_job(self, spec: Mapping[str, Any], idempotency_key: str | None = None) -> Job:
        """Submit a job; with ``idempotency_key``, a retry of the same spec is the same job."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return cast(Job, self._json("POST", "/v1/jobs", json=spec, headers=headers))

    def submit_job_idempotent(
        self, spec: Mapping[str, Any], idempotency_key: str
    ) -> tuple[Job, bool]:
        """Submit with ``idempotency_key``; returns the job and whether this call created it
        (False: an earlier submission with the same key and spec)."""
        headers = {"Idempotency-Key": idempotency_key}
        response = self.request("POST", "/v1/jobs", json=spec, headers=headers)
        return cast(Job, _decode(response)), response.status_code == 201

    def list_jobs(
        self, status: str | None = None, limit: int = 20, cursor: str | None = None
    ) -> JobPage:
        """One page of the team's jobs, newest first; pass ``next_cursor`` for the next."""
        params = {"status": status, "limit": limit, "cursor": cursor}
        return cast(JobPage, self._json("GET", "/v1/jobs", params=params))

    def iter_jobs(self, status: str | None = None, page_size: int = 100) -> Iterator[JobSummary]:
        """Every job of the team (in ``status``), newest first, page after page."""
        cursor: str | None = None
        while True:
            page = self.list_jobs(status, page_size, cursor)
            yield from page["items"]
            if not page["next_cursor"] or page["next_cursor"] == cursor:
                return
            cursor = page["next_cursor"]

    def get_job(self, job_id: str) -> Job:
        """A job with its plan, attempts, checkpoints, spend and progress."""
        return cast(Job, self._json("GET", f"/v1/jobs/{_id(job_id)}"))

    def cancel_job(self, job_id: str) -> Job:
        """Cancel a job: its instances are terminated and its spend settled."""
        return cast(Job, self._json("POST", f"/v1/jobs/{_id(job_id)}/cancel"))

    def upload_workdir(self, folder: Path | str, limit_bytes: int = WORKDIR_LIMIT_BYTES) -> str:
        """Pack a folder (``pack_workdir``: no ``.git``, ``__pycache__``, ``.venv``, ``*.pyc``)
        and upload it; returns its ``s3://`` URI for a job spec's ``run.workdir``.
        WorkdirTooLarge when it packs to more than ``limit_bytes``."""
        return self.upload_workdir_archive(pack_workdir(Path(folder), limit_bytes))["workdir"]

    def upload_workdir_archive(self, archive: bytes) -> Workdir:
        """``POST /v1/workdirs``: store a tar.gz as the team's workdir."""
        headers = {"Content-Type": "application/gzip"}
        return cast(Workdir, self._json("POST", "/v1/workdirs", content=archive, headers=headers))

    def logs(
        self,
        job_id: str,
        attempt: str | None = None,
        tail: int | None = None,
        node: int | None = None,
    ) -> str:
        """A job's program output: one ``attempt``'s, or every attempt's after a line
        ``==> attempt <id> (<zone>, <market>) <==``; ``tail``: the last lines of each;
        ``node``: a gang node's (default node 0's)."""
        params = {"attempt": attempt, "tail": tail, "node": node}
        return self.request("GET", f"/v1/jobs/{_id(job_id)}/logs", params=params).text

    def follow_logs(
        self,
        job_id: str,
        attempt: str | None = None,
        tail: int | None = None,
        node: int | None = None,
    ) -> Iterator[str]:
        """``logs``, then the output as it comes, until the job has finished (or the broker's
        ``BROKER_LOG_FOLLOW_SECONDS`` passed): text pieces, not necessarily whole lines."""
        params = {"attempt": attempt, "tail": tail, "node": node, "follow": "true"}
        query = {k: v for k, v in params.items() if v is not None}
        # No read timeout: a job may be silent for long between two lines.
        timeout = httpx.Timeout(self.timeout, read=None)
        path = f"/v1/jobs/{_id(job_id)}/logs"
        try:
            with self._http.stream("GET", path, params=query, timeout=timeout) as response:
                if response.is_error:
                    response.read()
                    raise api_error(response)
                yield from response.iter_text()
        except httpx.TimeoutException as error:
            message = f"the broker API at {self.base_url} did not answer in time"
            raise BrokerUnreachable(message, "timeout") from error
        except httpx.TransportError as error:
            reason = " ".join(str(error).split()) or type(error).__name__
            raise BrokerUnreachable(f"lost the broker API at {self.base_url} ({reason})") from error

    def spend(self, group_by: GroupBy = "day", start: When = None, end: When = None) -> Spend:
        """The team's spend in [start, end) grouped by day, job or provider, with a total."""
        params = {"group_by": group_by, "start": _jsonable(start), "end": _jsonable(end)}
        return cast(Spend, self._json("GET", "/v1/spend", params=params))
