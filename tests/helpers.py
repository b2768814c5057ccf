"""Plain helpers shared by tests (importable: tests/ is on pythonpath)."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from broker.core.spot_model import family
from broker.db.models import SpotModelRow
from broker.services.plans import ChosenPlan
from broker.services.quoting import get_planning
from broker.services.steering import candidate_zones
from providers.retry import FAST_RETRY
from providers.storage import S3CheckpointStore

# A spot plan on the bundled catalog's cheapest V100 (p3.2xlarge in use1-az1), at its price.
SPOT_PLAN = {
    "provider": "aws",
    "region": "us-east-1",
    "zone": "use1-az1",
    "instance_type": "p3.2xlarge",
    "gpu": "V100",
    "gpu_count": 1,
    "market": "spot",
}
SPOT_PRICE = 918_000  # micro-dollars per hour: $0.918/h
# The program every test job runs (a job spec's required ``run`` block).
RUN = {"command": "python train.py --steps 40000"}
# The spend lease the tests grant: longer than any clock jump between two observations.
LEASE = 3 * 3600.0


def chosen(where: Mapping[str, Any], price_micros: int) -> ChosenPlan:
    """A plan on ``where`` (provider, region, zone, instance type, GPU, market) billed at
    ``price_micros`` per hour: one expected hour, worst case one hour, sure to finish."""
    fields = {k: where[k] for k in SPOT_PLAN}
    return ChosenPlan(
        **fields,
        price_per_hour_micros=price_micros,
        expected_hours=1.0,
        expected_cost_micros=price_micros,
        worst_case_cost_micros=price_micros,
        p_deadline=1.0,
    )


def steady_spot(session: Any, now: datetime) -> None:
    """The shared spot model says spot in every zone of SPOT_PLAN's shape holds for many
    hours at a time (windows of 12 h, outages of 6 min): moving back to spot pays."""
    shape = family("aws", SPOT_PLAN["instance_type"], SPOT_PLAN["gpu"])
    zones = candidate_zones(get_planning(), "aws", SPOT_PLAN["instance_type"], SPOT_PLAN["zone"])
    for zone in zones:
        session.add(
            SpotModelRow(
                provider="aws",
                zone=zone,
                family=shape,
                up_runs=[12.0] * 100,
                down_runs=[0.1] * 100,
                prior="test",
                fitted_at=now,
            )
        )
    session.commit()


def fresh_postgres(base_url: str) -> tuple[str, str]:
    """Create a database of our own next to ``base_url``'s; returns (url, name)."""
    name = f"broker_test_{secrets.token_hex(4)}"
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return make_url(base_url).set(database=name).render_as_string(hide_password=False), name


def drop_postgres(base_url: str, name: str) -> None:
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def job_spec(**overrides: object) -> dict:
    """A valid job spec (API.md's example shape) with ``overrides`` applied."""
    spec: dict = {
        "name": "resnet50-imagenet",
        "workload": {"model": "ResNet-50", "batch_size": 128, "steps": 40000},
        "resources": {"gpus": 1, "gpu_types": ["V100", "A100"]},
        "deadline": "2026-12-05T12:00:00Z",
        "max_cost": "250.00",
        "market": "auto",
        "checkpoint": {"interval_minutes": 30, "size_gb": 5},
        "run": dict(RUN),
    }
    spec.update(overrides)
    return spec


def quote_spec(**overrides: object) -> dict:
    """``job_spec`` without its ``run`` block (a quote needs none)."""
    spec = job_spec(**overrides)
    if "run" not in overrides:
        del spec["run"]
    return spec


def worst_case(client, headers, spec: dict) -> str:  # type: ignore[no-untyped-def]
    """The worst-case cost of the plan a submission of ``spec`` would get (a quote)."""
    response = client.post("/v1/quotes", json=spec, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["plans"][0]["worst_case_cost"]


def reservation(client, make_team, spec: dict) -> str:  # type: ignore[no-untyped-def]
    """What a submission of ``spec`` reserves (``admission.reservation``): the job submitted
    once, by a team of its own."""
    _, headers = make_team(limit="100000.00")
    response = client.post("/v1/jobs", json=spec, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()["reserved"]


def reachable(port: int) -> bool:
    """Whether a server listens on ``port`` on loopback (RabbitMQ, Redis, ...)."""
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def moto_s3() -> Iterator[str]:
    """A moto S3 server on a free loopback port, for the test's duration; yields its URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def moto_store(endpoint: str, bucket: str | None = None) -> S3CheckpointStore:
    """The broker's bucket (``settings.checkpoint_bucket`` unless given) on a moto server,
    created."""
    from broker.settings import get_settings

    store = S3CheckpointStore(
        bucket or get_settings().checkpoint_bucket,
        endpoint_url=endpoint,
        access_key_id="testing",
        secret_access_key="testing",
        retry=FAST_RETRY,
    )
    store.ensure_bucket()
    return store
