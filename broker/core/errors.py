"""Domain exceptions; the API maps each to one HTTP status in ``broker/api/errors.py``."""

from __future__ import annotations


class BrokerError(Exception):
    """Base of every domain error; ``code`` is the machine-readable name."""

    code = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(BrokerError):
    code = "not_found"


class Conflict(BrokerError):
    code = "conflict"


class Unauthorized(BrokerError):
    """A credential that was once good but is no longer (an expired attempt token)."""

    code = "unauthorized"


class BudgetExceeded(BrokerError):
    code = "budget_exceeded"


class Infeasible(BrokerError):
    code = "infeasible"


class InvalidInput(BrokerError):
    code = "invalid"

    def __init__(self, message: str, field: str | None = None, location: str = "body") -> None:
        super().__init__(message)
        self.field = field
        self.location = location


class IllegalTransition(Conflict):
    """A job status change that the state machine does not allow."""
