"""Teams, their budgets and API keys; turning a bearer token into a principal."""

from __future__ import annotations

import hashlib
import hmac
import secrets
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


def authenticate(session: Session, token: str, admin_token: str | None) -> Principal | None:
    """The principal a bearer token stands for, or None when it is unknown or revoked."""
    if admin_token and hmac.compare_digest(token.encode(), admin_token.encode()):
        return Principal(team_id=None)
    if not token.startswith(KEY_PREFIX):
        return None
    digest = hash_token(token)
    key = session.execute(_KEY_BY_HASH, {"digest": digest}).first()
    if key is None or key.revoked_at is not None:
        return None
    if not hmac.compare_digest(key.token_hash, digest):
        return None
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
