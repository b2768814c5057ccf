"""Fixtures for the agent's tests: a fake broker (tests/agent/fakes.py) and programs to run."""

from __future__ import annotations

import glob
import os
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.agent.fakes import FakeBroker, fake_broker


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    with fake_broker("aws") as broker:
        yield broker


def oldest_python() -> str | None:
    """A Python 3.8 interpreter (the oldest the agent supports), if this machine has one."""
    pattern = os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")
    for candidate in ["/usr/bin/python3.8", *sorted(glob.glob(pattern))]:
        if os.path.exists(candidate):
            check = subprocess.run([candidate, "--version"], capture_output=True)
            if check.returncode == 0:
                return candidate
    return None


@pytest.fixture(params=["python3", "python3.8"])
def agent_python(request: pytest.FixtureRequest) -> str:
    """The interpreter the agent runs on: this one, and Python 3.8 when there is one."""
    if request.param == "python3":
        return sys.executable
    found = oldest_python()
    if found is None:
        pytest.skip("no Python 3.8 on this machine")
    return found


@pytest.fixture
def program(tmp_path: Path) -> Callable[[str], str]:
    """Writes a Python program (dedented source) into tmp_path; the command that runs it."""
    count = 0

    def write(source: str) -> str:
        nonlocal count
        count += 1
        path = tmp_path / f"program{count}.py"
        path.write_text(textwrap.dedent(source))
        return f"{shlex.quote(sys.executable)} {shlex.quote(str(path))}"

    return write
