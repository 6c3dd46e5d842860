"""The admin in a real browser (Debian's chromium, headless).

Through the production WSGI server (gunicorn with pin_profile/gunicorn_conf.py, as the
admin's own database role, DEBUG off, a real secret key, static files collected and served
by WhiteNoise, every HTTPS setting on, the browser's requests marked as forwarded by a TLS
proxy): a staff viewer logs in, the pages have their CSS, and the viewer browses and filters
the ledger, searches an owner, opens a marker read-only, and looks at the overview. Against
the test server: a non-staff user only ever gets the login page.

Screenshots go to artifacts/admin-screenshots/ (the path is printed for the CI log)."""

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from django.contrib.auth.models import User
from django.test import Client
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from reminders.models import DocumentExpiryReminder
from tests.support.admin_data import PASSWORD, finished_run, ledger_rows, outbox_message, staff_viewer
from tests.support.admin_server import (
    PRODUCTION_TLS,
    AdminServer,
    admin_env,
    admin_server_on_a_known_port,
    collect_static,
)

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "admin-screenshots"
WAIT_SECONDS = 20

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.fail("chromium/chromedriver missing: scripts/test.sh installs them (scripts/browser.sh)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-background-networking", "--window-size=1920,1200"):
        options.add_argument(argument)
    # Under scripts/test-clock.sh the browser runs without libfaketime, which it does not
    # survive; its clock does not matter: this process's live server renders the pages.
    real_clock = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER), env=real_clock), options=options)
    yield driver
    driver.quit()


def wait(driver: WebDriver) -> WebDriverWait[WebDriver]:
    return WebDriverWait(driver, WAIT_SECONDS)


def screenshot(driver: WebDriver, name: str, capsys: pytest.CaptureFixture[str]) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    assert driver.save_screenshot(str(path))
    with capsys.disabled():
        print(f"\nadmin screenshot: {path}")  # noqa: T201 (the CI log shows where it is)
    return path


def log_in(driver: WebDriver, base_url: str, next_path: str, username: str) -> None:
    driver.get(base_url + next_path)
    wait(driver).until(ec.presence_of_element_located((By.ID, "login-form")))
    driver.find_element(By.ID, "id_username").send_keys(username)
    driver.find_element(By.ID, "id_password").send_keys(PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "#login-form input[type=submit]").click()


def column(driver: WebDriver, name: str) -> list[str]:
    return [cell.text for cell in driver.find_elements(By.CSS_SELECTOR, f"#result_list td.field-{name}, "
                                                                         f"#result_list th.field-{name}")]


@pytest.fixture
def ledger(transactional_db: None) -> dict[str, Any]:
    today = datetime.now(UTC).replace(hour=3, minute=0, second=0, microsecond=0)
    owners = []
    for days_ago in range(0, 30, 3):
        owners += ledger_rows(2, reminded_at=today - timedelta(days=days_ago), thresholds=(30, 7))
        ledger_rows(1 + days_ago % 4, reminded_at=today - timedelta(days=days_ago), thresholds=(1, 0))
    finished_run(today)
    outbox_message(parked=True, attempts=5, last_error="MSG_SIZE_TOO_LARGE")
    return {"owner": owners[0], "viewer": staff_viewer()}


@pytest.fixture(scope="module")
def static_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("static")
    collect_static(target)
    return target


@pytest.fixture
def admin_behind_tls(browser: webdriver.Chrome, static_root: Path) -> Iterator[AdminServer]:
    """gunicorn with every HTTPS setting on; the browser's requests carry the header a TLS
    proxy adds (gunicorn trusts it from loopback), so the cookies are Secure, plain HTTP is
    redirected, and the browser's http:// origin is trusted for CSRF as the proxy's would be."""

    def env_for(port: int) -> dict[str, str]:
        return admin_env(static_root, **PRODUCTION_TLS,
                         DJANGO_CSRF_TRUSTED_ORIGINS=f"http://127.0.0.1:{port}")

    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"X-Forwarded-Proto": "https"}})
    try:
        with admin_server_on_a_known_port(env_for) as server:
            yield server
    finally:
        browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})


def assert_styled_by_base_css(driver: WebDriver) -> None:
    """base.css arrived and applies: its rules are loaded and the header has its colour."""
    sheets = driver.execute_script(
        "return [...document.styleSheets].map(s => [s.href, s.cssRules.length])")
    rules = {href.rsplit("/static/", 1)[-1]: count for href, count in sheets if href}
    assert rules.get("admin/css/base.css", 0) > 100, rules
    header = driver.execute_script(
        "return getComputedStyle(document.getElementById('header')).backgroundColor")
    assert header == "rgb(65, 118, 144)"  # base.css: --header-bg is --secondary, #417690


@pytest.mark.real_clock
def test_staff_viewer_browses_the_ledger_read_only(
    browser: webdriver.Chrome, admin_behind_tls: AdminServer, ledger: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    base_url = admin_behind_tls.url
    plain = requests.get(f"{base_url}/admin/", allow_redirects=False, timeout=WAIT_SECONDS)
    assert plain.status_code == 301 and plain.headers["Location"].startswith("https://")

    browser.delete_all_cookies()
    log_in(browser, base_url, "/admin/reminders/documentexpiryreminder/", "viewer")
    wait(browser).until(ec.presence_of_element_located((By.ID, "result_list")))
    assert_styled_by_base_css(browser)
    session = browser.get_cookie("sessionid")
    assert session is not None and session["secure"] and session["httpOnly"]
    assert "about" not in browser.find_element(By.CSS_SELECTOR, "p.paginator").text
    screenshot(browser, "ledger-list.png", capsys)

    browser.find_element(By.LINK_TEXT, "7 days").click()
    wait(browser).until(ec.url_contains("threshold_days=7"))
    wait(browser).until(ec.presence_of_element_located((By.ID, "result_list")))
    thresholds = column(browser, "threshold_days")
    assert thresholds and set(thresholds) == {"7"}

    owner = ledger["owner"]
    search = browser.find_element(By.ID, "searchbar")
    search.clear()
    search.send_keys(str(owner.owner_user_id))
    search.submit()
    wait(browser).until(ec.url_contains(f"q={owner.owner_user_id}"))
    wait(browser).until(ec.presence_of_element_located((By.ID, "result_list")))
    assert set(column(browser, "owner_user_id")) == {str(owner.owner_user_id)}
    assert len(column(browser, "document_id")) == DocumentExpiryReminder.objects.filter(
        owner_user_id=owner.owner_user_id, threshold_days=7).count() == 2

    browser.find_element(By.CSS_SELECTOR, "#result_list th.field-document_id a").click()
    wait(browser).until(ec.url_contains("/change/"))
    wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, "div.readonly")))
    assert str(owner.owner_user_id) in browser.find_element(By.ID, "content").text
    assert browser.find_elements(By.CSS_SELECTOR, "input[name=_save], input[name=_continue]") == []
    assert browser.find_elements(By.CSS_SELECTOR, "a.deletelink, input[name=_addanother]") == []
    assert browser.find_elements(By.CSS_SELECTOR, "#content form input[type=submit]") == []

    browser.get(base_url + "/admin/reminders/documentexpiryreminder/overview/")
    wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, "#overview-chart svg rect")))
    assert_styled_by_base_css(browser)
    assert "Succeeded" in browser.find_element(By.ID, "overview-last-cycle").text
    assert "1 parked" in browser.find_element(By.ID, "overview-outbox").text
    screenshot(browser, "overview.png", capsys)


def test_non_staff_user_gets_the_login_page(
    browser: webdriver.Chrome, live_server: Any, transactional_db: None
) -> None:
    investor = User.objects.create_user("investor", password=PASSWORD)
    browser.delete_all_cookies()

    log_in(browser, live_server.url, "/admin/reminders/documentexpiryreminder/", "investor")
    # The refusal is the answer page's error note (the form page before it has none).
    note = wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, ".errornote")))
    assert "staff account" in note.text
    assert "/admin/login/" in browser.current_url

    # Logged in elsewhere on the site, the admin still only shows the login page.
    client = Client()
    client.force_login(investor)
    browser.add_cookie({"name": "sessionid", "value": client.cookies["sessionid"].value, "path": "/"})
    browser.get(live_server.url + "/admin/reminders/documentexpiryreminder/overview/")
    wait(browser).until(ec.url_contains("/admin/login/"))
    assert browser.find_elements(By.ID, "login-form")
    assert browser.find_elements(By.ID, "result_list") == []
