"""Faithful time on a busy machine: the workers log how late control-loop tasks end, and
the embedded stack lowers its clock's scale when that lateness, in broker time, stays too
long (a late observation is a decision taken on stale facts).

The lag log is append-only text, one ``<wall end> <wall delay> <task>`` line per task done;
only the stack's supervisor reads it (and empties it now and then).
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from broker.clock import Segment, broker_seconds, lower_scale, read_schedule

log = logging.getLogger(__name__)

LAG_LOG_KEEP_BYTES = 256 * 1024  # the reader empties the log once it has read this much


def cpu_share(probe_seconds: float = 0.3) -> float:
    """The share of a core this process gets now (0-1]: CPU seconds over wall seconds of a
    short busy loop. About 1 on a machine with a core to spare; 2/7 beside six CPU-bound
    processes on two cores."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall0 < probe_seconds:
        pass
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return min(max(cpu / wall, 0.01), 1.0) if wall > 0 else 1.0


def starting_scale(requested: float, share: float, floor: float = 0.125) -> float:
    """The clock scale to start at on a machine giving a process ``share`` of a core:
    ``requested`` halved until it fits that share (a share of 0.75 or more keeps it), not
    below ``floor`` x ``requested``. The pacer lowers the scale when the loop lags, but only
    after the lag has built up: on a busy machine a demo starting at full speed loses
    broker-hours in its launch burst before the first lowering."""
    scale = requested
    while scale > requested * max(share, floor) / 0.75 and scale / 2 >= requested * floor:
        scale /= 2
    return scale


def record_lag(path: Path, task: str, delay: float, wall: float | None = None) -> None:
    """Append one task's delay (wall seconds from publish to its end) to the lag log."""
    line = f"{time.time() if wall is None else wall:.3f} {max(delay, 0.0):.3f} {task}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())  # one small write: appends from processes do not mix
    finally:
        os.close(fd)


@dataclass
class Pacer:
    """Reads the lag log and lowers the schedule's scale (by ``factor``, not below
    ``floor``) when the median broker-time lag of the tasks started in the last
    ``sustain_seconds`` has exceeded ``limit_seconds`` for ``sustain_seconds``; never
    raises it. Tasks published before ``calm_until`` (a change, the workers' boot) do not
    count."""

    schedule: Path
    lag_log: Path
    floor: float
    limit_seconds: float = 600.0
    tick_seconds: float = 1.0
    sustain_seconds: float = 5.0
    factor: float = 0.5
    changes: list[Segment] = field(default_factory=list)
    _offset: int = 0
    _window: deque[tuple[float, float]] = field(default_factory=deque)
    _late_since: float | None = None
    _last_start: float = 0.0
    calm_until: float = 0.0

    def poll(self, wall: float | None = None) -> Segment | None:
        """Take in the new log lines; the segment appended if the scale was lowered."""
        wall = time.time() if wall is None else wall
        segments = read_schedule(self.schedule)
        for started, delay in self._read():
            self._last_start = max(self._last_start, started)
            if started - delay >= self.calm_until:  # published after the last change
                lag = broker_seconds(segments, started) - broker_seconds(segments, started - delay)
                self._window.append((started, lag))
        while self._window and self._window[0][0] < wall - self.sustain_seconds:
            self._window.popleft()
        lagged = statistics.median(lag for _, lag in self._window) if self._window else 0.0
        # A loop so late that no task starts logs nothing: its silence beyond a tick is lag.
        quiet_since = max(self._last_start, self.calm_until) + self.tick_seconds
        if wall > quiet_since:
            silent = broker_seconds(segments, wall) - broker_seconds(segments, quiet_since)
            lagged = max(lagged, silent)
        if lagged <= self.limit_seconds:
            self._late_since = None
            return None
        if self._late_since is None:
            self._late_since = wall
        scale = segments[-1][2]
        if wall - self._late_since < self.sustain_seconds or scale <= self.floor:
            return None
        segment = lower_scale(self.schedule, max(self.floor, scale * self.factor), now=wall)
        self.changes.append(segment)
        self._window.clear()
        self._late_since = None
        self.calm_until = segment[0]
        log.warning(
            "control loop %.0f broker seconds late: clock x%g -> x%g",
            lagged,
            scale,
            segment[2],
            extra={"lag_seconds": lagged, "scale": segment[2]},
        )
        return segment

    def _read(self) -> list[tuple[float, float]]:
        try:
            with open(self.lag_log, "rb") as handle:
                if os.fstat(handle.fileno()).st_size < self._offset:
                    self._offset = 0  # emptied behind our back
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
        self._offset += end
        records = []
        for line in data[:end].decode(errors="replace").splitlines():
            parts = line.split()
            try:
                records.append((float(parts[0]), float(parts[1])))
            except (IndexError, ValueError):
                continue
        if self._offset > LAG_LOG_KEEP_BYTES:
            # Lines appended since the read above are lost: a handful, out of thousands.
            os.truncate(self.lag_log, 0)
            self._offset = 0
        return records
