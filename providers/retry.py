"""Bounded retries with exponential backoff and jitter for ``TransientError``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from providers.base import TransientError

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How hard an adapter retries a transient failure before giving up."""

    attempts: int = 6
    initial_wait: float = 0.5
    max_wait: float = 10.0
    total_seconds: float = 60.0

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn``, retrying it on ``TransientError``; the last error is re-raised."""
        retrying = Retrying(
            retry=retry_if_exception_type(TransientError),
            wait=wait_exponential_jitter(
                multiplier=self.initial_wait, max=self.max_wait, jitter=self.initial_wait
            ),
            stop=stop_after_attempt(self.attempts) | stop_after_delay(self.total_seconds),
            before_sleep=before_sleep_log(logger, logging.DEBUG),
            reraise=True,
        )
        return retrying(fn)


FAST_RETRY = RetryPolicy(attempts=8, initial_wait=0.01, max_wait=0.1, total_seconds=10.0)
"""A policy for tests and the local clouds: many quick attempts."""
