"""Find and kill every process of a local instance, wherever it went.

An instance's boot script runs as the leader of a session of its own; the agent may put the
job's program in a session or group of its own too, and a program whose agent died is
re-parented away from the tree. So an instance's processes are: the leader's session and
group, every process that carries the instance's ``BROKER_INSTANCE_DIR`` in its environment,
their descendants, and the sessions and groups those started. Linux reads ``/proc``;
elsewhere only the leader's process group is signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path


def _process_table() -> dict[int, tuple[str, int, int, int]] | None:
    """pid -> (state, parent, process group, session) from /proc; None without /proc."""
    if not os.path.isdir("/proc"):
        return None
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (command)"
        table[int(name)] = (fields[0], int(fields[1]), int(fields[2]), int(fields[3]))
    return table


def _belongs(pid: int, markers: tuple[bytes, ...]) -> bool:
    """Whether a process carries an instance's ``BROKER_INSTANCE_DIR``: how an orphan whose
    parent died is still found (not its working folder: a person may look around there)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            environ = handle.read().split(b"\0")
    except OSError:  # gone, or not ours to look at
        return False
    return any(marker in environ for marker in markers)


def _tree(leaders: set[int], markers: tuple[bytes, ...]) -> dict[int, str] | None:
    """Every process of the instances: the leaders' sessions and groups, processes with an
    instance's environment, their descendants, and the sessions and groups those started
    (an agent may put its program in a session of its own)."""
    table = _process_table()
    if table is None:
        return None
    me = os.getpid()
    found = {pid for pid in table if pid in leaders or (pid != me and _belongs(pid, markers))}
    keys = set(leaders) | found
    grew = True
    while grew:
        grew = False
        for pid, (_, parent, group, session) in table.items():
            if pid in found or pid == me:
                continue
            if parent in found or group in keys or session in keys:
                found.add(pid)
                keys.add(pid)
                grew = True
    return {pid: table[pid][0] for pid in found}


def _signal(leaders: set[int], markers: tuple[bytes, ...], signum: int) -> None:
    tree = _tree(leaders, markers)
    for pid in tree if tree is not None else ():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
    for leader in leaders:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, signum)


def kill_trees(
    processes: list[subprocess.Popen[bytes]], directories: list[Path], grace: float
) -> None:
    """SIGTERM every process of these instances, wait up to ``grace`` seconds for them to
    end, SIGKILL what is left, and reap the leaders."""
    leaders = {p.pid for p in processes}
    markers = tuple(f"BROKER_INSTANCE_DIR={d}".encode() for d in directories)
    _signal(leaders, markers, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        for process in processes:
            process.poll()  # reap the leader so it does not count as alive
        tree = _tree(leaders, markers)
        alive = [p for p, state in tree.items() if state != "Z"] if tree is not None else []
        if not alive and all(p.returncode is not None for p in processes):
            break
        time.sleep(0.05)
    _signal(leaders, markers, signal.SIGKILL)
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
