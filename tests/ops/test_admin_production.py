"""The admin as a production web process: gunicorn with the image's settings, as the admin's
own database role, static files from collectstatic through WhiteNoise, metrics only on the
ops port, the development secret key refused, and `check --deploy` clean."""

import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from prometheus_client.parser import text_string_to_metric_families

from core.roles import ADMIN_WEB_ROLE
from outbox.models import OutboxMessage
from tests.support.admin_data import PASSWORD, Owner, ledger_rows, outbox_message, staff_viewer
from tests.support.admin_server import (
    PRODUCTION_TLS,
    AdminServer,
    admin_env,
    admin_server,
    collect_static,
    production_key,
    run_gunicorn_to_exit,
)
from tests.support.processes import command_env, run_command

pytestmark = pytest.mark.slow
TIMEOUT_S = 30


@pytest.fixture(scope="module")
def static_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("static")
    collect_static(target)
    return target


def csrf_token(page: str) -> str:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert match, "no CSRF token on the page"
    return match[1]


def log_in(http: requests.Session, base: str, username: str) -> None:
    form = http.get(f"{base}/admin/login/", timeout=TIMEOUT_S)
    answer = http.post(f"{base}/admin/login/?next=/admin/", timeout=TIMEOUT_S, data={
        "csrfmiddlewaretoken": csrf_token(form.text), "username": username,
        "password": PASSWORD, "next": "/admin/",
    })
    assert answer.status_code == 200 and answer.url == f"{base}/admin/", answer.url


@pytest.fixture
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


def test_admin_works_under_gunicorn_as_its_own_role(
    transactional_db: None, static_root: Path, http: requests.Session
) -> None:
    operator = staff_viewer("operator")
    operator.user_permissions.add(Permission.objects.get(codename="requeue_outboxmessage"))
    owner = ledger_rows(2, reminded_at=datetime(2026, 11, 29, 3, tzinfo=UTC))[0]
    parked = outbox_message(parked=True, attempts=5, last_error="MSG_SIZE_TOO_LARGE")
    waiting = outbox_message()
    env = admin_env(static_root)
    assert env["DATABASE_URL"].startswith(f"postgres://{ADMIN_WEB_ROLE}@")

    with admin_server(env) as server:
        check_static_files_served_compressed_and_no_metrics_beside_them(http, server)
        log_in(http, server.url, "operator")
        check_the_ledger_and_the_overview_pages(http, server, owner)
        requeue_from_the_outbox_page(http, server, parked, waiting)
        metrics = check_the_ops_port_serves_metrics_and_probes_only(http, server)

    check_the_requeue_was_made_and_logged(parked, operator)
    check_the_metrics_counted_the_login_and_the_requeue(metrics)


def check_static_files_served_compressed_and_no_metrics_beside_them(
    http: requests.Session, server: AdminServer
) -> None:
    css = http.get(f"{server.url}/static/admin/css/base.css", timeout=TIMEOUT_S)
    assert css.status_code == 200
    assert css.headers["Content-Type"].startswith("text/css")
    assert css.headers.get("Content-Encoding") == "gzip"  # collectstatic compressed it
    assert "--body-fg" in css.text
    assert http.get(f"{server.url}/metrics", timeout=TIMEOUT_S).status_code == 404


def check_the_ledger_and_the_overview_pages(http: requests.Session, server: AdminServer,
                                            owner: Owner) -> None:
    ledger = http.get(f"{server.url}/admin/reminders/documentexpiryreminder/", timeout=TIMEOUT_S)
    assert ledger.status_code == 200 and str(owner.owner_user_id) in ledger.text
    overview = http.get(f"{server.url}/admin/reminders/documentexpiryreminder/overview/",
                        timeout=TIMEOUT_S)
    assert overview.status_code == 200 and "1 parked" in overview.text


def requeue_from_the_outbox_page(http: requests.Session, server: AdminServer,
                                 parked: OutboxMessage, waiting: OutboxMessage) -> None:
    """The outbox list shows the parked message; its action re-queues it (and only it)."""
    outbox_url = f"{server.url}/admin/outbox/outboxmessage/"
    outbox = http.get(outbox_url, timeout=TIMEOUT_S)
    assert outbox.status_code == 200 and parked.message_key in outbox.text
    requeued = http.post(outbox_url, timeout=TIMEOUT_S, data={
        "csrfmiddlewaretoken": csrf_token(outbox.text), "action": "requeue_parked",
        "index": "0", "_selected_action": [str(parked.pk), str(waiting.pk)],
    })
    assert requeued.status_code == 200
    assert "Re-queued 1 parked message(s)." in requeued.text


def check_the_ops_port_serves_metrics_and_probes_only(http: requests.Session,
                                                      server: AdminServer) -> str:
    """The ops port's metrics, health and readiness, and no admin; the metrics' text."""
    metrics = http.get(f"{server.ops_url}/metrics", timeout=TIMEOUT_S)
    assert metrics.status_code == 200
    assert http.get(f"{server.ops_url}/healthz", timeout=TIMEOUT_S).status_code == 200
    assert http.get(f"{server.ops_url}/readyz", timeout=TIMEOUT_S).status_code == 200
    assert http.get(f"{server.ops_url}/admin/login/", timeout=TIMEOUT_S).status_code == 404
    return metrics.text


def check_the_requeue_was_made_and_logged(parked: OutboxMessage, operator: User) -> None:
    parked.refresh_from_db()
    assert parked.parked_at is None and parked.attempts == 0
    assert parked.last_error == "MSG_SIZE_TOO_LARGE"
    entry = LogEntry.objects.get(object_id=str(parked.pk))
    assert entry.user == operator and "Re-queued" in entry.get_change_message()


def check_the_metrics_counted_the_login_and_the_requeue(metrics: str) -> None:
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    logins = {s.labels["method"]: s.value
              for s in families["django_http_requests_total_by_view_transport_method"].samples
              if s.name.endswith("_total") and s.labels.get("view") == "admin:login"}
    assert logins == {"GET": 1, "POST": 1}  # the login form and its answer, counted in the worker
    # The re-queue, counted where it was made and exported by the admin's ops port.
    requeues = {s.labels["via"]: s.value for s in families["profile_outbox_requeued"].samples
                if s.name == "profile_outbox_requeued_total"}
    assert requeues == {"admin": 1, "command": 0}


def test_static_files_need_no_database(tmp_path: Path, http: requests.Session) -> None:
    """WhiteNoise answers before any view: the CSS is served while the database is unreachable."""
    collect_static(tmp_path)
    env = admin_env(tmp_path, DATABASE_URL="postgres://nobody@127.0.0.1:1/none")
    with admin_server(env) as server:
        css = http.get(f"{server.url}/static/admin/css/base.css", timeout=TIMEOUT_S,
                       headers={"Accept-Encoding": "identity"})
        assert css.status_code == 200 and "Content-Encoding" not in css.headers
        assert css.headers["Content-Type"].startswith("text/css")
        assert http.get(f"{server.url}/static/admin/css/missing.css", timeout=TIMEOUT_S).status_code == 404
        assert http.get(f"{server.ops_url}/readyz", timeout=TIMEOUT_S).status_code == 503


def test_the_development_secret_key_is_refused_with_debug_off(tmp_path: Path) -> None:
    env = admin_env(tmp_path)
    del env["DJANGO_SECRET_KEY"]

    refused = run_gunicorn_to_exit(env)

    assert refused.returncode == 2
    assert refused.stdout == ""
    assert refused.stderr.splitlines() == [
        "configuration error: DJANGO_SECRET_KEY: the development key is refused when "
        "DJANGO_DEBUG is off; set a random key of at least 50 characters"
    ]


def test_the_development_secret_key_is_accepted_with_debug_on() -> None:
    env = {k: v for k, v in command_env(ADMIN_WEB_ROLE, DJANGO_DEBUG="on").items()
           if k != "DJANGO_SECRET_KEY"}
    loaded = subprocess.run([sys.executable, "-c", "import pin_profile.wsgi"], env=env,
                            capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert loaded.returncode == 0, loaded.stderr


@pytest.mark.parametrize(("name", "value"), [
    ("DJANGO_SECURE_COOKIES", "maybe"),
    ("DJANGO_SECURE_SSL_REDIRECT", "yes please"),
    ("DJANGO_SECURE_HSTS_SECONDS", "-1"),
    ("DJANGO_SECURE_HSTS_PRELOAD", ""),
    ("DJANGO_CSRF_TRUSTED_ORIGINS", "admin.example.com"),
    ("METRICS_ADDR", "everywhere"),
])
def test_a_bad_setting_stops_gunicorn_with_one_line_naming_it(
    tmp_path: Path, name: str, value: str
) -> None:
    refused = run_gunicorn_to_exit(admin_env(tmp_path, **{name: value}))

    assert refused.returncode == 2, refused.stderr
    errors = [line for line in refused.stderr.splitlines() if "error" in line.lower()]
    assert errors == [errors[0]] and errors[0].startswith(f"configuration error: {name}: ")
    assert "Traceback" not in refused.stderr


def deploy_check(**env: str) -> Any:
    return run_command("check", "--deploy", "--fail-level", "WARNING",
                       env=command_env(ADMIN_WEB_ROLE, **env))


def test_check_deploy_is_clean_under_production_settings(capsys: pytest.CaptureFixture[str]) -> None:
    checked = deploy_check(DJANGO_SECRET_KEY=production_key(), DJANGO_ALLOWED_HOSTS="admin.example.com",
                           DJANGO_CSRF_TRUSTED_ORIGINS="https://admin.example.com", **PRODUCTION_TLS)
    with capsys.disabled():
        print(f"\ncheck --deploy under production settings: {checked.stdout.strip()}")  # noqa: T201

    assert checked.returncode == 0, checked.stderr
    assert re.fullmatch(r"System check identified no issues \(\d+ silenced\)\.", checked.stdout.strip())
    assert checked.stderr == ""


def test_check_deploy_is_clean_with_only_the_key_and_the_hosts_set() -> None:
    """The image's settings (DEBUG off) are secure by default: secure cookies, the redirect
    and HSTS need no variable of their own."""
    checked = deploy_check(DJANGO_SETTINGS_MODULE="pin_profile.settings",
                           DJANGO_SECRET_KEY=production_key(),
                           DJANGO_ALLOWED_HOSTS="admin.example.com")

    assert checked.returncode == 0, checked.stderr
    assert re.fullmatch(r"System check identified no issues \(\d+ silenced\)\.", checked.stdout.strip())


@pytest.mark.parametrize(("name", "value", "warnings"), [
    ("DJANGO_SECURE_SSL_REDIRECT", "off", {"W008"}),
    ("DJANGO_SECURE_HSTS_SECONDS", "0", {"W004"}),
    ("DJANGO_SECURE_COOKIES", "off", {"W012", "W016"}),
])
def test_each_https_default_is_switched_off_by_its_own_variable(
    name: str, value: str, warnings: set[str]
) -> None:
    checked = deploy_check(DJANGO_SETTINGS_MODULE="pin_profile.settings",
                           DJANGO_SECRET_KEY=production_key(),
                           DJANGO_ALLOWED_HOSTS="admin.example.com", **{name: value})

    assert checked.returncode == 1
    assert set(re.findall(r"\(security\.(W\d+)\)", checked.stderr)) == warnings, checked.stderr


def test_check_deploy_names_each_missing_production_setting() -> None:
    checked = deploy_check()  # the development defaults

    assert checked.returncode == 1
    found = set(re.findall(r"\(security\.(W\d+)\)", checked.stderr))
    # HSTS, SSL redirect, the secret key, the session and CSRF cookies: the issue's 5 warnings.
    assert found == {"W004", "W008", "W009", "W012", "W016"}, checked.stderr
