"""``broker quote JOB_FILE``: ranked plans for a job spec; launches nothing."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text

from broker.cli.api import connect
from broker.cli.output import console, plan, row, table, usd
from broker.cli.specfile import JOB_FILE, load_spec


def quote(job_file: Path = JOB_FILE) -> None:
    """Ranked plans for a job spec, cheapest expected cost first; launches nothing."""
    with connect("team") as api:
        spec = load_spec(job_file)
        result = api.quote(spec)
    grid = table(
        "#",
        "provider",
        "zone",
        "instance type",
        "nodes",
        "GPU",
        "market",
        "$/h",
        "exp. hours",
        "exp. cost",
        "worst case",
        "p_deadline",
        title=f"Plans for {spec.get('name', job_file.name)}",
    )
    for rank, p in enumerate(result["plans"], 1):
        row(
            grid,
            rank,
            p["provider"],
            p["zone"],
            p["instance_type"],
            p.get("nodes", 1),
            f"{p['gpu']} x{p['gpu_count']}",
            p["market"],
            usd(p["price_per_hour"], 4),
            f"{p['expected_hours']:.2f}",
            usd(p["expected_cost"]),
            usd(p["worst_case_cost"]),
            f"{p['p_deadline']:.1%}",
        )
    out = console()
    out.print(grid)
    cheapest = result.get("cheapest_on_demand")
    if cheapest:
        out.print(
            Text(f"cheapest on-demand: {plan(cheapest)}, expected {usd(cheapest['expected_cost'])}")
        )
