"""A price the local cloud's pricing APIs start to give reaches the API process's quotes
within one refresh interval, through the worker's refresh and the database."""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path

from broker.core.money import to_micros
from tests.e2e.support import Api, backend_stack

REFRESH_SECONDS = 4.0  # wall; the stack's check for stored prices adds up to 2 s


def test_a_staged_spot_price_change_reaches_the_api_quote_within_one_refresh(
    tmp_path: Path,
) -> None:
    env = {"BROKER_REFRESH_PRICES_SECONDS": f"{REFRESH_SECONDS:g}"}
    with backend_stack(tmp_path, celery="filesystem", extra_env=env) as (stack, _url):
        api = Api(stack)
        spec = api.spec(hours=5.0, deadline_hours=14.0, market="spot")
        best = api.quote(spec)["plans"][0]
        old = Decimal(best["price_per_hour"])
        new = (old / 2).quantize(Decimal("0.0001"))
        stack.cloud.market.set_price(
            best["provider"],
            best["zone"],
            best["instance_type"],
            "spot",
            to_micros(new),
            gpu=best["gpu"],
        )
        changed_at = time.monotonic()
        deadline = changed_at + REFRESH_SECONDS + 2.0 + 10.0  # + a loaded machine's slack

        def same_offer() -> dict | None:
            for plan in api.quote(spec)["plans"]:
                if (plan["zone"], plan["instance_type"], plan["market"]) == (
                    best["zone"],
                    best["instance_type"],
                    "spot",
                ):
                    return dict(plan)
            return None

        plan = same_offer()
        while plan is None or Decimal(plan["price_per_hour"]) != new:
            assert time.monotonic() < deadline, f"the quote still says {plan} after the change"
            time.sleep(0.5)
            plan = same_offer()
        took = time.monotonic() - changed_at
        sources = {"aws": "aws-spot-history", "gcp": "gcp-cloud-billing"}
        assert plan["price_source"] == sources[best["provider"]]
        assert plan["price_observed_at"] is not None
        assert best["price_observed_at"] != plan["price_observed_at"]
        assert took <= REFRESH_SECONDS + 2.0 + 10.0
        prices = api.client.prices(provider=best["provider"], market="spot")
        row = next(
            r
            for r in prices
            if (r["zone"], r["instance_type"]) == (best["zone"], best["instance_type"])
        )
        assert Decimal(row["price_per_hour"]) == new and row["observed_at"] is not None
