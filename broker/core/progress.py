"""How much work an attempt's agent may credibly claim, and what it must show to finish a job.

An instance reports its own progress; the broker believes no more than the attempt could
have done: the work it started from plus its running time at the fastest credible speed
for its GPUs (the caller's throughput prediction times a margin), with a little slack for
the two clocks disagreeing. The broker's clock decides; the agent's is never asked.
"""

from __future__ import annotations

from datetime import datetime

from broker.core.errors import InvalidInput


def credible_work(
    work_at_start: float,
    started_at: datetime | None,
    now: datetime,
    top_speed: float,
    skew_seconds: float,
) -> float:
    """The most work an attempt can have done by ``now``: ``work_at_start`` plus the hours
    since ``started_at`` (none before it runs) and ``skew_seconds`` at ``top_speed`` (work
    per hour, already with its margin)."""
    running = (now - started_at).total_seconds() if started_at is not None else 0.0
    hours = (max(running, 0.0) + max(skew_seconds, 0.0)) / 3600.0
    return work_at_start + max(top_speed, 0.0) * hours


def check_credible(work_done: float, most: float, now: datetime) -> None:
    """InvalidInput naming ``work_done`` when a report claims more than ``most``."""
    if work_done > most:
        raise InvalidInput(
            f"work_done {work_done:.6g} is more than this attempt can have done by "
            f"{now.isoformat()}: at most {most:.6g}",
            "work_done",
        )
