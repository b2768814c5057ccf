"""broker_sdk: how a training program talks to the broker's agent (standard library only).

The agent puts this file on the program's PYTHONPATH. Everything goes through stdout lines
the agent reads, so the same program runs unchanged without the broker (the lines are then
just output)::

    import broker_sdk

    folder = broker_sdk.checkpoint_dir()
    step = load_checkpoint(folder)  # the agent restored the job's latest there; else 0
    while step < total and not broker_sdk.should_stop():
        train_one_step()
        step += 1
        broker_sdk.report(step)
        if step % 1000 == 0 or step == total:
            save_checkpoint(folder, step)  # atomically: a temp file, then os.replace
            broker_sdk.checkpoint_saved(step=step)
    if step < total:  # SIGTERM (a spot notice, a cancel): keep what was done
        save_checkpoint(folder, step)
        broker_sdk.checkpoint_saved(step=step)
        sys.exit(143)  # the agent stopped it: not counted as an error

Steps are the workload's work units when ``BROKER_WORK_UNIT`` is ``steps``; for
``reference_gpu_hours`` report ``step * total_work() / total`` instead.

On a multi-node job every machine runs the program: ``node_rank()`` and ``num_nodes()`` say
which and how many, ``master()`` where node 0's rendezvous is. Only node 0's reports and
checkpoints count: save and report on node 0.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time

__all__ = [
    "checkpoint_dir",
    "checkpoint_saved",
    "master",
    "node_rank",
    "num_nodes",
    "report",
    "should_stop",
    "start_work",
    "total_work",
]

REPORT_SECONDS = 1.0
"""``report`` prints at most one line this often: the agent sends the latest work every few
seconds anyway, and each line counts against the job's log limit."""
_lock = threading.Lock()
_last_line = -REPORT_SECONDS  # monotonic time of the last progress line
_last_step: float | None = None
_stop = threading.Event()
_handler_installed = False


def _format(step: float) -> str:
    return format(float(step), ".12g")


def _emit(line: str) -> None:
    with _lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def report(step: float) -> None:
    """Tell the agent how much work is done (work units of the workload); call it as often as
    you like, it prints at most one line a second."""
    global _last_step, _last_line
    _last_step = float(step)
    now = time.monotonic()
    if now - _last_line >= REPORT_SECONDS:
        _last_line = now
        _emit("broker: step=" + _format(step))


def checkpoint_saved(path: str | None = None, step: float | None = None) -> None:
    """Tell the agent a checkpoint holding ``step`` (default: the last reported) is completely
    written into BROKER_CHECKPOINT_DIR; the agent uploads that whole folder."""
    global _last_step
    if step is None:
        step = _last_step if _last_step is not None else start_work()
    _last_step = float(step)
    where = path if path is not None else checkpoint_dir()
    _emit("broker: step=" + _format(step) + " checkpoint=" + str(where))


def should_stop() -> bool:
    """True once the program got SIGTERM (after the first call installs a handler for it,
    when the program has none of its own) or the agent created ``$BROKER_STOP_FILE``."""
    _install_handler()
    stop_file = os.environ.get("BROKER_STOP_FILE")
    if stop_file and os.path.exists(stop_file):
        _stop.set()
    return _stop.is_set()


def checkpoint_dir() -> str:
    """The folder to write checkpoints into (BROKER_CHECKPOINT_DIR; without the broker, a
    folder in the temp dir made once per process)."""
    folder = os.environ.get("BROKER_CHECKPOINT_DIR")
    if not folder:
        folder = os.path.join(tempfile.gettempdir(), f"broker-checkpoints-{os.getpid()}")
        os.environ["BROKER_CHECKPOINT_DIR"] = folder
    os.makedirs(folder, exist_ok=True)
    return folder


def start_work() -> float:
    """The work the restored checkpoint holds (BROKER_START_WORK; 0 without the broker)."""
    return float(os.environ.get("BROKER_START_WORK") or 0.0)


def total_work() -> float | None:
    """The job's total work in work units (BROKER_TOTAL_WORK), or None without the broker."""
    value = os.environ.get("BROKER_TOTAL_WORK")
    return float(value) if value else None


def node_rank() -> int:
    """This machine's rank in a multi-node job (BROKER_NODE_RANK; 0 alone or without the
    broker)."""
    return int(os.environ.get("BROKER_NODE_RANK") or 0)


def num_nodes() -> int:
    """How many machines run the job (BROKER_NUM_NODES; 1 alone or without the broker)."""
    return int(os.environ.get("BROKER_NUM_NODES") or 1)


def master() -> tuple[str, int] | None:
    """Node 0's rendezvous address and port (BROKER_MASTER_ADDR, BROKER_MASTER_PORT), or None
    on a single machine."""
    addr, port = os.environ.get("BROKER_MASTER_ADDR"), os.environ.get("BROKER_MASTER_PORT")
    return (addr, int(port)) if addr and port else None


def _install_handler() -> None:
    # Only when asked about stopping, only once, only from the main thread and never over a
    # handler of the program's own: importing the SDK must not change how a program dies.
    global _handler_installed
    if _handler_installed or threading.current_thread() is not threading.main_thread():
        return
    _handler_installed = True
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: _stop.set())
