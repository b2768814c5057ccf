"""The client commands' connection: a ``BrokerClient`` on ``BROKER_API_URL`` with the token in
``BROKER_API_TOKEN`` (the admin token for ``broker admin``, a team key for the others), and
any refusal of the API as the command's one-line error and exit 1."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from pydantic import ValidationError

from broker.cli.output import fail
from broker.client import BrokerApiError, BrokerClient, BrokerUnreachable
from broker.settings import Settings, get_settings

Kind = Literal["admin", "team"]
TOKEN_OF: dict[Kind, str] = {"admin": "the admin token", "team": "a team key"}


def error_message(error: BrokerApiError) -> str:
    """The API's own words for a failed request, on one line, with what to check."""
    if isinstance(error, BrokerUnreachable):
        if error.code == "timeout":
            return f"{error.message} (BROKER_API_URL)"
        return f"{error.message} Set BROKER_API_URL to its address"
    if error.code == "not_json":
        return f"{error.message}; is BROKER_API_URL the broker API?"
    text = str(error)
    if error.status in (401, 403):
        text += "; check BROKER_API_TOKEN (admin commands: the admin token, others: a team key)"
    return text


def _settings() -> Settings:
    try:
        return get_settings()
    except ValidationError as error:
        fail(f"invalid BROKER_ setting: {' '.join(str(error).split())}")


@contextmanager
def connect(kind: Kind) -> Iterator[BrokerClient]:
    """A client on BROKER_API_URL with BROKER_API_TOKEN, which must be ``kind``'s token; a
    BrokerApiError inside the block ends the command with the API's message."""
    settings = _settings()
    token = settings.api_token.get_secret_value().strip() if settings.api_token else ""
    if not token:
        fail(f"no API token: set BROKER_API_TOKEN to {TOKEN_OF[kind]}")
    try:
        client = BrokerClient(settings.api_url, token)
    except ValueError as error:
        fail(f"BROKER_API_URL {error}")
    try:
        with client:
            yield client
    except BrokerApiError as error:
        fail(error_message(error))
