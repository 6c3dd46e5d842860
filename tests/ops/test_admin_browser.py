"""The admin in a real browser (Debian's chromium, headless).

Through the production WSGI server (gunicorn with pin_profile/gunicorn_conf.py, as the
admin's own database role, DEBUG off, a real secret key, static files collected and served
by WhiteNoise, every HTTPS setting on, the browser's requests marked as forwarded by a TLS
proxy): a staff viewer logs in, the pages have their CSS, and the viewer browses and filters
the ledger, searches an owner, opens a marker read-only, and looks at the overview. At 1440 px
(a common laptop screen) the run history, the ledger, the outbox and the overview fit the
window: no page scrolls sideways and every table ends inside it. Against the test server: a
non-staff user only ever gets the login page.

Screenshots go to $ADMIN_SCREENSHOT_DIR, by default artifacts/admin-screenshots/ (ignored by
git); their paths are printed for the CI log."""

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

from reminders.models import DocumentExpiryReminder, ReminderRun
from tests.support.admin_data import (
    PASSWORD,
    Owner,
    finished_run,
    ledger_rows,
    outbox_message,
    staff_viewer,
)
from tests.support.admin_server import (
    PRODUCTION_TLS,
    AdminServer,
    admin_env,
    admin_server_on_a_known_port,
    collect_static,
)

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOTS = Path(os.environ.get("ADMIN_SCREENSHOT_DIR")
                   or Path(__file__).resolve().parents[2] / "artifacts" / "admin-screenshots")
WAIT_SECONDS = 20
WIDTH, HEIGHT = 1440, 900
# Realistic texts: what a database outage and a broker's refusal leave in the records.
RUN_ERROR = ("OperationalError: connection to server at \"pg-profile-primary.internal\" "
             "(10.20.30.40), port 5432 failed: server closed the connection unexpectedly. This "
             "probably means the server terminated abnormally before or while processing the request.")
RELAY_ERROR = ("KafkaError{code=MSG_SIZE_TOO_LARGE,val=10,str=\"Broker: Message size too large\"} "
               "after 5 attempts on pin.profile.document-expiry-reminders.v1 [partition 7]")
HOST = "pin-reminder-worker-7d9f8b6c5d-x2x7q"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.fail("chromium/chromedriver missing: scripts/test.sh installs them (scripts/browser.sh)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-background-networking", f"--window-size={WIDTH},{HEIGHT}"):
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


def full_ids(driver: WebDriver, name: str) -> list[str]:
    """The full ids of a column of shortened ids (their hover text)."""
    return [span.get_attribute("title") or "" for span in driver.find_elements(
        By.CSS_SELECTOR, f"#result_list .field-{name} .short-id")]


def assert_fits_the_window(driver: WebDriver) -> None:
    """Nothing scrolls sideways, and every table (the list's columns) ends inside the window."""
    width, scroll_width, tables = driver.execute_script(
        "return [window.innerWidth, document.documentElement.scrollWidth,"
        " [...document.querySelectorAll('table, svg')].map(t => [t.id || t.tagName,"
        "  t.getBoundingClientRect().right])]")
    assert width <= WIDTH and scroll_width <= width, (width, scroll_width)
    assert tables, "no table on the page"
    for name, right in tables:
        assert right <= width, (name, right, width)


@pytest.fixture
def ledger(transactional_db: None) -> dict[str, Any]:
    today = datetime.now(UTC).replace(hour=3, minute=0, second=0, microsecond=0)
    owners = []
    for days_ago in range(0, 30, 3):
        owners += ledger_rows(2, reminded_at=today - timedelta(days=days_ago), thresholds=(30, 7))
        ledger_rows(1 + days_ago % 4, reminded_at=today - timedelta(days=days_ago), thresholds=(1, 0))
    for days_ago in range(1, 12):
        status = (ReminderRun.Status.SUCCEEDED, ReminderRun.Status.FAILED,
                  ReminderRun.Status.PARTIAL, ReminderRun.Status.TIMED_OUT)[days_ago % 4]
        finished_run(today - timedelta(days=days_ago, minutes=-days_ago), status=status,
                     error=RUN_ERROR if status == ReminderRun.Status.FAILED else None,
                     failed_owners=17 if status == ReminderRun.Status.PARTIAL else 0,
                     host=HOST, reminders_sent=12_345, owners_notified=9_876, markers_written=23_456,
                     markers_rearmed=1_234, skipped_already_marked=123_456, pruned=4_321,
                     duration_ms=601_234)
    last = finished_run(today, host=HOST)
    written_at = today + timedelta(seconds=1)  # while the run ran: its events link finds them
    for _ in range(6):
        # Published just after the run, on the same clock (03:00 may be hours ahead of the
        # real clock just after midnight: published "now" would be before the run started).
        outbox_message(published=True, attempts=1, correlation_id=last.run_id, created_at=written_at,
                       published_at=written_at + timedelta(seconds=1))
    for _ in range(3):
        outbox_message(attempts=2, last_error=RELAY_ERROR, correlation_id=last.run_id,
                       created_at=written_at)
    outbox_message(parked=True, attempts=5, last_error=RELAY_ERROR, correlation_id=last.run_id,
                   created_at=written_at)
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
    check_plain_http_is_redirected_to_https(base_url)
    browser.delete_all_cookies()
    log_in_to_the_ledger_list(browser, base_url, capsys)
    filter_the_ledger_by_threshold(browser)
    owner = ledger["owner"]
    search_an_owner(browser, owner)
    open_a_marker_read_only(browser, owner)
    look_at_the_overview(browser, base_url, capsys)
    look_at_the_run_history(browser, base_url, capsys)
    follow_a_run_to_its_events(browser, capsys)


def check_plain_http_is_redirected_to_https(base_url: str) -> None:
    plain = requests.get(f"{base_url}/admin/", allow_redirects=False, timeout=WAIT_SECONDS)
    assert plain.status_code == 301 and plain.headers["Location"].startswith("https://")


def log_in_to_the_ledger_list(browser: WebDriver, base_url: str,
                              capsys: pytest.CaptureFixture[str]) -> None:
    """Logged in, the ledger list is styled, the session cookie Secure and HttpOnly."""
    log_in(browser, base_url, "/admin/reminders/documentexpiryreminder/", "viewer")
    wait(browser).until(ec.presence_of_element_located((By.ID, "result_list")))
    assert_styled_by_base_css(browser)
    session = browser.get_cookie("sessionid")
    assert session is not None and session["secure"] and session["httpOnly"]
    assert "about" not in browser.find_element(By.CSS_SELECTOR, "p.paginator").text
    screenshot(browser, "ledger-list.png", capsys)
    assert_fits_the_window(browser)


def filter_the_ledger_by_threshold(browser: WebDriver) -> None:
    browser.find_element(By.LINK_TEXT, "7 days").click()
    wait(browser).until(ec.url_contains("threshold_days=7"))
    wait(browser).until(ec.presence_of_element_located((By.ID, "result_list")))
    thresholds = column(browser, "threshold_days")
    assert thresholds and set(thresholds) == {"7"}


def search_an_owner(browser: WebDriver, owner: Owner) -> None:
    """The owner's markers (within the threshold filter), and only theirs."""
    search = browser.find_element(By.ID, "searchbar")
    search.clear()
    search.send_keys(str(owner.owner_user_id))
    search.submit()
    wait(browser).until(ec.url_contains(f"q={owner.owner_user_id}"))
    wait(browser).until(ec.presence_of_element_located((By.ID, "result_list")))
    assert set(full_ids(browser, "owner")) == {str(owner.owner_user_id)}
    assert len(full_ids(browser, "document")) == DocumentExpiryReminder.objects.filter(
        owner_user_id=owner.owner_user_id, threshold_days=7).count() == 2


def open_a_marker_read_only(browser: WebDriver, owner: Owner) -> None:
    """The marker's page: read-only fields, no save, delete or add."""
    browser.find_element(By.CSS_SELECTOR, "#result_list th.field-document a").click()
    wait(browser).until(ec.url_contains("/change/"))
    wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, "div.readonly")))
    assert str(owner.owner_user_id) in browser.find_element(By.ID, "content").text
    assert browser.find_elements(By.CSS_SELECTOR, "input[name=_save], input[name=_continue]") == []
    assert browser.find_elements(By.CSS_SELECTOR, "a.deletelink, input[name=_addanother]") == []
    assert browser.find_elements(By.CSS_SELECTOR, "#content form input[type=submit]") == []


def look_at_the_overview(browser: WebDriver, base_url: str,
                         capsys: pytest.CaptureFixture[str]) -> None:
    browser.get(base_url + "/admin/reminders/documentexpiryreminder/overview/")
    wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, "#overview-chart svg rect")))
    assert_styled_by_base_css(browser)
    assert "Succeeded" in browser.find_element(By.ID, "overview-last-cycle").text
    assert "1 parked" in browser.find_element(By.ID, "overview-outbox").text
    screenshot(browser, "overview.png", capsys)
    assert_fits_the_window(browser)


def look_at_the_run_history(browser: WebDriver, base_url: str,
                            capsys: pytest.CaptureFixture[str]) -> None:
    """Failed and partial runs stand out; a run's error is in its preview's hover text."""
    browser.get(base_url + "/admin/reminders/reminderrun/")
    wait(browser).until(ec.presence_of_element_located((By.ID, "result_list")))
    assert browser.find_elements(By.CSS_SELECTOR, ".run-status-failed, .run-status-partial")
    assert RUN_ERROR in [e.get_attribute("title") for e in browser.find_elements(
        By.CSS_SELECTOR, "#result_list .field-error_preview .clipped")]
    screenshot(browser, "runs-list.png", capsys)
    assert_fits_the_window(browser)


def follow_a_run_to_its_events(browser: WebDriver, capsys: pytest.CaptureFixture[str]) -> None:
    """The latest run's events link: its outbox messages, the parked one marked."""
    browser.find_element(By.CSS_SELECTOR, "#result_list tbody tr:first-child .run-links a:last-child").click()
    wait(browser).until(ec.url_contains("correlation_id="))
    wait(browser).until(ec.presence_of_element_located((By.ID, "result_list")))
    assert len(full_ids(browser, "message")) == 10
    assert browser.find_elements(By.CSS_SELECTOR, "#result_list .field-parked .attention")
    screenshot(browser, "outbox-list.png", capsys)
    assert_fits_the_window(browser)


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
