"""Refreshing prices from the clouds' pricing APIs into the database every process plans on.

Each source (AWS: Price List API and spot price history; GCP: Cloud Billing Catalog) is asked
for the current prices of the planning's launchable rows. What they answer is stored as
``PriceRecord`` rows in one transaction, with one ``PriceSnapshot`` per source (how many
prices, or the error), and old history is pruned. A failed source stores nothing, so the
stored prices stay. The refreshing process syncs its planning at once; the others notice
the new version on their next check (``Planning.sync``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Engine

from broker.core.offers import PriceObservation
from broker.db.engine import begin_write, open_session
from broker.db.models import PriceSnapshot
from broker.services.market_prices import prune, store
from broker.services.quoting import Planning
from broker.settings import Settings, get_settings

log = logging.getLogger(__name__)


def _ask(run: Callable[[], Any]) -> tuple[list[PriceObservation], str | None]:
    """A source's observations and error; an exception is that source's error."""
    try:
        outcome = run()
    except Exception as failure:  # one failing source must not stop the other
        return [], f"{type(failure).__name__}: {failure}"
    if outcome.error:
        return [], outcome.error
    return list(outcome.observations), None


def refresh(planning: Planning, engine: Engine, now: datetime) -> dict[str, Any]:
    """Ask every cloud for the prices of ``planning``'s launchable rows, store them with a
    snapshot per source, prune history older than ``price_history_days`` and sync
    ``planning``. Returns per source ``"ok"`` or its error, and the counts."""
    from pricing.refresh import refresh_aws, refresh_gcp

    settings = planning.settings or get_settings()
    table = planning.base
    sources: dict[str, Callable[[], Any]] = {
        "aws": lambda: refresh_aws(
            table,
            now,
            session=boto_session(settings),
            endpoint_url=settings.aws_endpoint_url,
            regions=settings.aws_regions,
        ),
        "gcp": lambda: refresh_gcp(
            table,
            now,
            settings.gcp_project,
            endpoint_url=settings.gcp_endpoint_url,
            billing_endpoint_url=getattr(settings, "gcp_billing_endpoint_url", None),
        ),
    }
    answers = {source: _ask(run) for source, run in sources.items()}
    results: dict[str, Any] = {}
    with open_session(engine) as session:
        begin_write(session)
        stored = 0
        for source, (observations, error) in answers.items():
            if error:
                log.warning(
                    "price refresh from %s failed, keeping stored prices: %s", source, error
                )
            stored += store(session, observations)
            session.add(
                PriceSnapshot(
                    source=source,
                    taken_at=now,
                    offers=len(observations),
                    error=error and error[:1000],
                )
            )
            results[source] = error or "ok"
        results["stored"] = stored
        results["pruned"] = prune(session, now - timedelta(days=settings.price_history_days))
        session.commit()
        planning.sync(session, force=True)
    return results


def boto_session(settings: Settings) -> Any:
    """A boto3 session with the broker's AWS credentials (the default chain when unset)."""
    import boto3

    secret = settings.aws_secret_access_key
    return boto3.session.Session(
        aws_access_key_id=settings.aws_access_key_id,
        aws_secret_access_key=secret.get_secret_value() if secret else None,
        region_name=settings.aws_region,
    )
