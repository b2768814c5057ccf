"""The client a training script calls to report progress and saved checkpoints.

    agent = Agent.from_resume(resume)          # the JSON the broker put in the user data
    agent.report(work_done=1200)
    agent.checkpoint_saved("jobs/job_x/ckpt-1200", work_done=1200)

``report`` returns the job's status; a finished job means the script should stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class Ack:
    job_status: str
    work_done: float
    total_work: float

    @property
    def should_stop(self) -> bool:
        return self.job_status not in ("provisioning", "running")


class Agent:
    """Reports one attempt's progress to the broker with the attempt's own token."""

    def __init__(
        self, api_url: str, attempt_id: str, token: str, client: httpx.Client | None = None
    ) -> None:
        self.attempt_id = attempt_id
        self._client = client or httpx.Client(base_url=api_url, timeout=10)
        self._headers = {"Authorization": f"Bearer {token}"}

    @classmethod
    def from_resume(cls, resume: dict[str, Any]) -> Agent:
        """An agent from the resume information the broker put in the instance's user data."""
        return cls(resume["api_url"], resume["attempt_id"], resume["token"])

    def report(self, work_done: float) -> Ack:
        """Report work done so far."""
        return self._post({"work_done": work_done})

    def checkpoint_saved(self, key: str, work_done: float) -> Ack:
        """Report a checkpoint written to the object store under ``key`` holding ``work_done``."""
        return self._post({"work_done": work_done, "checkpoint_key": key})

    def _post(self, body: dict[str, Any]) -> Ack:
        response = self._client.post(
            f"/v1/attempts/{self.attempt_id}/progress", json=body, headers=self._headers
        )
        if response.status_code == 409:
            return Ack(job_status="ended", work_done=body["work_done"], total_work=0.0)
        response.raise_for_status()
        return Ack(**response.json())

    def close(self) -> None:
        self._client.close()
