"""``GET /healthz``: the database answers, and the broker's clock is reported."""

from __future__ import annotations

from datetime import datetime, timedelta


def test_healthz_reports_the_broker_clock(client, clock) -> None:  # type: ignore[no-untyped-def]
    clock.advance(timedelta(hours=5).total_seconds())
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert datetime.fromisoformat(body["time"]) == clock.now()
