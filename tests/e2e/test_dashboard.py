"""The dashboard in headless Chromium, on jobs the embedded stack really ran.

A few of the demo's jobs run to the end on the local clouds (real Celery worker, market
replay, instances running the agent and examples/train.py); then Debian's Chromium, driven
by selenium, logs in and loads every page: the jobs are listed, every chart canvas has
pixels drawn, the browser logs no error, and a screenshot of each page lands in
``test-artifacts/`` (or $BROKER_TEST_ARTIFACTS).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
ARTIFACTS = Path(
    os.environ.get("BROKER_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts")
)

if os.environ.get("BROKER_TEST_DATABASE_URL"):
    pytest.skip(
        "the dashboard runs on the embedded stack; the SQLite pass covers it",
        allow_module_level=True,
    )
if not (CHROMIUM and CHROMEDRIVER):
    pytest.skip(
        "Chromium and chromedriver are not installed (apt-get install chromium chromium-driver)",
        allow_module_level=True,
    )
selenium = pytest.importorskip("selenium")

CANVAS_HAS_PIXELS = """
const c = arguments[0];
const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
for (let i = 3; i < data.length; i += 4) { if (data[i] !== 0) return true; }
return false;
"""


@pytest.fixture(scope="module")
def ran_jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """The embedded stack after four of the demo's jobs finished; yields (stack, client)."""
    from broker import clock
    from broker.devstack.demo import TERMINAL, DemoClient, demo_jobs
    from broker.devstack.stack import EmbeddedStack

    with EmbeddedStack(tmp_path_factory.mktemp("dashboard"), scale=1200.0) as stack:
        client = DemoClient(stack.api_url, stack.admin_token)
        client.team("vision", "400.00")
        client.team("nlp", "250.00")
        wanted = {"resnet18-cifar", "a3c-atari", "lm-tight", "recsys-ml20m"}
        jobs = [j for j in demo_jobs(clock.now()) if j.spec["name"] in wanted]
        for job in jobs:
            client.submit(job)
        assert all(j.id for j in jobs), [j.refusal for j in jobs]
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            statuses = [client.job(j.team, j.id or "")["status"] for j in jobs]
            if all(s in TERMINAL for s in statuses):
                break
            time.sleep(0.5)
        yield stack, client


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM or ""
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1400,1600")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER or ""), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def _login(browser: Any, base: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{base}/ui/login")
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 10).until(
        lambda d: "/ui/login" not in d.current_url or d.find_elements(By.CSS_SELECTOR, "p.error")
    )
    WebDriverWait(browser, 10).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )


def _body_text(browser: Any) -> str:
    """The page's text, read again if a navigation or the page's auto-refresh replaced it."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _ in range(20):
        try:
            return str(browser.find_element(By.TAG_NAME, "body").text)
        except StaleElementReferenceException:
            time.sleep(0.2)
    raise AssertionError("the page never settled")


def _check_page(browser: Any, name: str) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _ in range(5):  # a page with unfinished jobs reloads itself: check a settled copy
        try:
            canvases = browser.find_elements(By.CSS_SELECTOR, "canvas[data-chart]")
            assert canvases, "no chart on the page"
            empty = [
                c.get_attribute("id")
                for c in canvases
                if not browser.execute_script(CANVAS_HAS_PIXELS, c)
            ]
            break
        except StaleElementReferenceException:
            time.sleep(0.3)
    assert empty == [], f"empty charts: {empty}"
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / f"dashboard-{name}.png"))


def test_admin_sees_every_team_with_charts_and_jobs(ran_jobs, browser) -> None:  # type: ignore[no-untyped-def]

    stack, _client = ran_jobs
    _login(browser, stack.api_url, stack.admin_token)
    assert browser.current_url.endswith("/ui/")
    text = _body_text(browser)
    for name in ("vision", "nlp", "resnet18-cifar", "a3c-atari", "lm-tight", "recsys-ml20m"):
        assert name in text
    assert "admin (all teams)" in text
    _check_page(browser, "overview-admin")


def test_job_page_shows_the_timeline_and_spend_curve(ran_jobs, browser) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    stack, _client = ran_jobs
    _login(browser, stack.api_url, stack.admin_token)
    browser.find_element(By.LINK_TEXT, "lm-tight").click()
    text = _body_text(browser)
    assert "lm-tight" in text and "Attempts" in text
    assert "succeeded" in text or "running" in text
    _check_page(browser, "job")


def test_team_key_sees_only_its_team(ran_jobs, browser) -> None:  # type: ignore[no-untyped-def]

    stack, client = ran_jobs
    token = client.tokens["nlp"]
    browser.delete_all_cookies()
    _login(browser, stack.api_url, token)
    text = _body_text(browser)
    assert "team nlp" in text and "lm-tight" in text
    assert "resnet18-cifar" not in text and "vision" not in text
    _check_page(browser, "overview-team")


def test_bad_token_is_refused_on_the_login_page(ran_jobs, browser) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    stack, _client = ran_jobs
    browser.delete_all_cookies()
    _login(browser, stack.api_url, "tok_not_a_key")
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    error = WebDriverWait(browser, 10).until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "p.error"))
    )
    assert "unknown or revoked token" in error.text
    browser.get(f"{stack.api_url}/ui/")
    assert browser.current_url.endswith("/ui/login")
