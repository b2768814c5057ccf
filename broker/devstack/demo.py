"""``broker demo``: the whole broker on this machine, about twenty jobs, a live view, a summary.

Everything goes through the REST API, as a team would use it: two teams with budgets, each
uploading the ``examples/`` folder once as its jobs' workdir, submissions (one refused for the
team's budget, one as infeasible; each admitted job carries the on-demand-only cost it is
compared with, booked as spend is), then a live table until every job has finished. Every
job's program is ``examples/train.py``; one exits with code 3 on both of its tries and ends
``failed``. A spot outage in the most used zone at about one simulated hour shows preemptions
and resumption from checkpoints on top of what the replayed real traces do.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

import broker
from broker import clock
from broker.bundled import bundled_throughput_model
from broker.client import BrokerApiError, BrokerClient, BrokerUnreachable
from broker.core.job_status import TERMINAL
from broker.core.throughput import Workload
from broker.devstack import demo_market
from broker.devstack.pacing import cpu_share, starting_scale

EXAMPLES = Path(broker.__file__).resolve().parent.parent / "examples"
"""The folder every demo job runs in (uploaded once per team): ``train.py`` is its program."""
FAILING_EXIT_CODE = 3
PROGRAM_STEPS = 2000
"""Steps of ``train.py`` per job, whatever its workload (each step is that much of the work):
twenty-odd real programs then fit on a small machine beside the broker."""
QUIET_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
"""One numpy thread per program: many small programs share the machine better so."""


@dataclass
class DemoJob:
    """One job the demo submits: its team, spec and what the demo expects of it."""

    team: str
    spec: dict[str, Any]
    expect: str = "accepted"  # accepted | over_budget | infeasible | fails
    id: str | None = None
    refusal: str | None = None
    on_demand_cost: Decimal | None = None
    final: dict[str, Any] = field(default_factory=dict)


def _steps(model: str, batch: int, gpu: str, gpus: int, hours: float, nodes: int = 1) -> int:
    """Steps that take ``hours`` on ``nodes`` machines of ``gpus`` x ``gpu`` by the
    throughput model (across nodes at the model's measured efficiency)."""
    rate = bundled_throughput_model().work_per_hour(
        Workload(model=model, batch_size=batch, steps=1),
        np.array([gpu]),
        np.array([gpus]),
        nodes=np.array([nodes]),
    )[0]
    return max(int(rate * hours), 1)


def demo_jobs(now: datetime) -> list[DemoJob]:
    """Twenty-one varied jobs for two teams (one of them a multi-node gang), plus one over
    budget and one infeasible."""

    def spec(
        name: str,
        workload: dict[str, Any],
        deadline_h: float,
        max_cost: str,
        gpus: int = 1,
        **extra: Any,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": name,
            "workload": workload,
            "resources": {"gpus": gpus, **extra.pop("resources", {})},
            "deadline": (now + timedelta(hours=deadline_h)).isoformat(),
            "max_cost": max_cost,
            "checkpoint": {"interval_minutes": 30, "size_gb": 5},
        }
        body.update(extra)
        return body

    def run(seed: int, *flags: str) -> dict[str, Any]:
        command = ["python train.py", f"--seed {seed}", f"--steps {PROGRAM_STEPS}", *flags]
        return {"command": " ".join(command), "env": dict(QUIET_ENV)}

    def model(
        name: str, batch: int, gpu: str, gpus: int, hours: float, nodes: int = 1
    ) -> dict[str, Any]:
        steps = _steps(name, batch, gpu, gpus, hours, nodes)
        return {"model": name, "batch_size": batch, "steps": steps}

    vision = [
        spec("resnet50-imagenet", model("ResNet-50", 128, "V100", 1, 4), 9, "40.00"),
        spec("resnet50-tight", model("ResNet-50", 128, "V100", 1, 3), 3.8, "40.00"),
        spec("resnet18-cifar", model("ResNet-18", 256, "V100", 1, 2), 6, "20.00"),
        spec("resnet18-2gpu", model("ResNet-18", 256, "V100", 2, 3), 8, "60.00", gpus=2),
        spec("cyclegan-horses", model("CycleGAN", 1, "V100", 1, 3), 10, "30.00"),
        spec(
            "cyclegan-on-demand",
            model("CycleGAN", 1, "V100", 1, 2),
            6,
            "40.00",
            market="on_demand",
        ),
        spec(
            "resnet50-cheap-gpus",
            model("ResNet-50", 64, "T4", 1, 4),
            12,
            "30.00",
            resources={"gpu_types": ["T4", "L4", "A10G"]},
        ),
        spec("a3c-atari", model("A3C", 4, "V100", 1, 2), 5, "20.00", market="spot"),
        spec("ref-hours-v100", {"reference_gpu_hours": 3}, 8, "30.00"),
        spec("resnet50-4gpu", model("ResNet-50", 128, "V100", 4, 3), 7, "150.00", gpus=4),
        # A gang: two machines of 8 V100s in one zone, train.py on each in step with the
        # other through node 0's rendezvous (without ``nodes``, 16 GPUs would let the
        # planner pick any split, up to 16 one-GPU machines: 16 programs on a laptop).
        spec(
            "resnet50-2x8gpu-gang",
            model("ResNet-50", 128, "V100", 8, 1.5, nodes=2),
            8,
            "150.00",
            gpus=8,
            resources={"nodes": 2, "gpu_types": ["V100"]},
        ),
    ]
    nlp = [
        spec("transformer-wmt", model("Transformer", 128, "V100", 1, 4), 9, "40.00"),
        spec("transformer-2gpu", model("Transformer", 128, "V100", 2, 3), 6, "80.00", gpus=2),
        spec("lm-wikitext", model("LM", 20, "V100", 1, 3), 7, "30.00"),
        spec("lm-tight", model("LM", 20, "V100", 1, 2), 2.6, "30.00"),
        spec("recsys-ml20m", model("Recommendation", 8192, "V100", 1, 2), 6, "20.00"),
        spec(
            "transformer-a100",
            model("Transformer", 128, "A100", 1, 3),
            8,
            "60.00",
            resources={"gpu_types": ["A100", "A100-80GB"]},
        ),
        spec("ref-hours-a100", {"reference_gpu_hours": 4, "reference_gpu": "A100"}, 10, "60.00"),
        spec("lm-spot-only", model("LM", 20, "V100", 1, 2), 8, "20.00", market="spot"),
        spec("recsys-2gpu", model("Recommendation", 8192, "V100", 2, 2), 6, "40.00", gpus=2),
        spec("transformer-long", model("Transformer", 128, "V100", 1, 5), 12, "50.00"),
    ]
    jobs = [DemoJob("vision", s) for s in vision] + [DemoJob("nlp", s) for s in nlp]
    jobs.append(
        DemoJob(
            "nlp",
            spec(
                "llm-pretrain-8gpu",
                model("Transformer", 128, "V100", 8, 200),
                400,
                "5000.00",
                gpus=8,
            ),
            expect="over_budget",
        )
    )
    jobs.append(
        DemoJob(
            "vision",
            spec("resnet50-by-lunch", model("ResNet-50", 128, "V100", 1, 30), 1, "500.00"),
            expect="infeasible",
        )
    )
    for seed, job in enumerate(jobs, start=1):
        job.spec["run"] = run(seed)
    # A loose deadline: the team's other jobs may hold its live-attempt slots for hours, and
    # its restart must still find one (the demo shows the exit code, not a deadline miss).
    crash = spec("resnet18-crashes", model("ResNet-18", 256, "V100", 1, 0.5), 36, "10.00")
    crash["run"] = run(
        len(jobs) + 1,
        f"--fail-at-step {PROGRAM_STEPS // 2}",
        f"--exit-code {FAILING_EXIT_CODE}",
    )
    crash["max_restarts_on_errors"] = 1
    jobs.append(DemoJob("vision", crash, expect="fails"))
    return jobs


def unmet_expectation(job: DemoJob) -> str | None:
    """What went against the demo's plan for ``job`` (None when it went as expected)."""
    if (job.expect in ("accepted", "fails")) != (job.refusal is None):
        return f"{job.spec['name']} should be {job.expect}: {job.refusal or 'admitted'}"
    if job.expect == "fails" and job.final:
        reason = job.final.get("status_reason") or ""
        if job.final.get("status") != "failed" or f"exit code {FAILING_EXIT_CODE}" not in reason:
            status = job.final.get("status")
            return (
                f"{job.spec['name']} should fail with exit code {FAILING_EXIT_CODE}, "
                f"not {status} ({reason})"
            )
    return None


class DemoClient:
    """The demo's REST calls through ``BrokerClient``: the admin's, and one client per team."""

    def __init__(self, api_url: str, admin_token: str) -> None:
        self.admin = BrokerClient(api_url, admin_token)
        self.teams: dict[str, BrokerClient] = {}
        self.tokens: dict[str, str] = {}
        self.team_ids: dict[str, str] = {}
        self.workdirs: dict[str, str] = {}

    def team(self, name: str, limit: str) -> None:
        team = self.admin.create_team(name, limit, "month", 0.8)
        self.team_ids[name] = team["id"]
        self.tokens[name] = self.admin.create_key(team["id"], "demo")["token"]
        self.teams[name] = self.admin.with_token(self.tokens[name])
        self.workdirs[name] = self.teams[name].upload_workdir(EXAMPLES)

    def submit(self, job: DemoJob) -> None:
        api = self.teams[job.team]
        job.spec["run"].setdefault("workdir", self.workdirs[job.team])
        try:
            admitted = api.submit_job(job.spec)
        except BrokerUnreachable:
            raise
        except BrokerApiError as error:
            job.refusal = f"{error.status} {error.message}"
            return
        job.id = admitted["id"]
        if admitted["on_demand_only_cost"] is not None:
            job.on_demand_cost = Decimal(admitted["on_demand_only_cost"])

    def jobs(self, team: str) -> list[dict[str, Any]]:
        return [dict(j) for j in self.teams[team].list_jobs(limit=100)["items"]]

    def job(self, team: str, job_id: str) -> dict[str, Any]:
        return dict(self.teams[team].get_job(job_id))

    def spend_by_job(self, team: str) -> dict[str, str]:
        return {row["key"]: row["amount"] for row in self.teams[team].spend("job")["rows"]}

    def budget(self, team: str) -> dict[str, Any]:
        return dict(self.teams[team].budget())

    def close(self) -> None:
        for api in [self.admin, *self.teams.values()]:
            api.close()


def live_table(jobs: list[DemoJob], rows: dict[str, dict], spend: dict[str, str]) -> Table:
    """Status, progress, current plan and spend of every admitted job."""
    table = Table(title=f"broker demo: simulated time {clock.now():%Y-%m-%d %H:%M} UTC")
    for column in ("job", "team", "status", "progress", "on", "spent", "deadline in"):
        table.add_column(column)
    now = clock.now()
    for job in jobs:
        if job.id is None:
            continue
        row = rows.get(job.id)
        if row is None:
            continue
        fraction = float(row["progress"]["fraction"])
        plan = row.get("plan") or {}
        where = f"{plan.get('gpu_count', '')}x{plan.get('gpu', '')} {plan.get('market', '')}"
        if (plan.get("nodes") or 1) > 1:
            where = f"{plan['nodes']} nodes x {where}"
        left = (datetime.fromisoformat(row["deadline"]) - now).total_seconds() / 3600
        table.add_row(
            row["name"],
            job.team,
            row["status"],
            ProgressBar(total=1.0, completed=fraction, width=20),
            f"{where} {plan.get('zone', '')}",
            f"${Decimal(spend.get(job.id, '0')):.2f}",
            f"{left:.1f} h" if row["status"] not in TERMINAL else "-",
        )
    return table


def summary_tables(jobs: list[DemoJob], budgets: dict[str, dict]) -> Group:
    """Per job: plans, attempts, preemptions, cost vs on-demand, deadline; per team budget."""
    per_job = Table(title="Jobs")
    for column in (
        "job",
        "status",
        "attempts",
        "preempted",
        "markets used",
        "cost",
        "on-demand cost",
        "saved",
        "deadline met",
    ):
        per_job.add_column(column)
    for job in jobs:
        if job.id is None:
            continue
        final = job.final
        attempts = [a for a in final.get("attempts", []) if a["started_at"]]
        used: dict[str, int] = {}
        for a in attempts:
            label = f"{a['market'].replace('on_demand', 'od')} {a['provider']}/{a['zone']}"
            used[label] = used.get(label, 0) + 1
        preemptions = sum(1 for a in attempts if a["end_reason"] == "preempted")
        cost = Decimal(final.get("spent", "0"))
        od = job.on_demand_cost
        saved = f"{(1 - cost / od) * 100:.0f}%" if od and od > 0 else "-"
        met = final.get("deadline_met")
        per_job.add_row(
            job.spec["name"],
            final.get("status", "?"),
            str(len(final.get("attempts", []))),
            str(preemptions),
            ", ".join(f"{k} x{v}" if v > 1 else k for k, v in used.items()),
            f"${cost:.2f}",
            f"${od:.2f}" if od is not None else "-",
            saved,
            "-" if met is None else ("yes" if met else "no"),
        )
    teams = Table(title="Teams")
    for column in ("team", "limit", "spent", "reserved", "left", "alert"):
        teams.add_column(column)
    for name, budget in budgets.items():
        teams.add_row(
            name,
            f"${Decimal(budget['limit']):.2f}",
            f"${Decimal(budget['spent']):.2f}",
            f"${Decimal(budget['reserved']):.2f}",
            f"${Decimal(budget['available']):.2f}",
            "yes" if budget.get("alert") else "no",
        )
    return Group(per_job, teams)


def run_demo(
    console: Console,
    *,
    scale: float = 300.0,
    wall_limit_seconds: float = 495.0,
    data_dir: Path | None = None,
    stay: bool = False,
) -> bool:
    """Run the demo; True when every admitted job finished and no instance is left."""
    from broker.devstack.stack import EmbeddedStack

    folder = data_dir or Path(tempfile.mkdtemp(prefix="broker-demo-"))
    share = cpu_share()
    start = starting_scale(scale, share)
    if start < scale:
        console.print(
            f"[yellow]busy machine[/yellow]: a process gets {share:.0%} of a core, so the clock "
            f"starts at x{start:g}, not x{scale:g} (the demo takes longer, its decisions hold)"
        )
    started = time.monotonic()
    console.print(f"Starting the embedded stack in {folder} (clock x{start:g}) ...")
    with EmbeddedStack(folder, scale=start, tick_seconds=1.0, reconcile_seconds=5.0) as stack:
        console.print(
            f"API {stack.api_url} (docs {stack.api_url}/docs), admin token {stack.admin_token}"
        )
        console.print(f"Dashboard: {stack.api_url}/ui (log in with the admin token)")
        client = DemoClient(stack.api_url, stack.admin_token)
        client.team("vision", "400.00")
        client.team("nlp", "250.00")
        jobs = demo_jobs(clock.now())
        for job in jobs:
            client.submit(job)
        for job in jobs:
            if job.refusal:
                console.print(f"[yellow]refused[/yellow] {job.spec['name']}: {job.refusal}")
            if surprise := unmet_expectation(job):
                console.print(f"[red]unexpected[/red]: {surprise}")
        admitted = [j for j in jobs if j.id is not None]
        outage_at = clock.now() + timedelta(hours=1)
        outage: str | None = None
        rows = {r["id"]: r for team in client.teams for r in client.jobs(team)}
        if rise := demo_market.stage_price_rise(stack, rows, clock.now() + timedelta(hours=2)):
            console.print(f"[yellow]price change staged[/yellow]: {rise}")
        spend: dict[str, str] = {}
        scale_changes: list[tuple[datetime, float]] = []
        with Live(console=console, refresh_per_second=2, transient=False) as live:
            # A busy machine lowers the clock's scale: the time limit stretches with it.
            while time.monotonic() - started < wall_limit_seconds * scale / stack.effective_scale:
                for at, lowered in stack.scale_changes[len(scale_changes) :]:
                    scale_changes.append((at, lowered))
                    console.print(
                        f"[yellow]clock x{lowered:g}[/yellow] at {at:%H:%M}: the control loop lags"
                    )
                if not stack.worker_alive():
                    console.print(f"[red]the Celery worker died[/red]: see {folder}/worker.log")
                    break
                rows = {r["id"]: r for team in client.teams for r in client.jobs(team)}
                spend = {
                    k: v for team in client.teams for k, v in client.spend_by_job(team).items()
                }
                if outage is None and clock.now() >= outage_at:
                    outage = demo_market.outage(stack, rows) or "none"
                    if outage != "none":
                        console.print(f"[red]spot outage[/red] in {outage}")
                live.update(live_table(jobs, rows, spend))
                if all(rows.get(j.id or "", {}).get("status") in TERMINAL for j in admitted):
                    break
                time.sleep(1.0)
        for job in admitted:
            assert job.id is not None
            job.final = client.job(job.team, job.id)
        budgets = {team: client.budget(team) for team in client.teams}
        client.close()
        console.print(summary_tables(jobs, budgets))
        for job in jobs:
            if job.refusal:
                console.print(f"refused as expected: {job.spec['name']}: {job.refusal}")
        surprises = [s for s in map(unmet_expectation, jobs) if s]
        for job in admitted:
            if job.expect == "fails" and not unmet_expectation(job):
                reason = job.final.get("status_reason")
                console.print(f"failed as expected: {job.spec['name']}: {reason}")
        for surprise in surprises:
            console.print(f"[red]unexpected[/red]: {surprise}")
        unfinished = [j.spec["name"] for j in admitted if j.final.get("status") not in TERMINAL]
        deadline = time.monotonic() + 15
        left = stack.running_instances()
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = stack.running_instances()
        wall = time.monotonic() - started
        effective = f"x{start:g} at the start, x{stack.effective_scale:g} at the end"
        if stay:
            console.print(
                f"The dashboard stays up at {stack.api_url}/ui (admin token "
                f"{stack.admin_token}); Ctrl-C stops everything."
            )
            with contextlib.suppress(KeyboardInterrupt):
                threading.Event().wait()
    total_spent = sum(Decimal(j.final.get("spent", "0")) for j in admitted)
    total_od = sum(j.on_demand_cost or Decimal(0) for j in admitted)
    console.print(
        f"{len(admitted)} jobs admitted, {len(jobs) - len(admitted)} refused; "
        f"spent ${total_spent:.2f} vs ${total_od:.2f} on on-demand only; "
        f"wall time {wall:.0f} s; clock {effective}"
    )
    if unfinished:
        console.print(f"[red]unfinished at the time limit:[/red] {', '.join(unfinished)}")
    console.print(
        "no instance left running in either local cloud"
        if not left
        else f"[red]instances still running: {left}[/red]"
    )
    return not unfinished and not left and not surprises
