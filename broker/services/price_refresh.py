"""Refreshing spot prices from the clouds into the offers the broker plans with.

Each source (AWS spot price history, GCP) refreshes ``Planning.offers`` in place when it
answers; a failure keeps the last good table. Every attempt is recorded as a
``PriceSnapshot``.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Engine

from broker.db.engine import begin_write, open_session
from broker.db.models import PriceSnapshot
from broker.services.quoting import Planning
from broker.settings import Settings, get_settings

log = logging.getLogger(__name__)


def refresh(planning: Planning, engine: Engine, now: datetime) -> dict[str, Any]:
    """Refresh spot prices from the configured clouds; a failure keeps the last table."""
    from pricing.refresh import refresh_aws, refresh_gcp

    settings = planning.settings or get_settings()
    results: dict[str, Any] = {}
    for source, run in (
        (
            "aws",
            lambda table: refresh_aws(
                table,
                now,
                session=_boto_session(settings),
                endpoint_url=settings.aws_endpoint_url,
                regions=settings.aws_regions,
            ),
        ),
        (
            "gcp",
            lambda table: refresh_gcp(
                table, now, settings.gcp_project, endpoint_url=settings.gcp_endpoint_url
            ),
        ),
    ):
        try:
            result = run(planning.offers)
            error = result.error
        except Exception as failure:  # the last good table stays
            result, error = None, f"{type(failure).__name__}: {failure}"
        if result is not None and error is None:
            planning.offers = result.table
        if error:
            log.warning("price refresh from %s failed, keeping last prices: %s", source, error)
        with open_session(engine) as session:
            begin_write(session)
            session.add(
                PriceSnapshot(source=source, taken_at=now, offers=len(planning.offers), error=error)
            )
            session.commit()
        results[source] = error or "ok"
    return results


def _boto_session(settings: Settings) -> Any:
    import boto3

    secret = settings.aws_secret_access_key
    return boto3.session.Session(
        aws_access_key_id=settings.aws_access_key_id,
        aws_secret_access_key=secret.get_secret_value() if secret else None,
        region_name=settings.aws_region,
    )
