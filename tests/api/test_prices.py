"""GET /v1/prices, and the origin of the price quotes and plans carry."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from decimal import Decimal

import pytest
from sqlmodel import Session

from broker.core.offers import PriceObservation
from broker.db.engine import begin_write
from broker.services import quoting
from broker.services.market_prices import price_rows, store
from tests.helpers import job_spec, quote_spec

pytestmark = pytest.mark.usefixtures("fresh_planning")


def stored(engine, *observations: PriceObservation) -> None:  # type: ignore[no-untyped-def]
    """Store prices as the worker's refresh does: another session, committed."""
    with Session(engine) as session:
        begin_write(session)
        store(session, list(observations))
        session.commit()


def observed(plan: dict, micros: int, at, source: str = "aws-spot-history") -> PriceObservation:  # type: ignore[no-untyped-def]
    return PriceObservation(
        provider=plan["provider"],
        region=plan["region"],
        zone=plan["zone"],
        instance_type=plan["instance_type"],
        market=plan["market"],
        micros_per_hour=micros,
        observed_at=at,
        source=source,
        gpu=plan["gpu"],
    )


def test_prices_list_every_offer_and_market_with_where_each_came_from(client, make_team):
    _, headers = make_team()
    response = client.get("/v1/prices", headers=headers)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["total"] > len(body["items"]) == 200 and body["next_offset"] == 200
    first = body["items"][0]
    assert set(first) == {
        "provider",
        "region",
        "zone",
        "instance_type",
        "gpu",
        "gpu_count",
        "market",
        "price_per_hour",
        "observed_at",
        "source",
    }
    assert all(i["source"] == "bundled" and i["observed_at"] is None for i in body["items"])
    assert all(Decimal(i["price_per_hour"]) > 0 for i in body["items"])

    last = client.get(
        "/v1/prices", params={"offset": body["total"] - 1, "limit": 5}, headers=headers
    ).json()
    assert len(last["items"]) == 1 and last["next_offset"] is None


def test_prices_filter_by_gpu_in_any_case_provider_region_and_market(client, make_team):
    _, headers = make_team()
    params = {"gpu": "v100", "provider": "AWS", "region": "us-east-1", "market": "spot"}
    items = client.get("/v1/prices", params=params, headers=headers).json()["items"]
    assert items
    assert {(i["gpu"], i["provider"], i["region"], i["market"]) for i in items} == {
        ("V100", "aws", "us-east-1", "spot")
    }
    ones = [Decimal(i["price_per_hour"]) for i in items if i["gpu_count"] == 1]
    assert ones == sorted(ones)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("market", "cheap", ["spot", "on_demand"]),
        ("gpu", "X100", ["known GPUs", "V100", "A100"]),
        ("provider", "azure", ["aws", "gcp"]),
        ("region", "mars-1", ["us-east-1"]),
    ],
)
def test_a_filter_no_offer_has_is_422_naming_the_field_and_its_values(
    client, make_team, field, value, words
):
    _, headers = make_team()
    response = client.get("/v1/prices", params={field: value}, headers=headers)
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["query", field]
    assert all(word in error["msg"] for word in words), error["msg"]


def test_prices_need_a_team_key(client, admin_headers):
    assert client.get("/v1/prices").status_code == 401
    assert client.get("/v1/prices", headers=admin_headers).status_code == 403


def test_a_price_stored_by_the_refresh_reaches_the_api_quote_and_the_job_plan(
    client, make_team, db_engine, clock
):
    _, headers = make_team(limit="10000.00")
    spec = quote_spec(resources={"gpus": 1, "gpu_types": ["V100"]}, market="spot")
    before = client.post("/v1/quotes", json=spec, headers=headers).json()["plans"][0]
    assert (before["price_observed_at"], before["price_source"]) == (None, "bundled")

    clock.advance(600)
    halved = (Decimal(before["price_per_hour"]) * 500_000).to_integral_value()
    stored(db_engine, observed(before, int(halved), clock.now()))
    after = client.post("/v1/quotes", json=spec, headers=headers).json()["plans"][0]
    assert (after["zone"], after["instance_type"]) == (before["zone"], before["instance_type"])
    assert Decimal(after["price_per_hour"]) == Decimal(halved) / 1_000_000
    assert after["price_observed_at"] == clock.now().isoformat().replace("+00:00", "Z")
    assert after["price_source"] == "aws-spot-history"

    listed = client.get(
        "/v1/prices",
        params={"gpu": before["gpu"], "region": before["region"], "market": "spot"},
        headers=headers,
    ).json()["items"]
    (row,) = [
        i
        for i in listed
        if (i["zone"], i["instance_type"]) == (before["zone"], before["instance_type"])
    ]
    assert row["price_per_hour"] == after["price_per_hour"]
    assert (row["observed_at"], row["source"]) == (after["price_observed_at"], "aws-spot-history")

    job = client.post(
        "/v1/jobs",
        json=job_spec(resources={"gpus": 1, "gpu_types": ["V100"]}, market="spot"),
        headers=headers,
    )
    assert job.status_code == 201, job.text
    plan = job.json()["plan"]
    assert (plan["price_observed_at"], plan["price_source"]) == (
        after["price_observed_at"],
        "aws-spot-history",
    )
    listed_job = client.get("/v1/jobs", headers=headers).json()["items"][0]
    assert listed_job["plan"]["price_source"] == "aws-spot-history"


def test_the_dashboard_charts_the_cheapest_price_per_gpu_across_providers_and_regions(
    client, make_team, db_engine, clock
):
    _, headers = make_team()
    token = headers["Authorization"].split()[1]
    offers = quoting.get_planning().offers
    v100 = price_rows(offers, gpu="V100", region="us-east-1", market="spot")[0]
    cheaper = 100_000 * v100.gpu_count  # $0.10 per GPU-hour
    stored(db_engine, observed(asdict(v100), cheaper, clock.now()))

    login = client.post(
        "/ui/login",
        data={"token": token},
        headers={"Origin": "http://testserver"},
        follow_redirects=False,
    )
    assert login.status_code == 303
    page = client.get("/ui/")
    assert (
        page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
    )
    gpus = sorted(set(offers.gpu.tolist()))
    assert page.text.count('data-chart="prices"') == len(gpus)
    data = json.loads(re.search(r'id="chart-data">(.*?)</script>', page.text, re.S).group(1))
    chart = data["prices"][gpus.index("V100")]
    east = chart["labels"].index("aws us-east-1")
    assert chart["spot"][east] == 100_000
    assert all(p is None or p > 0 for p in chart["on_demand"])
    assert "V100</strong>: cheapest USD per GPU-hour" in page.text
    assert "observed up to 2026-12-03 12:00 UTC" in page.text and "bundled snapshot" in page.text
