"""What an attempt is launched with: the cloud request and its boot script."""

from __future__ import annotations

from typing import Any

from sqlmodel import Session

from broker.services import lifecycle
from broker.services.launch_request import agent_token, launch_request
from broker.services.teams import hash_token
from tests.helpers import SPOT_PLAN, SPOT_PRICE, chosen

SECRET = "agent-secret"


def test_the_boot_script_hands_the_attempt_its_derived_token(
    session: Session, submit: Any, clock: Any
) -> None:
    job = submit(market="spot")
    begun = lifecycle.begin_attempt(
        session,
        job.id,
        chosen(SPOT_PLAN, SPOT_PRICE),
        clock.now(),
        token_for=lambda attempt_id: agent_token(SECRET, attempt_id, job.deadline),
    )
    assert begun is not None
    attempt, token = begun

    request = launch_request(
        job, attempt, api_url="https://broker.example.com", agent_secret=SECRET
    )

    assert (request.token, request.provider, request.region) == (attempt.id, "aws", "us-east-1")
    assert (request.zone, request.instance_type, request.market) == (
        "use1-az1",
        "p3.2xlarge",
        "spot",
    )
    assert request.tags == {
        "broker-job": job.id,
        "broker-attempt": attempt.id,
        "broker-team": job.team_id,
    }
    lines = request.boot_script.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert f"export BROKER_ATTEMPT_ID={attempt.id}" in lines
    assert f"export BROKER_AGENT_TOKEN={token}" in lines
    assert "export BROKER_API_URL=https://broker.example.com" in lines
    assert "export BROKER_PROVIDER=aws" in lines
    assert hash_token(token) == attempt.token_hash  # the token the API accepts
    assert token not in repr(request)
    # A retried launch hands the instance the very same script.
    again = launch_request(job, attempt, api_url="https://broker.example.com", agent_secret=SECRET)
    assert again == request
