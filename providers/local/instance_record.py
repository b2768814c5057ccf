"""One local instance as its process manager, metadata server and light runner see it, and
what those two need of the manager (``InstanceBook``), so neither imports the manager."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from providers.base import TAG_JOB


class InstanceBook(Protocol):
    """The process manager as the metadata server and the light runner use it."""

    changed: threading.Condition
    closing: threading.Event

    def get(self, instance_id: str) -> LocalInstance | None: ...

    def seconds_per_work_unit(self, instance_id: str, workload: Mapping[str, Any]) -> float: ...

    def scale(self) -> float: ...


@dataclass
class LocalInstance:
    """One instance the local clouds started, as its process manager and metadata see it."""

    instance_id: str
    provider: str
    gpu: str
    gpu_count: int
    tags: dict[str, str]
    directory: Path
    script: str
    process: subprocess.Popen[bytes] | None = None
    reclaim_at: datetime | None = None  # set by a spot notice
    killed: bool = False
    exit_code: int | None = None
    tokens: dict[str, float] = field(default_factory=dict)  # IMDSv2 token -> monotonic expiry

    @property
    def job_id(self) -> str:
        """The broker job the instance runs (its ``broker-job`` tag), or ""."""
        return self.tags.get(TAG_JOB, "")

    @property
    def alive(self) -> bool:
        """Not killed and (for a process) not exited."""
        return not self.killed and self.exit_code is None
