"""``broker jobs``: submit, list, show, cancel and watch jobs and read their logs
(``BROKER_API_TOKEN``: a team key)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from broker.cli.api import connect
from broker.cli.output import (
    console,
    duration,
    fail,
    fields,
    met,
    plan,
    row,
    saving,
    table,
    usd,
    when,
)
from broker.cli.specfile import JOB_FILE, load_spec
from broker.client import BrokerClient, Job, WorkdirTooLarge
from broker.core.job_status import TERMINAL, JobStatus

jobs_app = typer.Typer(
    help="Submit, list, show, cancel and watch jobs and read their logs "
    "(BROKER_API_TOKEN: a team key).",
    no_args_is_help=True,
)
UNFINISHED = [s.value for s in JobStatus if s not in TERMINAL]


def _with_workdir(api: BrokerClient, spec: dict[str, Any], folder: Path) -> None:
    """Pack and upload ``folder``; the spec's ``run.workdir`` becomes its URI."""
    run = spec.get("run")
    if not isinstance(run, dict):
        fail("--workdir needs a run block in the job spec (run: {command: ...})")
    try:
        run["workdir"] = api.upload_workdir(folder)
    except (WorkdirTooLarge, OSError) as error:
        fail(str(error))
    console(stderr=True).print(Text(f"uploaded {folder} as {run['workdir']}"))


@jobs_app.command("submit")
def jobs_submit(
    job_file: Path = JOB_FILE,
    idempotency_key: str | None = typer.Option(
        None, help="Submitting again with the same key and spec returns the same job."
    ),
    workdir: Path | None = typer.Option(
        None,
        exists=True,
        file_okay=False,
        help="Pack this folder (without .git, __pycache__, .venv, *.pyc; at most 64 MiB as "
        "tar.gz), upload it and run the job's program in it (sets run.workdir).",
    ),
) -> None:
    """Submit a job: the broker reserves its worst-case cost and launches the best plan."""
    with connect("team") as api:
        spec = load_spec(job_file)
        if workdir is not None:
            _with_workdir(api, spec, workdir)
        if idempotency_key:
            job, created = api.submit_job_idempotent(spec, idempotency_key)
        else:
            job, created = api.submit_job(spec), True
    out = console()
    if created:
        out.print(Text(f"submitted job {job['id']} ({job['name']})", style="bold"))
    else:
        out.print(Text(f"job {job['id']} was already submitted with this idempotency key"))
    out.print(
        fields(
            ("id", job["id"]),
            ("status", job["status"]),
            ("plan", plan(job["plan"])),
            ("reserved", usd(job["reserved"])),
            ("max cost", usd(job["max_cost"])),
            ("deadline", when(job["deadline"])),
        )
    )


@jobs_app.command("list")
def jobs_list(
    status: str | None = typer.Option(
        None, help=f"Only jobs in this status ({', '.join(JobStatus)})."
    ),
    page_size: int = typer.Option(100, min=1, max=100, help="Jobs fetched per request."),
) -> None:
    """The team's jobs, newest first (every page)."""
    with connect("team") as api:
        jobs = list(api.iter_jobs(status or None, page_size))
    grid = table(
        "id", "name", "status", "done", "plan", "max cost", "deadline", "deadline met", "created"
    )
    for job in jobs:
        row(
            grid,
            job["id"],
            job["name"],
            job["status"],
            f"{job['progress']['fraction']:.1%}",
            plan(job["plan"]),
            usd(job["max_cost"]),
            when(job["deadline"]),
            met(job.get("deadline_met")),
            when(job["created_at"]),
        )
    grid.caption = f"{len(jobs)} job(s)"
    console().print(grid)


@jobs_app.command("show")
def jobs_show(job_id: str = typer.Argument(..., help="Job id.")) -> None:
    """A job's details, its attempts and its checkpoints."""
    with connect("team") as api:
        job = api.get_job(job_id)
    progress = job["progress"]
    checkpoints = job["checkpoints"]
    latest = max(checkpoints, key=lambda c: c["work_done"], default=None)
    out = console()
    out.print(Text(f"job {job['id']} ({job['name']})", style="bold"))
    out.print(
        fields(
            (
                "status",
                job["status"] + (f" ({job['status_reason']})" if job["status_reason"] else ""),
            ),
            ("plan", plan(job["plan"])),
            ("program", (job["spec"].get("run") or {}).get("command") or "-"),
            (
                "progress",
                f"{progress['work_done']:,.0f} / {progress['total_work']:,.0f} "
                f"({progress['fraction']:.1%}), checkpointed {progress['checkpointed_work']:,.0f}",
            ),
            ("spent", usd(job["spent"])),
            ("on-demand", usd(job.get("on_demand_only_cost"))),
            ("saved", saving(job.get("saved_vs_on_demand"), job.get("on_demand_only_cost"))),
            ("reserved", usd(job["reserved"])),
            ("max cost", usd(job["max_cost"])),
            ("deadline", when(job["deadline"]) + f" ({met(job.get('deadline_met'))})"),
            ("created", when(job["created_at"])),
            ("completed", when(job.get("completed_at"))),
            ("finished", when(job["finished_at"])),
            (
                "checkpoints",
                f"{len(checkpoints)}"
                + (
                    f" (latest at {latest['work_done']:,.0f}: {latest['object_key']})"
                    if latest
                    else ""
                ),
            ),
        )
    )
    grid = table(
        "attempt",
        "provider",
        "zone",
        "instance type",
        "nodes",
        "market",
        "$/h",
        "status",
        "started",
        "ended",
        "end reason",
        "work done",
        "cost",
        title="Attempts",
    )
    for a in job["attempts"]:
        row(
            grid,
            a["id"],
            a["provider"],
            a["zone"],
            a["instance_type"],
            a.get("nodes", 1),
            a["market"],
            usd(a["price_per_hour"], 4),
            a["status"],
            when(a["started_at"]),
            when(a["ended_at"]),
            a["end_reason"] or "-",
            f"{a['work_done']:,.0f}",
            usd(a["cost"]),
        )
    out.print(grid if job["attempts"] else Text("no attempts yet"))


@jobs_app.command("logs")
def jobs_logs(
    job_id: str = typer.Argument(..., help="Job id."),
    attempt: str | None = typer.Option(None, help="Only this attempt's log."),
    tail: int | None = typer.Option(
        None, min=1, max=10_000, help="Only the last N lines (of each attempt's log)."
    ),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Keep printing new output until the job has finished."
    ),
    node: int | None = typer.Option(
        None, min=0, help="A multi-node job's node (its rank): that node's output (default 0)."
    ),
) -> None:
    """The job's program output, every attempt's after a line ``==> attempt <id> (<zone>,
    <market>) <==`` (or one --attempt's; one --node's of a multi-node job)."""
    with connect("team") as api:
        if not follow:
            sys.stdout.write(api.logs(job_id, attempt, tail, node))
            sys.stdout.flush()
            return
        try:
            for piece in api.follow_logs(job_id, attempt, tail, node):
                sys.stdout.write(piece)
                sys.stdout.flush()
        except KeyboardInterrupt:
            raise typer.Exit(130) from None


@jobs_app.command("cancel")
def jobs_cancel(job_id: str = typer.Argument(..., help="Job id.")) -> None:
    """Cancel a job: its instances are terminated and its spend settled."""
    with connect("team") as api:
        job = api.cancel_job(job_id)
    console().print(
        Text(f"job {job['id']} ({job['name']}): {job['status']}, spent {usd(job['spent'])}")
    )


class _Eta:
    """Time left from the work rate seen since the watch began (reset when work goes back)."""

    def __init__(self) -> None:
        self.first: tuple[float, float] | None = None

    def __call__(self, moment: float, done: float, total: float) -> str:
        if self.first is None or done < self.first[1]:
            self.first = (moment, done)
        started, done_then = self.first
        if moment <= started or done <= done_then:
            return "-"
        rate = (done - done_then) / (moment - started)
        return duration((total - done) / rate)


def _watch_table(jobs: list[Job], etas: dict[str, _Eta], moment: float) -> Table:
    grid = table("job", "name", "status", "progress", "work done", "spent", "ETA", "deadline")
    for job in jobs:
        p = job["progress"]
        total = p["total_work"] or 1.0
        done = min(p["work_done"], total)
        eta = "-" if job["status"] in TERMINAL else etas[job["id"]](moment, done, total)
        row(
            grid,
            job["id"],
            job["name"],
            job["status"],
            ProgressBar(total=total, completed=done, width=30),
            f"{done:,.0f} / {total:,.0f}",
            usd(job["spent"]),
            eta,
            met(job.get("deadline_met")),
        )
    return grid


@jobs_app.command("watch")
def jobs_watch(
    job_ids: list[str] | None = typer.Argument(None, help="Job ids; default: unfinished jobs."),
    interval: float = typer.Option(2.0, min=0.05, help="Seconds between refreshes."),
) -> None:
    """Live progress of jobs until every one is finished (succeeded, failed, cancelled,
    budget_exhausted or deadline_missed). ETA from the work rate seen while watching."""
    out = console()
    with connect("team") as api:
        ids = list(job_ids or [])
        if not ids:
            ids = [j["id"] for s in UNFINISHED for j in api.iter_jobs(s)]
            if not ids:
                out.print("no unfinished jobs to watch")
                return
        etas = {job_id: _Eta() for job_id in ids}
        try:
            with Live(console=out, auto_refresh=False) as live:
                while True:
                    jobs = [api.get_job(job_id) for job_id in ids]
                    live.update(_watch_table(jobs, etas, time.monotonic()), refresh=True)
                    if all(job["status"] in TERMINAL for job in jobs):
                        break
                    time.sleep(interval)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
    if not out.is_terminal:
        out.line()  # Live ends its last frame with a newline only on a terminal
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job["status"]] = counts.get(job["status"], 0) + 1
    on_time = sum(1 for job in jobs if job.get("deadline_met"))
    out.print(
        f"all {len(jobs)} finished: "
        + ", ".join(f"{n} {s}" for s, n in counts.items())
        + f"; deadline met by {on_time}"
    )
