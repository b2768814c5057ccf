"""The overspend attack of issue 21, through the whole stack: a $20 team posts 300 small jobs
from 8 threads while the loop falls behind. Spend leases keep the money bounded: what the
broker grants never passes the team's limit, overruns stay within the documented bound, and
another team's job is not affected."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

from sqlalchemy import func
from sqlmodel import Session, col, select

from broker.client import BrokerApiError
from broker.core.job_status import TERMINAL
from tests.e2e.support import SCALE, Api, backend_stack

JOBS, THREADS, TICK = 300, 8, 1.0


def _small_spec(api: Api, index: int) -> dict:
    from broker import clock

    return {
        "name": f"tiny-{index}",
        "workload": {"reference_gpu_hours": 0.01},
        "resources": {"gpus": 1},
        "deadline": (clock.now() + timedelta(hours=6)).isoformat(),
        "max_cost": "0.06",
        "checkpoint": {"interval_minutes": 30, "size_gb": 0},
        "run": api.run(),
    }


def test_a_flood_of_small_jobs_cannot_overspend_the_team(tmp_path: Path) -> None:
    from broker.db.engine import get_engine
    from broker.db.models import Attempt, Job, LedgerEntry
    from broker.services.ledger import OVERRUN, SPEND

    env = {"BROKER_MAX_LIVE_ATTEMPTS_PER_TEAM": "1000"}  # leases alone must hold the line
    with backend_stack(tmp_path, extra_env=env) as (stack, _):
        attacker, other = Api(stack, limit="20.00"), Api(stack, limit="100.00")
        bystander = other.submit(other.spec(hours=0.5, deadline_hours=12))

        def post(index: int) -> str | None:
            try:
                return attacker.submit(_small_spec(attacker, index))["id"]
            except BrokerApiError as error:  # 402 once the $20 are reserved
                assert error.status == 402, error
                return None

        with ThreadPoolExecutor(THREADS) as pool:
            accepted = [j for j in pool.map(post, range(JOBS)) if j]
        assert accepted, "no job was admitted"

        done = other.finish(bystander["id"], timeout=240)
        assert done["status"] == "succeeded", done["status_reason"]
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            jobs = [attacker.job(j)["status"] for j in accepted[:: max(len(accepted) // 20, 1)]]
            if all(s in TERMINAL for s in jobs):
                break
            time.sleep(1.0)

        with Session(get_engine()) as session:
            team_id = attacker.team["id"]

            def total(kind: str, team: str = team_id) -> int:
                query = select(func.coalesce(func.sum(LedgerEntry.amount_micros), 0)).where(
                    LedgerEntry.team_id == team, LedgerEntry.kind == kind
                )
                return int(session.exec(query).one())

            granted, overrun = total(SPEND), total(OVERRUN)
            lapsed = session.exec(
                select(Attempt).where(Attempt.team_id == team_id, Attempt.end_reason == "lease")
            ).all()
            # Documented bound (docs/architecture.md, "Money safety"): an attempt whose lease
            # lapsed ran past it until it was seen, at most the renewal window plus one tick.
            tick_hours = TICK * SCALE / 3600
            bound = sum(a.price_micros_per_hour * 3 * tick_hours for a in lapsed)
            assert granted <= 20_000_000, f"granted ${Decimal(granted) / 10**6} of $20"
            assert overrun <= bound, (overrun, bound, len(lapsed))
            # Every job's granted spend within its max_cost.
            worst = session.exec(
                select(func.max(Job.max_cost_micros)).where(col(Job.id).in_(accepted))
            ).one()
            per_job = session.exec(
                select(LedgerEntry.job_id, func.sum(LedgerEntry.amount_micros))
                .where(LedgerEntry.team_id == team_id, LedgerEntry.kind == SPEND)
                .group_by(LedgerEntry.job_id)
            ).all()
            assert all(amount <= worst for _, amount in per_job)
            # The bystander was billed only while it ran.
            other_spent = total(SPEND, other.team["id"]) + total(OVERRUN, other.team["id"])
            assert other_spent <= 60_000_000 and total(OVERRUN, other.team["id"]) == 0
            print(
                f"admitted {len(accepted)} of {JOBS}; granted ${granted / 1e6:.2f} of $20; "
                f"overrun ${overrun / 1e6:.2f} over {len(lapsed)} lapsed leases "
                f"(bound ${bound / 1e6:.2f})"
            )
        attacker.close()
        other.close()
