"""``broker demo`` as a user runs it: exits 0 and prints the summary it promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1300),
    pytest.mark.skipif(
        bool(os.environ.get("BROKER_TEST_DATABASE_URL")),
        reason="the demo runs on the embedded stack only; the SQLite pass covers it",
    ),
]


def test_broker_demo_runs_every_job_to_the_end_and_leaves_no_instance(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    result = subprocess.run(
        [sys.executable, "-m", "broker.cli", "demo", "--data-dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
        cwd=tmp_path,
    )
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "22 jobs admitted, 2 refused" in out
    assert "resnet50-2x8gpu-gang" in out and "2 nodes x 8xV100" in out  # the multi-node job
    assert "failed as expected: resnet18-crashes: exit code 3" in out
    assert "refused as expected: llm-pretrain-8gpu: 402" in out
    assert "refused as expected: resnet50-by-lunch: 422" in out
    assert "no instance left running in either local cloud" in out
    assert "unexpected" not in out
    for section in ("Jobs", "Teams", "on-demand cost", "deadline met"):
        assert section in out
