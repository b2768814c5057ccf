"""A job spec's deadline as a span from the broker's clock (``+12h``): resolved at admission,
hashed as written, so a retry with the same Idempotency-Key is the same job."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from tests.conftest import START
from tests.helpers import job_spec


def test_relative_deadline_is_resolved_against_the_broker_clock(client, make_team):
    _, headers = make_team()
    response = client.post("/v1/jobs", json=job_spec(deadline="+1d12h"), headers=headers)
    assert response.status_code == 201, response.text
    job = response.json()
    assert datetime.fromisoformat(job["deadline"]) == START + timedelta(hours=36)
    assert datetime.fromisoformat(job["spec"]["deadline"]) == START + timedelta(hours=36)


def test_retry_with_same_key_and_relative_body_returns_the_same_job(client, make_team, clock):
    _, headers = make_team()
    keyed = {**headers, "Idempotency-Key": "nightly-1"}
    first = client.post("/v1/jobs", json=job_spec(deadline="+12h"), headers=keyed)
    assert first.status_code == 201, first.text
    clock.advance(600)  # the retry comes later: the span would now resolve differently
    again = client.post("/v1/jobs", json=job_spec(deadline="+12h"), headers=keyed)
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["deadline"] == first.json()["deadline"]
    other = client.post("/v1/jobs", json=job_spec(deadline="+13h"), headers=keyed)
    assert other.status_code == 409, other.text


def test_quote_accepts_a_relative_deadline(client, make_team):
    _, headers = make_team()
    relative = client.post("/v1/quotes", json=job_spec(deadline="+48h"), headers=headers)
    absolute = client.post("/v1/quotes", json=job_spec(), headers=headers)  # START + 48 h
    assert relative.status_code == 200, relative.text
    assert relative.json() == absolute.json()


@pytest.mark.parametrize("deadline", ["+8 parsecs", "+", "+h", "+-3h", "+1e9h", "+99999w"])
def test_invalid_span_is_422_naming_deadline(client, make_team, deadline):
    _, headers = make_team()
    for path in ("/v1/jobs", "/v1/quotes"):
        response = client.post(path, json=job_spec(deadline=deadline), headers=headers)
        assert response.status_code == 422, response.text
        error = response.json()["detail"][0]
        assert error["loc"] == ["body", "deadline"], error


@pytest.mark.parametrize(("deadline", "words"), [("+0s", "in the past"), ("+400d", "a year")])
def test_span_outside_the_horizon_is_422_naming_deadline(client, make_team, deadline, words):
    _, headers = make_team()
    response = client.post("/v1/jobs", json=job_spec(deadline=deadline), headers=headers)
    assert response.status_code == 422, response.text
    error = response.json()["detail"][0]
    assert error["loc"] == ["body", "deadline"] and words in error["msg"], error
