"""The dashboard's sessions, origin checks and headers (TestClient; the pages in a browser are
tests/e2e/test_dashboard.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from http.cookies import SimpleCookie

import pytest
from fastapi.testclient import TestClient
from itsdangerous import TimestampSigner, URLSafeTimedSerializer

from broker.api.ui_security import COOKIE
from broker.services.teams import hash_token
from broker.settings import get_settings
from tests.conftest import ADMIN_TOKEN

ORIGIN = {"Origin": "http://testserver"}


def login(client: TestClient, token: str, headers: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return client.post(
        "/ui/login",
        data={"token": token},
        headers=ORIGIN if headers is None else headers,
        follow_redirects=False,
    )


def set_cookie(response) -> SimpleCookie:  # type: ignore[no-untyped-def]
    jar: SimpleCookie = SimpleCookie()
    jar.load(response.headers["set-cookie"])
    return jar


def page(client: TestClient, path: str = "/ui/"):  # type: ignore[no-untyped-def]
    return client.get(path, follow_redirects=False)


def to_login(response) -> bool:  # type: ignore[no-untyped-def]
    return response.status_code == 303 and response.headers["location"] == "/ui/login"


@pytest.fixture
def team_key(client, make_team) -> str:  # type: ignore[no-untyped-def]
    _, headers = make_team(name="vision")
    return str(headers["Authorization"].split()[1])


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Change settings for one test (the settings cache is cleared around it)."""
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def test_the_session_cookie_is_signed_and_holds_no_token(client, team_key) -> None:  # type: ignore[no-untyped-def]
    response = login(client, team_key)

    assert response.status_code == 303 and response.headers["location"] == "/ui/"
    cookie = set_cookie(response)[COOKIE]
    assert team_key not in cookie.value and hash_token(team_key) not in cookie.value
    assert team_key[4:20] not in cookie.value
    assert cookie["httponly"] and cookie["samesite"].lower() == "strict"
    assert cookie["path"] == "/ui" and int(cookie["max-age"]) == 12 * 3600
    assert not cookie["secure"]  # plain HTTP here
    assert page(client).status_code == 200
    # Another login gets another session.
    assert set_cookie(login(client, team_key))[COOKIE].value != cookie.value


def test_a_token_put_in_the_cookie_by_hand_is_not_a_session(client, team_key) -> None:  # type: ignore[no-untyped-def]
    client.cookies.set(COOKIE, team_key, path="/ui")
    assert to_login(page(client))
    client.cookies.set(COOKIE, ADMIN_TOKEN, path="/ui")
    assert to_login(page(client))


def test_a_tampered_cookie_is_refused(client, team_key) -> None:  # type: ignore[no-untyped-def]
    value = set_cookie(login(client, team_key))[COOKIE].value
    payload, rest = value.split(".", 1)
    client.cookies.clear()
    client.cookies.set(COOKIE, payload[:-2] + ("AA" if payload[-2:] != "AA" else "BB") + "." + rest)
    assert to_login(page(client))


def test_a_revoked_key_stops_the_session_at_once(client, make_team, admin_headers) -> None:  # type: ignore[no-untyped-def]
    team, _ = make_team(name="nlp")
    key = client.post(
        f"/v1/teams/{team['id']}/keys", json={"name": "ui"}, headers=admin_headers
    ).json()
    assert login(client, key["token"]).status_code == 303
    assert page(client).status_code == 200

    revoked = client.delete(f"/v1/teams/{team['id']}/keys/{key['id']}", headers=admin_headers)
    assert revoked.status_code == 204

    assert to_login(page(client))


def test_a_new_admin_token_ends_admin_sessions(client, env) -> None:  # type: ignore[no-untyped-def]
    env.setenv("BROKER_SESSION_SECRET", "a-fixed-signing-key")
    assert login(client, ADMIN_TOKEN).status_code == 303
    assert page(client).status_code == 200
    env.setenv("BROKER_ADMIN_TOKEN", "adm_rotated_" + "x" * 20)
    get_settings.cache_clear()
    assert to_login(page(client))


def test_a_session_expires(client, team_key, env) -> None:  # type: ignore[no-untyped-def]
    # 3 s: the signature's age is counted in whole seconds, and a loaded CI machine once took
    # over a second between the login and the first page (a 1 s session had expired)
    env.setenv("BROKER_SESSION_SECONDS", "3")
    assert login(client, team_key).status_code == 303
    assert page(client).status_code == 200
    time.sleep(4.2)
    assert to_login(page(client))


def test_a_session_signed_long_ago_is_refused_even_if_the_cookie_lingers(
    client, team_key, env
) -> None:  # type: ignore[no-untyped-def]
    env.setenv("BROKER_SESSION_SECRET", "a-fixed-signing-key")
    value = set_cookie(login(client, team_key))[COOKIE].value

    class ThirteenHoursAgo(TimestampSigner):
        def get_timestamp(self) -> int:  # itsdangerous's own hook for the signing time
            return int(time.time()) - 13 * 3600

    payload = URLSafeTimedSerializer("a-fixed-signing-key", salt="broker-ui-session").loads(value)
    old = URLSafeTimedSerializer(
        "a-fixed-signing-key", salt="broker-ui-session", signer=ThirteenHoursAgo
    ).dumps(payload)
    client.cookies.clear()
    client.cookies.set(COOKIE, old)
    assert to_login(page(client))


def test_the_cookie_is_secure_over_https(app, team_key, env) -> None:  # type: ignore[no-untyped-def]
    with TestClient(app, base_url="https://testserver") as https:
        response = login(https, team_key, {"Origin": "https://testserver"})
        assert response.status_code == 303
        assert set_cookie(response)[COOKIE]["secure"]


def test_x_forwarded_proto_counts_only_when_trusted(client, team_key, env) -> None:  # type: ignore[no-untyped-def]
    proxied = {"Origin": "https://testserver", "X-Forwarded-Proto": "https"}
    assert login(client, team_key, proxied).status_code == 403  # not trusted: origin is http
    env.setenv("BROKER_TRUST_FORWARDED_PROTO", "true")
    get_settings.cache_clear()
    response = login(client, team_key, proxied)
    assert response.status_code == 303
    assert set_cookie(response)[COOKIE]["secure"]


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Referer": "https://evil.example/ui/login"},
        {},
    ],
    ids=["other-origin", "null-origin", "other-referer", "neither"],
)
def test_login_from_another_site_is_refused(client, team_key, headers) -> None:  # type: ignore[no-untyped-def]
    response = login(client, team_key, headers)
    assert response.status_code == 403
    assert "set-cookie" not in response.headers


def test_login_with_a_same_site_referer_only_is_accepted(client, team_key) -> None:  # type: ignore[no-untyped-def]
    response = login(client, team_key, {"Referer": "http://testserver/ui/login"})
    assert response.status_code == 303


def test_logout_from_another_site_is_refused_and_keeps_the_session(client, team_key) -> None:  # type: ignore[no-untyped-def]
    assert login(client, team_key).status_code == 303
    refused = client.post(
        "/ui/logout", headers={"Origin": "https://evil.example"}, follow_redirects=False
    )
    assert refused.status_code == 403
    assert page(client).status_code == 200
    done = client.post("/ui/logout", headers=ORIGIN, follow_redirects=False)
    assert to_login(done)
    assert to_login(page(client))


def test_dashboard_pages_carry_the_security_headers(client, team_key) -> None:  # type: ignore[no-untyped-def]
    login_page = page(client, "/ui/login")
    assert login(client, team_key).status_code == 303
    responses = [
        login_page,
        page(client),
        page(client, "/ui/jobs/job_unknown"),
        page(client, "/ui"),
    ]
    for response in responses:
        headers = response.headers
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp
        assert headers["x-frame-options"] == "DENY"
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["cache-control"] == "no-store"
    static = client.get("/ui/static/dashboard.js")
    assert static.headers["x-content-type-options"] == "nosniff"
    assert "no-store" not in static.headers.get("cache-control", "")
    api = client.get("/healthz")
    assert "content-security-policy" not in api.headers


def test_the_login_page_says_keys_start_with_brk(client) -> None:  # type: ignore[no-untyped-def]
    text = page(client, "/ui/login").text
    assert "brk_…" in text and "tok_" not in text
