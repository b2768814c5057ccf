"""Teams, their budgets and API keys; turning a bearer token into a principal."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam
from sqlmodel import Session, select

from broker.core.errors import Conflict, NotFound
from broker.db.engine import begin_write
from broker.db.ids import new_id
from broker.db.models import ApiKey, Team
from broker.services.ledger import BudgetFigures, lock_team, team_budget

KEY_PREFIX = "brk_"


@dataclass(frozen=True)
class Principal:
    """Who is calling: the admin (team_id None) or one team."""

    team_id: str | None

    @property
    def is_admin(self) -> bool:
        return self.team_id is None


def hash_token(token: str) -> str:
    """SHA-256 hex of a token: what the database keeps instead of the token."""
    return hashlib.sha256(token.encode()).hexdigest()


# Built once: the columns only (no ORM object), on every authenticated request.
_KEY_BY_HASH = select(ApiKey.team_id, ApiKey.token_hash, ApiKey.revoked_at).where(
    ApiKey.token_hash == bindparam("digest")
)


class TrustedKeys:
    """Team keys this process found live in the last ``seconds`` (wall): their digest and
    team, so that a busy client's requests do not each read its key.

    Only live keys are kept; a revocation through this process forgets its key at once, and
    for good (a check that read the key just before the revocation cannot trust it again).
    """

    MAX_ENTRIES = 10_000

    def __init__(self) -> None:
        self._keys: dict[str, tuple[str, float]] = {}  # digest -> (team_id, checked at)
        self._revoked: set[str] = set()  # revocation is final; this process's are few
        self._lock = threading.Lock()

    def team(self, digest: str, seconds: float) -> str | None:
        """The team of a key checked less than ``seconds`` ago, else None."""
        entry = self._keys.get(digest)
        if entry is None or time.monotonic() - entry[1] >= seconds:
            return None
        return entry[0]

    def trust(self, digest: str, team_id: str) -> None:
        """Remember a key found live just now (unless this process revoked it)."""
        with self._lock:
            if digest in self._revoked:
                return
            if len(self._keys) >= self.MAX_ENTRIES:
                self._keys.clear()
            self._keys[digest] = (team_id, time.monotonic())

    def forget(self, digest: str, *, revoked: bool = False) -> None:
        """Stop trusting a key; ``revoked``: never trust it again."""
        with self._lock:
            self._keys.pop(digest, None)
            if revoked:
                self._revoked.add(digest)


TRUSTED_KEYS = TrustedKeys()


def _admin(token: str, admin_token: str | None) -> bool:
    return bool(admin_token) and hmac.compare_digest(token.encode(), str(admin_token).encode())


def trusted_principal(
    token: str, admin_token: str | None, trust_seconds: float
) -> Principal | None:
    """The admin, or a team whose key this process checked less than ``trust_seconds`` ago;
    None when the token needs ``authenticate`` (no I/O here)."""
    if _admin(token, admin_token):
        return Principal(team_id=None)
    if trust_seconds <= 0 or not token.startswith(KEY_PREFIX):
        return None
    team_id = TRUSTED_KEYS.team(hash_token(token), trust_seconds)
    return Principal(team_id=team_id) if team_id is not None else None


def authenticate(session: Session, token: str, admin_token: str | None) -> Principal | None:
    """The principal a bearer token stands for, or None when it is unknown or revoked."""
    if _admin(token, admin_token):
        return Principal(team_id=None)
    if not token.startswith(KEY_PREFIX):
        return None
    digest = hash_token(token)
    key = session.execute(_KEY_BY_HASH, {"digest": digest}).first()
    if key is None or key.revoked_at is not None:
        TRUSTED_KEYS.forget(digest)
        return None
    if not hmac.compare_digest(key.token_hash, digest):
        return None
    TRUSTED_KEYS.trust(digest, key.team_id)
    return Principal(team_id=key.team_id)


def live_key_for_token(session: Session, token: str) -> ApiKey | None:
    """The unrevoked key whose token is ``token``, or None (the dashboard signs its id in)."""
    if not token.startswith(KEY_PREFIX):
        return None
    key = session.exec(select(ApiKey).where(ApiKey.token_hash == hash_token(token))).first()
    return key if key is not None and key.revoked_at is None else None


def live_key(session: Session, key_id: str) -> ApiKey | None:
    """The key ``key_id`` unless it is unknown or revoked (checked on every dashboard page)."""
    key = session.get(ApiKey, key_id)
    return key if key is not None and key.revoked_at is None else None


def create_team(
    session: Session, name: str, limit: int, period: str, alert_at: float, now: datetime
) -> Team:
    """A new team with its budget; names are unique (409 otherwise)."""
    begin_write(session)
    if session.exec(select(Team).where(Team.name == name)).first() is not None:
        raise Conflict(f"a team named {name!r} already exists")
    team = Team(
        id=new_id("team"),
        name=name,
        budget_limit_micros=limit,
        budget_period=period,
        alert_at=alert_at,
        created_at=now,
        updated_at=now,
    )
    session.add(team)
    session.commit()
    return team


def get_team(session: Session, team_id: str) -> Team:
    """One team, or NotFound."""
    team = session.get(Team, team_id)
    if team is None:
        raise NotFound(f"team {team_id} not found")
    return team


def list_teams(session: Session) -> list[Team]:
    """All teams, oldest first."""
    return list(session.exec(select(Team).order_by(Team.id)).all())


def update_budget(
    session: Session,
    team_id: str,
    now: datetime,
    limit: int | None = None,
    period: str | None = None,
    alert_at: float | None = None,
) -> Team:
    """Change a team's budget; lowering it below what is spent and reserved is allowed."""
    team = lock_team(session, team_id)
    if limit is not None:
        team.budget_limit_micros = limit
    if period is not None:
        team.budget_period = period
    if alert_at is not None:
        team.alert_at = alert_at
    team.updated_at = now
    session.add(team)
    session.commit()
    return team


def budget_of(session: Session, team_id: str, now: datetime) -> tuple[Team, BudgetFigures]:
    """A team with its budget figures at ``now``."""
    team = get_team(session, team_id)
    return team, team_budget(session, team, now)


def create_key(session: Session, team_id: str, name: str, now: datetime) -> tuple[ApiKey, str]:
    """A new key for a team; the token is returned here and never again."""
    begin_write(session)
    get_team(session, team_id)
    token = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        id=new_id("key"),
        team_id=team_id,
        name=name,
        prefix=token[:12],
        token_hash=hash_token(token),
        created_at=now,
    )
    session.add(key)
    session.commit()
    return key, token


def revoke_key(session: Session, team_id: str, key_id: str, now: datetime) -> None:
    """Revoke a key at once; revoking twice is fine, a key of another team is NotFound."""
    begin_write(session)
    key = session.get(ApiKey, key_id)
    if key is None or key.team_id != team_id:
        raise NotFound(f"key {key_id} not found")
    if key.revoked_at is None:
        key.revoked_at = now
        session.add(key)
        session.commit()
    TRUSTED_KEYS.forget(key.token_hash, revoked=True)
