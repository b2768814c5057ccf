"""Building the runner and its parts from settings (one place, used by tasks and demo)."""

from __future__ import annotations

from functools import lru_cache

from broker.db.engine import get_engine
from broker.services.quoting import get_planning
from broker.services.runner import Runner
from broker.settings import Settings, get_settings
from providers.registry import build_providers


def agent_secret(settings: Settings) -> str:
    """The secret attempt tokens derive from: its own setting, else the admin token."""
    secret = settings.agent_secret or settings.admin_token
    if secret is None:
        raise RuntimeError("set BROKER_AGENT_SECRET or BROKER_ADMIN_TOKEN")
    return secret.get_secret_value()


@lru_cache
def get_runner() -> Runner:
    """The process-wide runner."""
    settings = get_settings()
    return Runner(
        get_engine(),
        build_providers(settings),
        get_planning(),
        agent_secret=agent_secret(settings),
        api_url=settings.api_url,
        tick_seconds=settings.tick_seconds,
        checkpoint_bucket=settings.checkpoint_bucket,
    )
