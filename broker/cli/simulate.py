"""``broker simulate``: replay spot availability traces against the policies.

Register with ``app.command("simulate")(simulate)``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from broker.core.policy_vectorized import BATCH_POLICIES
from broker.sim.scenario import TraceJob, on_demand_cost, start_offsets, zone_matrix
from broker.sim.simulator import compare, summarize
from pricing.traces import Trace, load_trace

ALL = [*BATCH_POLICIES, "optimal"]
PLOT_SLACKS = (1.05, 1.1, 1.2, 1.3, 1.5, 1.75, 2.0)


def simulate(
    trace: list[Path] = typer.Option(
        ..., "--trace", exists=True, dir_okay=False, help="Trace file; several = zones."
    ),
    fleet: list[Path] = typer.Option(
        [],
        "--fleet",
        exists=True,
        dir_okay=False,
        help="Trace the broker watched besides (another zone or instance type, same ticks); "
        "the prior of its spot model.",
    ),
    work_hours: float = typer.Option(48.0, help="Compute hours of the job."),
    deadline_hours: float = typer.Option(52.0, help="Hours from start to deadline."),
    restart_hours: float = typer.Option(0.2, help="Overhead of every start or switch."),
    spot_price: float = typer.Option(0.92, help="Spot $/h."),
    on_demand_price: float = typer.Option(3.06, help="On-demand $/h."),
    policy: str = typer.Option("all", help=f"One of {', '.join(ALL)}, or all."),
    starts: int = typer.Option(200, min=1, help="Job start offsets spread over the trace."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per policy per line."),
    plot: Path | None = typer.Option(None, help="Draw cost vs deadline slack to this PNG."),
) -> None:
    """Cost and deadline misses of each policy on the traces, normalized to on-demand and to
    the hindsight optimum."""
    if policy != "all" and policy not in ALL:
        raise typer.BadParameter(f"unknown policy {policy!r}; pick one of {', '.join(ALL)}")
    traces = [load_trace(path) for path in trace]
    try:
        matrix, gap = zone_matrix(traces)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--trace") from error
    watched = None
    if fleet:  # the job's zones are watched too
        try:
            watched = zone_matrix(traces + [load_trace(path) for path in fleet])[0]
        except ValueError as error:
            raise typer.BadParameter(str(error), param_hint="--fleet") from error
    names = ALL if policy == "all" else sorted({policy, "optimal"}, key=ALL.index)
    job = TraceJob(work_hours, deadline_hours, restart_hours, spot_price, on_demand_price)
    offsets = start_offsets(matrix.shape[1], starts)
    rows = summarize(compare(traces, job, offsets, names, watched), on_demand_cost(job, gap))
    console = Console()
    if as_json:
        for row in rows:
            typer.echo(json.dumps({**asdict(row), "zones": [t.zone for t in traces]}))
    else:
        table = Table(
            title=f"{work_hours:g} h of work, deadline {deadline_hours:g} h, "
            f"{len(traces)} zone(s), {starts} starts"
        )
        for column in ("policy", "mean/OD", "p90/OD", "mean/opt", "p90/opt", "misses"):
            table.add_column(column, justify="left" if column == "policy" else "right")
        for row in rows:
            table.add_row(
                row.policy,
                f"{row.mean_vs_on_demand:.3f}",
                f"{row.p90_vs_on_demand:.3f}",
                f"{row.mean_vs_optimal:.3f}",
                f"{row.p90_vs_optimal:.3f}",
                str(row.misses),
            )
        console.print(table)
    if plot is not None:
        draw_slack_plot(traces, job, offsets, names, plot)
        if not as_json:
            console.print(f"plot written to {plot}")


def draw_slack_plot(
    traces: list[Trace], job: TraceJob, offsets: np.ndarray, names: list[str], out: Path
) -> None:
    """Mean cost / on-demand per policy for deadlines of PLOT_SLACKS x the work."""
    import matplotlib

    matrix, gap = zone_matrix(traces)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves: dict[str, list[float]] = {name: [] for name in names}
    for slack in PLOT_SLACKS:
        at = replace(job, deadline_hours=job.work_hours * slack)
        for row in summarize(compare(traces, at, offsets, names), on_demand_cost(at, gap)):
            curves[row.policy].append(row.mean_vs_on_demand)
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, values in curves.items():
        axes.plot(PLOT_SLACKS, values, marker="o", label=name)
    axes.set_xlabel("deadline / work")
    axes.set_ylabel("mean cost / on-demand cost")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(out, dpi=120)
    plt.close(figure)
