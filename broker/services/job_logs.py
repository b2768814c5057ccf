"""A job's program output as its team reads it: the log chunks its agents stored, in order.

Each attempt's log is the concatenation of its chunk objects
``jobs/{job_id}/logs/{attempt_id}/{seq:06d}.log`` (``agent_channel.store_log`` writes them).
A whole job's log is every attempt's in order, each after a ``tail``-style header line
``==> attempt <id> (<zone>, <market>) <==``; ``tail=N`` keeps each attempt's last N lines.
A gang's node ``k`` >= 1 keeps its own chunks under ``node{k}/`` (one chunk sequence for the
gang, so a node's numbers have gaps); node 0's log is where a single node's is, and reading
``node=k`` shows each attempt's node ``k`` (headers ``==> attempt <id> node k (...) <==``).
Following a log polls for new chunks until the job (or the attempt) has finished and its
last chunks are read, or ``log_follow_seconds`` passed.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sqlmodel import Session, col, select

from broker.core.checkpoint_keys import checkpoint_prefix
from broker.core.errors import NotFound
from broker.core.job_status import is_terminal
from broker.db.engine import open_session
from broker.db.models import Attempt
from broker.services.job_views import get_job
from broker.services.lifecycle import ENDED
from providers.base import ProviderError
from providers.storage import S3CheckpointStore

_CHUNK = re.compile(r"(?:node(\d+)/)?(\d{6,})\.log")
FOLLOW_POLL_SECONDS = 1.0
"""Wall seconds between two looks for new chunks while following a log."""
SETTLE_POLLS = 5
"""Polls a finished job's follower waits for chunks its attempts counted but that are not
stored yet (a chunk is counted, then written)."""


@dataclass(frozen=True)
class AttemptLog:
    """What reading an attempt's log needs to know of it."""

    id: str
    zone: str
    market: str
    chunks: int  # chunks the broker accepted, all nodes' (some may still be on their way)
    ended: bool
    node: int = 0  # whose log is read: a gang's node rank

    @property
    def header(self) -> str:
        node = f" node {self.node}" if self.node else ""
        return f"==> attempt {self.id}{node} ({self.zone}, {self.market}) <==\n"


@dataclass(frozen=True)
class LogState:
    """A job's attempts (oldest first, or the one asked for) and whether it has finished."""

    finished: bool
    attempts: list[AttemptLog]


def log_prefix(job_id: str, attempt_id: str) -> str:
    """The folder of an attempt's log chunks."""
    return f"{checkpoint_prefix(job_id)}logs/{attempt_id}/"


def log_state(
    session: Session, team_id: str, job_id: str, attempt_id: str | None = None, node: int = 0
) -> LogState:
    """The team's job's attempts whose logs to read (only ``attempt_id`` when given; for
    ``node`` >= 1 only the gangs with that node) and whether the job has finished; NotFound
    for another team's job, an unknown attempt or one without node ``node``. Ends the read
    transaction, so no lock is held while the store is read."""
    job = get_job(session, team_id, job_id)
    query = select(Attempt).where(Attempt.job_id == job.id)
    if attempt_id is not None:
        query = query.where(Attempt.id == attempt_id)
    rows = session.exec(query.order_by(col(Attempt.created_at), col(Attempt.id))).all()
    if attempt_id is not None and not rows:
        raise NotFound(f"attempt {attempt_id} of job {job_id} not found")
    if attempt_id is not None and node >= max(rows[0].nodes, 1):
        raise NotFound(f"attempt {attempt_id} of job {job_id} has no node {node}")
    state = LogState(
        finished=is_terminal(job.status),
        attempts=[
            AttemptLog(a.id, a.zone, a.market, a.log_chunks, a.status == ENDED, node)
            for a in rows
            if node < max(a.nodes, 1)
        ],
    )
    session.rollback()
    return state


def stored_chunks(store: S3CheckpointStore, job_id: str, attempt_id: str) -> dict[int, list[str]]:
    """The keys of an attempt's stored log chunks by node, each node's in order."""
    prefix = log_prefix(job_id, attempt_id)
    numbered: dict[int, list[tuple[int, str]]] = {}
    for key in store.list_keys(prefix):
        match = _CHUNK.fullmatch(key[len(prefix) :])
        if match:
            node = int(match.group(1) or 0)
            numbered.setdefault(node, []).append((int(match.group(2)), key))
    return {node: [key for _, key in sorted(keys)] for node, keys in numbered.items()}


def chunk_keys(store: S3CheckpointStore, job_id: str, attempt_id: str, node: int = 0) -> list[str]:
    """The keys of an attempt's (node ``node``'s) stored log chunks, in order."""
    return stored_chunks(store, job_id, attempt_id).get(node, [])


def read_chunks(store: S3CheckpointStore, keys: list[str]) -> str:
    """The chunks' text, concatenated (the agent route stored each as UTF-8)."""
    return "".join(store.get(key).decode("utf-8", "replace") for key in keys)


def last_lines(text: str, lines: int | None) -> str:
    """The last ``lines`` lines of ``text`` (all of it for None)."""
    if lines is None:
        return text
    return "".join(text.splitlines(keepends=True)[-lines:]) if lines > 0 else ""


def _read_tail(store: S3CheckpointStore, keys: list[str], lines: int | None) -> str:
    """The last ``lines`` lines of the chunks (all for None), reading from the last chunk
    back only as far as needed."""
    if lines is None:
        return read_chunks(store, keys)
    text = ""
    for key in reversed(keys):
        text = store.get(key).decode("utf-8", "replace") + text
        if text.count("\n") > lines:  # the first line may be cut: one more than asked
            break
    return last_lines(text, lines)


def _attempt_text(
    store: S3CheckpointStore, job_id: str, attempt: AttemptLog, lines: int | None = None
) -> tuple[str, set[str], int]:
    """An attempt's (node's) log (its last ``lines`` lines), the keys of its chunks and how
    many chunks all its nodes have stored."""
    if attempt.chunks == 0:  # nothing was ever sent: no need to ask the store
        return "", set(), 0
    stored = stored_chunks(store, job_id, attempt.id)
    keys = stored.get(attempt.node, [])
    return _read_tail(store, keys, lines), set(keys), sum(map(len, stored.values()))


def job_log(
    session: Session,
    store: S3CheckpointStore,
    team_id: str,
    job_id: str,
    attempt_id: str | None = None,
    tail: int | None = None,
    node: int = 0,
) -> str:
    """One attempt's log, or every attempt's after its header line; ``tail``: each
    attempt's last lines only; ``node``: a gang node's (0: a single node's, or node 0's).
    NotFound for another team's job; ProviderError when the store does not answer."""
    state = log_state(session, team_id, job_id, attempt_id, node)
    return "".join(_initial(store, state, job_id, tail, attempt_id is None, {}, {}))


def _initial(
    store: S3CheckpointStore,
    state: LogState,
    job_id: str,
    tail: int | None,
    headers: bool,
    seen: dict[str, set[str]],
    stored: dict[str, int],
) -> Iterator[str]:
    """Each attempt's log so far (its last ``tail`` lines), after its header if ``headers``;
    the keys read go to ``seen``, the count of all its nodes' stored chunks to ``stored``."""
    for attempt in state.attempts:
        text, seen[attempt.id], stored[attempt.id] = _attempt_text(store, job_id, attempt, tail)
        if headers:
            yield attempt.header
            if text and not text.endswith("\n"):
                text += "\n"  # the next header starts a line of its own
        yield text


def latest_log(
    session: Session, store: S3CheckpointStore, job_id: str, lines: int
) -> tuple[AttemptLog, str] | None:
    """The latest attempt of a job that has sent output, with the last ``lines`` lines of
    its log; None when no attempt has (the dashboard's job page: the caller checked that the
    viewer may see the job)."""
    row = session.exec(
        select(Attempt)
        .where(Attempt.job_id == job_id, Attempt.log_chunks > 0)
        .order_by(col(Attempt.created_at).desc(), col(Attempt.id).desc())
    ).first()
    if row is None:
        return None
    attempt = AttemptLog(row.id, row.zone, row.market, row.log_chunks, row.status == ENDED)
    text, _, _ = _attempt_text(store, job_id, attempt, lines)
    return attempt, text


def follow_job_log(
    store: S3CheckpointStore,
    team_id: str,
    job_id: str,
    attempt_id: str | None = None,
    tail: int | None = None,
    *,
    node: int = 0,
    max_seconds: float,
    poll_seconds: float = FOLLOW_POLL_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[str]:
    """``job_log``, then each new chunk as it is stored (a new attempt after its header),
    polling every ``poll_seconds``, until the job (or ``attempt_id``) has finished and no
    new chunk came, or ``max_seconds`` (wall) passed. Opens its own sessions: it outlives
    the request's. A store that stops answering ends it with a line saying so."""
    try:
        yield from _follow(
            store,
            team_id,
            job_id,
            attempt_id,
            tail,
            node,
            max_seconds,
            poll_seconds,
            clock,
            sleep,
        )
    except ProviderError as error:
        yield f"\n[broker: the log store did not answer ({error}); stopped following]\n"


def _follow(
    store: S3CheckpointStore,
    team_id: str,
    job_id: str,
    attempt_id: str | None,
    tail: int | None,
    node: int,
    max_seconds: float,
    poll_seconds: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> Iterator[str]:
    started = clock()
    headers = attempt_id is None
    seen: dict[str, set[str]] = {}
    stored: dict[str, int] = {}  # all nodes' chunks stored, per attempt
    with open_session() as session:
        state = log_state(session, team_id, job_id, attempt_id, node)
    yield from _initial(store, state, job_id, tail, headers, seen, stored)
    current = state.attempts[-1].id if state.attempts else None
    at_line_start = True  # _initial ended every attempt's text with a newline
    settling = 0
    while True:
        left = max_seconds - (clock() - started)
        if left <= 0:
            return
        sleep(min(poll_seconds, left))
        with open_session() as session:
            state = log_state(session, team_id, job_id, attempt_id, node)
        done = state.finished or (attempt_id is not None and state.attempts[0].ended)
        arrived = False
        for attempt in state.attempts:
            new = attempt.id not in seen
            read = seen.setdefault(attempt.id, set())
            # Chunks are counted before they are stored: none can be new when all are stored.
            keys: list[str] = []
            if stored.get(attempt.id, 0) < attempt.chunks:
                listing = stored_chunks(store, job_id, attempt.id)
                stored[attempt.id] = sum(map(len, listing.values()))
                keys = listing.get(node, [])
            fresh = [key for key in keys if key not in read]
            read.update(fresh)
            if headers and (new or (fresh and attempt.id != current)):
                yield ("" if at_line_start else "\n") + attempt.header
                current, at_line_start = attempt.id, True
            if fresh:
                arrived = True
                text = read_chunks(store, fresh)
                at_line_start = text.endswith("\n") or (at_line_start and not text)
                yield text
        if done and not arrived:
            missing = any(stored.get(a.id, 0) < a.chunks for a in state.attempts)
            settling += 1
            if not missing or settling >= SETTLE_POLLS:
                return
