"""What an instance is launched with: the cloud request and the user data its agent reads.

The user data carries the attempt's agent token (``agent_token``: derived from the agent
secret, so a retried launch of the same attempt hands the same one), where to report and
where to restore from and save checkpoints.
"""

from __future__ import annotations

from datetime import datetime

from broker.core.agent_tokens import mint, token_expiry
from broker.db.models import Attempt, Checkpoint, Job
from providers.base import TAG_ATTEMPT, TAG_JOB, TAG_TEAM, LaunchRequest


def agent_token(secret: str, attempt_id: str, deadline: datetime) -> str:
    """The per-attempt token an instance reports with, expiring a margin after its job's
    ``deadline`` (``broker.core.agent_tokens``): derived, so a retried launch can hand the
    same one to the instance its idempotent launch returns."""
    return mint(secret, attempt_id, token_expiry(deadline))


def launch_request(
    job: Job,
    attempt: Attempt,
    checkpoint: Checkpoint | None,
    *,
    api_url: str,
    agent_secret: str,
    checkpoint_bucket: str,
) -> LaunchRequest:
    """The cloud request for ``attempt`` of ``job``, resuming from ``checkpoint``."""
    resume = {
        "api_url": api_url,
        "attempt_id": attempt.id,
        "token": agent_token(agent_secret, attempt.id, job.deadline),
        "token_expires_at": token_expiry(job.deadline).isoformat(),
        "job_id": job.id,
        "workload": job.spec["workload"],
        "gpu": attempt.gpu,
        "gpu_count": attempt.gpu_count,
        "start_work": attempt.work_at_start,
        "total_work": job.total_work,
        "checkpoint_interval_seconds": job.spec["checkpoint"]["interval_minutes"] * 60,
        "checkpoint_bucket": checkpoint_bucket,
        "checkpoint_prefix": f"jobs/{job.id}",
        "latest_checkpoint": checkpoint.object_key if checkpoint else None,
    }
    return LaunchRequest(
        token=attempt.id,
        provider=attempt.provider,
        region=attempt.region,
        zone=attempt.zone,
        instance_type=attempt.instance_type,
        market="spot" if attempt.market == "spot" else "on_demand",
        gpu=attempt.gpu,
        gpu_count=attempt.gpu_count,
        tags={TAG_JOB: job.id, TAG_ATTEMPT: attempt.id, TAG_TEAM: job.team_id},
        user_data=resume,
    )
