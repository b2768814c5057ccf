"""``broker prices``: current prices per offer and market, with where each came from."""

from __future__ import annotations

import json

import pytest
from sqlmodel import Session

from broker.core.offers import PriceObservation
from broker.db.engine import begin_write
from broker.services.market_prices import store
from tests.cli.support import failed, ok, printed

pytestmark = pytest.mark.usefixtures("fresh_planning")


def test_prices_of_one_gpu_and_market_as_a_table_and_as_json(
    broker_cli, team_key, db_engine, clock
):
    _, token = team_key
    with Session(db_engine) as session:
        begin_write(session)
        store(
            session,
            [
                PriceObservation(
                    "aws",
                    "us-east-1",
                    "use1-az1",
                    "p3.2xlarge",
                    "spot",
                    123_400,
                    clock.now(),
                    "aws-spot-history",
                    "V100",
                )
            ],
        )
        session.commit()

    out = ok(broker_cli("prices", "--gpu", "v100", "--market", "spot", token=token))
    for header in ("GPU", "provider", "region", "zone", "instance type", "$/GPU-h", "source"):
        assert header in out
    live = next(line for line in out.splitlines() if "p3.2xlarge" in line and "use1-az1" in line)
    assert "$0.1234" in live and "aws-spot-history" in live and "2026-12-03 12:00" in live
    assert "bundled" in out and "on_demand" not in out

    rows = json.loads(printed(broker_cli("prices", "--provider", "gcp", "--json", token=token)))
    assert rows and {r["provider"] for r in rows} == {"gcp"}
    assert {r["market"] for r in rows} == {"spot", "on_demand"}
    assert all(r["source"] == "bundled" and r["observed_at"] is None for r in rows)


def test_a_gpu_no_offer_has_prints_the_known_ones(broker_cli, team_key):
    _, token = team_key
    out = failed(broker_cli("prices", "--gpu", "X100", token=token))
    assert "gpu" in out and "known GPUs" in out and "A100" in out
    assert "on_demand" in failed(broker_cli("prices", "--market", "cheap", token=token))
