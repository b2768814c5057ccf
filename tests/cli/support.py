"""Helpers of the client command tests: job files and checks of a command's outcome."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "job.yaml"
runner = CliRunner()


def job_file(tmp_path: Path, name: str = "job.yaml", **fields: str) -> Path:
    """A YAML job spec (a +12h deadline and a run block unless ``fields`` say otherwise)."""
    lines = {
        "name": "resnet",
        "workload": "{model: ResNet-50, batch_size: 128, steps: 40000}",
        "resources": "{gpus: 1}",
        "deadline": "+12h",
        "max_cost": "100.00",
        "run": "{command: python train.py --steps 40000}",
        **fields,
    }
    path = tmp_path / name
    path.write_text("".join(f"{k}: {v}\n" for k, v in lines.items()))
    return path


def ok(result) -> str:  # type: ignore[no-untyped-def]
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return result.output


def printed(result) -> str:  # type: ignore[no-untyped-def]
    """What a successful command wrote to stdout alone (logs go to stderr)."""
    ok(result)
    return str(result.stdout)


def failed(result) -> str:  # type: ignore[no-untyped-def]
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # no crash
    assert "Traceback" not in result.output
    return result.output


def submitted_id(output: str) -> str:
    match = re.search(r"submitted job (\S+)", output)
    assert match, output
    return match.group(1)
