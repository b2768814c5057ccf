"""``broker simulate`` through Typer's test runner, on a tiny app that registers it."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from broker.cli.simulate import simulate

app = typer.Typer()
app.command("simulate")(simulate)
app.command("noop")(lambda: None)  # two commands, so "simulate" is a subcommand


def write_trace(path: Path, samples: list[int]) -> Path:
    path.write_text(json.dumps({"metadata": {"gap_seconds": 360}, "data": samples}))
    return path


def test_json_lines_one_per_policy_with_exact_costs(tmp_path: Path) -> None:
    # 1 = spot NOT available: spot lost from 2 h to 3 h
    trace = write_trace(tmp_path / "z1_v100_1.json", [0] * 20 + [1] * 10 + [0] * 70)
    args = [
        "simulate",
        "--trace",
        str(trace),
        "--work-hours",
        "4",
        "--deadline-hours",
        "6",
        "--restart-hours",
        "0.2",
        "--spot-price",
        "1",
        "--on-demand-price",
        "3",
        "--starts",
        "1",
        "--json",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = {row["policy"]: row for row in map(json.loads, result.output.splitlines())}
    assert set(rows) == {"on_demand", "greedy", "uniform_progress", "broker", "optimal"}
    assert abs(rows["greedy"]["mean_vs_optimal"] - 1.0) < 1e-9
    assert abs(rows["uniform_progress"]["mean_vs_on_demand"] - 7.8 / 12.6) < 1e-9
    assert all(row["misses"] == 0 for row in rows.values())


def test_table_and_plot(tmp_path: Path) -> None:
    zones = [
        write_trace(tmp_path / f"z{i}_v100_1.json", ([0] * 7 + [1] * 5) * 10) for i in range(2)
    ]
    plot = tmp_path / "slack.png"
    args = [
        "simulate",
        "--trace",
        str(zones[0]),
        "--trace",
        str(zones[1]),
        "--work-hours",
        "3",
        "--deadline-hours",
        "4",
        "--restart-hours",
        "0.1",
        "--starts",
        "4",
        "--policy",
        "greedy",
        "--plot",
        str(plot),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "greedy" in result.output and "optimal" in result.output
    assert "broker" not in result.output
    assert plot.stat().st_size > 1000


def test_unknown_policy_is_rejected(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "z_v100_1.json", [0] * 50)
    result = CliRunner().invoke(app, ["simulate", "--trace", str(trace), "--policy", "nope"])
    assert result.exit_code != 0
    assert "unknown policy" in result.output


def test_fleet_traces_are_the_prior_of_the_broker_spot_model(tmp_path: Path) -> None:
    # 10 days: the job's zone keeps spot 48 min at a time; the fleet's windows last 6 min.
    zone = write_trace(tmp_path / "z1_v100_1.json", ([0] * 8 + [1] * 4) * 200)
    flaky = [write_trace(tmp_path / f"f{i}_v100_1.json", [0, 1] * 1200) for i in range(3)]
    args = ["simulate", "--trace", str(zone), "--work-hours", "6", "--deadline-hours", "9"]
    args += ["--restart-hours", "0.2", "--starts", "4", "--policy", "broker", "--json"]

    def broker_cost(extra: list[str]) -> float:
        result = CliRunner().invoke(app, args + extra)
        assert result.exit_code == 0, result.output
        rows = {row["policy"]: row for row in map(json.loads, result.output.splitlines())}
        assert rows["broker"]["misses"] == 0
        return rows["broker"]["mean_vs_on_demand"]

    alone = broker_cost([])
    # The fleet's hazards (windows that die within a tick) reshape the broker's plan here.
    assert broker_cost([arg for f in flaky for arg in ("--fleet", str(f))]) != alone
    short = write_trace(tmp_path / "s_v100_1.json", [0] * 50)
    result = CliRunner().invoke(app, [*args, "--fleet", str(short)])
    assert result.exit_code != 0
    assert "--fleet" in result.output
