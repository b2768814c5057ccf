"""What an instance is launched with: the cloud request and its boot script.

The boot script (``providers.boot``) carries the attempt's agent token (``agent_token``:
derived from the agent secret, so a retried launch of the same attempt hands the same one)
and where the API is; the agent fetches everything else (its run spec, the checkpoint to
restore) from the API with that token.
"""

from __future__ import annotations

from datetime import datetime

from broker.core.agent_tokens import mint, token_expiry
from broker.db.models import Attempt, Job
from providers.base import TAG_ATTEMPT, TAG_JOB, TAG_NODE, TAG_TEAM, LaunchRequest
from providers.boot import boot_script


def agent_token(secret: str, attempt_id: str, deadline: datetime) -> str:
    """The per-attempt token an instance reports with, expiring a margin after its job's
    ``deadline`` (``broker.core.agent_tokens``): derived, so a retried launch can hand the
    same one to the instance its idempotent launch returns."""
    return mint(secret, attempt_id, token_expiry(deadline))


def node_token(attempt_id: str, node_rank: int) -> str:
    """The idempotency token of a gang node's launch: the attempt id for rank 0 (as a
    single instance), ``<attempt id>-n<k>`` for rank k."""
    return attempt_id if node_rank == 0 else f"{attempt_id}-n{node_rank}"


def placement_group(attempt: Attempt) -> str | None:
    """The placement a gang's nodes share: one cluster placement group per zone, none for a
    single instance."""
    return f"broker-gang-{attempt.zone}" if attempt.nodes > 1 else None


def launch_request(
    job: Job, attempt: Attempt, *, api_url: str, agent_secret: str, node_rank: int = 0
) -> LaunchRequest:
    """The cloud request for ``attempt`` of ``job`` (node ``node_rank`` of a gang): where,
    what, and the boot script. Every node shares the attempt's agent token."""
    token = agent_token(agent_secret, attempt.id, job.deadline)
    tags = {TAG_JOB: job.id, TAG_ATTEMPT: attempt.id, TAG_TEAM: job.team_id}
    if attempt.nodes > 1:
        tags[TAG_NODE] = str(node_rank)
    return LaunchRequest(
        token=node_token(attempt.id, node_rank),
        provider=attempt.provider,
        region=attempt.region,
        zone=attempt.zone,
        instance_type=attempt.instance_type,
        market="spot" if attempt.market == "spot" else "on_demand",
        gpu=attempt.gpu,
        gpu_count=attempt.gpu_count,
        tags=tags,
        boot_script=boot_script(api_url, attempt.id, token, attempt.provider, node_rank=node_rank),
        placement_group=placement_group(attempt),
    )
