"""The dashboard's defences: signed sessions, same-origin form posts, and response headers.

- The session cookie holds no token: a signed (itsdangerous), timestamped payload naming what
  the login proved: a team key's id, or the admin token's fingerprint. Every page checks it
  against the database (a revoked key stops at once) or the current admin token, and refuses
  it past ``BROKER_SESSION_SECONDS`` (wall time). The signing key is ``BROKER_SESSION_SECRET``,
  else derived from the admin token (so every API process agrees), else kept in the data folder.
- ``Secure`` when the request came over HTTPS (or ``X-Forwarded-Proto: https`` from a proxy
  trusted with ``BROKER_TRUST_FORWARDED_PROTO``).
- Login and logout must come from the dashboard's own origin (``Origin``, else ``Referer``).
- ``DashboardHeaders`` gives every dashboard page a strict CSP (scripts and styles from the
  vendored static files only; the charts' data is an inert JSON block), ``X-Frame-Options:
  DENY``, ``nosniff`` and ``Cache-Control: no-store``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request, Response
from itsdangerous import BadSignature, URLSafeTimedSerializer
from sqlmodel import Session

from broker.private_files import kept_secret
from broker.services.teams import Principal, live_key, live_key_for_token
from broker.settings import Settings, get_settings

COOKIE = "broker_session"
SESSION_SECRET_FILE = "session_secret"


def _serializer(settings: Settings) -> URLSafeTimedSerializer:
    if settings.session_secret is not None:
        secret = settings.session_secret.get_secret_value()
    elif settings.admin_token is not None:
        admin = settings.admin_token.get_secret_value().encode()
        secret = hmac.new(admin, b"broker dashboard sessions", hashlib.sha256).hexdigest()
    else:
        secret = kept_secret(settings.data_dir / SESSION_SECRET_FILE)
    return URLSafeTimedSerializer(secret, salt="broker-ui-session")


def _admin_fingerprint(settings: Settings) -> str | None:
    """Ties an admin session to the admin token of its login: a new token ends it."""
    if settings.admin_token is None:
        return None
    key = _serializer(settings).secret_key
    admin = settings.admin_token.get_secret_value().encode()
    return hmac.new(key, b"admin:" + admin, hashlib.sha256).hexdigest()[:32]


def sign_in(session: Session, token: str) -> str | None:
    """The cookie value for a login with ``token``; None when the token is unknown or revoked."""
    settings = get_settings()
    subject: dict[str, Any]
    admin = settings.admin_token
    if admin is not None and hmac.compare_digest(token.encode(), admin.get_secret_value().encode()):
        subject = {"admin": _admin_fingerprint(settings)}
    else:
        key = live_key_for_token(session, token)
        if key is None:
            return None
        subject = {"key": key.id}
    return str(_serializer(settings).dumps({"sid": secrets.token_urlsafe(16), **subject}))


def principal_of(session: Session, cookie: str | None) -> Principal | None:
    """Who a session cookie stands for now; None if forged, expired, revoked or superseded."""
    if not cookie:
        return None
    settings = get_settings()
    try:
        payload = _serializer(settings).loads(cookie, max_age=int(settings.session_seconds))
    except BadSignature:  # SignatureExpired included
        return None
    if not isinstance(payload, dict):
        return None
    if "admin" in payload:
        current = _admin_fingerprint(settings)
        fingerprint = str(payload["admin"])
        if current is None or not hmac.compare_digest(fingerprint, current):
            return None
        return Principal(team_id=None)
    key = live_key(session, str(payload.get("key", "")))
    return None if key is None else Principal(team_id=key.team_id)


def _scheme(request: Request) -> str:
    if get_settings().trust_forwarded_proto:
        forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
        if forwarded in ("http", "https"):
            return forwarded
    return request.url.scheme


def set_session(response: Response, request: Request, value: str, path: str) -> None:
    """The session cookie: HttpOnly, SameSite=Strict, scoped to ``path``, Secure over HTTPS."""
    response.set_cookie(
        COOKIE,
        value,
        max_age=int(get_settings().session_seconds),
        path=path,
        secure=_scheme(request) == "https",
        httponly=True,
        samesite="strict",
    )


def same_origin(request: Request) -> bool:
    """Whether a form post comes from this site: its ``Origin`` (or, without one, its
    ``Referer``) is this request's own scheme and host."""
    own = f"{_scheme(request)}://{request.headers.get('host', '')}".lower()
    origin = request.headers.get("origin")
    if origin is None:
        referer = urlsplit(request.headers.get("referer", ""))
        if not referer.scheme:
            return False
        origin = f"{referer.scheme}://{referer.netloc}"
    return hmac.compare_digest(origin.lower().encode(), own.encode())


CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_PAGE_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"cache-control", b"no-store"),
    (b"referrer-policy", b"same-origin"),
]


class DashboardHeaders:
    """ASGI middleware: the security headers on every response under ``base`` (static files
    get ``nosniff`` only, so browsers may cache them)."""

    def __init__(self, app: Any, base: str, static: str) -> None:
        self.app = app
        self.base = base
        self.static = static

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == self.base or path.startswith(self.base + "/")):
            await self.app(scope, receive, send)
            return
        extra = _PAGE_HEADERS[2:3] if path.startswith(self.static + "/") else _PAGE_HEADERS

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                names = {extra_name for extra_name, _ in extra}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": kept + list(extra)}
            await send(message)

        await self.app(scope, receive, send_with_headers)
