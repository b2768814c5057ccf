"""Building the runner and its parts from settings (one place, used by tasks and demo)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from broker.core import policy
from broker.db.engine import get_engine
from broker.private_files import AGENT_SECRET_FILE, kept_secret
from broker.services.plan_store import share_plans
from broker.services.quoting import get_planning
from broker.services.runner import Runner
from broker.services.spend_control import SpendControls
from broker.settings import Settings, get_settings
from providers.registry import build_providers


def agent_secret(settings: Settings) -> str:
    """The secret attempt tokens derive from: BROKER_AGENT_SECRET, else one generated once and
    kept in the data folder, so a restart derives the same tokens for the same attempts."""
    if settings.agent_secret is not None:
        return settings.agent_secret.get_secret_value()
    return kept_secret(Path(settings.data_dir) / AGENT_SECRET_FILE)


@lru_cache
def get_runner() -> Runner:
    """The process-wide runner; its policy's plans are shared with the machine's other
    processes (``plan_store``)."""
    settings = get_settings()
    share_plans(policy.PLANS, settings.resolved_plan_store_dir)
    return Runner(
        get_engine(),
        build_providers(settings),
        get_planning(),
        agent_secret=agent_secret(settings),
        api_url=settings.api_url,
        tick_seconds=settings.tick_seconds,
        checkpoint_bucket=settings.checkpoint_bucket,
        controls=SpendControls(
            lease_seconds=settings.lease_seconds,
            lease_ticks=settings.lease_ticks,
            max_live_per_team=settings.max_live_attempts_per_team,
            max_live_total=settings.max_live_attempts,
        ),
        agent_silence_seconds=settings.agent_silence_seconds,
        agent_boot_grace_seconds=settings.agent_boot_grace_seconds,
        agent_report_seconds=settings.agent_report_seconds,
        reconcile_min_age_seconds=settings.reconcile_min_age_seconds,
    )
