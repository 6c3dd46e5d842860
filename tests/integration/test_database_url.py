"""DATABASE_URL under the production settings: its libpq options reach the connection, TLS is
required to a remote server unless DATABASE_SSLMODE_ALLOW names the mode, and a URL that cannot
be parsed is refused without quoting any part of it."""

import json
import subprocess
import sys

import pytest

from core.roles import WORKER_ROLE
from tests.support.db_roles import test_database_url
from tests.support.processes import ROOT, command_env

pytestmark = pytest.mark.django_db(transaction=True)

SHOW_CONNECTION = (
    "import json, django; django.setup(); from django.db import connection; "
    "connection.ensure_connection(); info = connection.connection.info; "
    "print(json.dumps({'dsn': info.get_parameters(), "
    "'search_path': connection.connection.execute('show search_path').fetchone()[0]}))"
)
SHOW_SETTINGS = ("import json, django; django.setup(); from django.conf import settings; "
                 "print(json.dumps(settings.DATABASES['default']['OPTIONS']))")


def _python(code: str, url: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in command_env(WORKER_ROLE).items()
           if name not in {"DATABASE_SSLMODE_ALLOW", "PGSSLMODE"}}
    env.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="pin_profile.settings", **extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60, check=False, cwd=ROOT)


def test_every_libpq_option_of_the_url_reaches_the_connection() -> None:
    url = (f"{test_database_url(WORKER_ROLE)}?sslmode=disable&keepalives_idle=17"
           "&target_session_attrs=read-write&application_name=from-the-url")
    done = _python(SHOW_CONNECTION, url)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    dsn = shown["dsn"]
    assert dsn["sslmode"] == "disable"
    assert dsn["keepalives_idle"] == "17"
    assert dsn["target_session_attrs"] == "read-write"
    assert dsn["application_name"] == "from-the-url"
    # The project's own options stay: its search_path and timeouts.
    assert "statement_timeout" in dsn["options"]
    assert shown["search_path"].replace(" ", "") == "profile,pg_catalog"


def test_the_tls_options_of_the_url_are_in_the_settings() -> None:
    url = ("postgres://u:p@db.example.com:5432/pin_profile?sslmode=verify-full"
           "&sslrootcert=/etc/ssl/db-ca.pem")
    done = _python(SHOW_SETTINGS, url)
    assert done.returncode == 0, done.stderr
    options = json.loads(done.stdout)
    assert options["sslmode"] == "verify-full"
    assert options["sslrootcert"] == "/etc/ssl/db-ca.pem"
    assert "search_path=profile,pg_catalog" in options["options"]


@pytest.mark.parametrize("query", ["", "?sslmode=require", "?sslmode=verify-ca", "?sslmode=disable"])
def test_a_remote_server_without_verify_full_is_refused_until_the_switch_names_the_mode(
    query: str,
) -> None:
    url = f"postgres://u:p@db.example.com:5432/pin_profile{query}"
    mode = query.partition("=")[2] or "prefer"
    refused = subprocess.run([sys.executable, "manage.py", "check"], capture_output=True,
                             text=True, timeout=60, check=False, cwd=ROOT,
                             env={**command_env(WORKER_ROLE), "DATABASE_URL": url,
                                  "DJANGO_SETTINGS_MODULE": "pin_profile.settings"})
    assert refused.returncode == 2, refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert "DATABASE_URL" in last and f"sslmode={mode}" in last and "DATABASE_SSLMODE_ALLOW" in last
    assert ":p@" not in refused.stderr

    other = "verify-ca" if mode != "verify-ca" else "require"
    assert _python(SHOW_SETTINGS, url, DATABASE_SSLMODE_ALLOW=other).returncode != 0
    allowed = _python(SHOW_SETTINGS, url, DATABASE_SSLMODE_ALLOW=mode)
    assert allowed.returncode == 0, allowed.stderr


def test_loopback_and_sockets_need_no_switch_and_a_bad_switch_is_refused() -> None:
    for host in ("127.0.0.1", "localhost", "[::1]", "%2Fvar%2Frun%2Fpostgresql", ""):
        done = _python(SHOW_SETTINGS, f"postgres://u:p@{host}/pin_profile?sslmode=disable")
        assert done.returncode == 0, (host, done.stderr)
    bad = _python(SHOW_SETTINGS, "postgres://u@127.0.0.1/db", DATABASE_SSLMODE_ALLOW="off")
    assert "DATABASE_SSLMODE_ALLOW" in bad.stderr
    behind_a_name = _python(SHOW_SETTINGS, "postgres://u@localhost/db?hostaddr=10.0.0.5")
    assert "sslmode=prefer" in behind_a_name.stderr


@pytest.mark.parametrize("password", ["Ab3/xyz", "Ab3?xyz", "Ab3#xyz", "Ab3@xyz", "Ab3%xyz",
                                      "Ab3/x?y#z@w%v", "Ab3:99/xyz"])
def test_a_url_that_cannot_be_parsed_never_shows_a_fragment_of_it(password: str) -> None:
    url = f"postgres://pin_reminder_worker:{password}@db.example.com:5432/pin_profile"
    done = subprocess.run([sys.executable, "manage.py", "check"], capture_output=True, text=True,
                          timeout=60, check=False, cwd=ROOT,
                          env={**command_env(WORKER_ROLE), "DATABASE_URL": url,
                               "DJANGO_SETTINGS_MODULE": "pin_profile.settings",
                               "DATABASE_SSLMODE_ALLOW": "prefer"})
    if done.returncode == 0:
        return  # parsed whole (an '@' or '%' in a password can be): nothing was shown
    assert done.returncode == 2, done.stderr
    assert "DATABASE_URL" in done.stderr
    for fragment in ("Ab3", "xyz", "db.example.com", "pin_reminder_worker"):
        assert fragment not in done.stderr, (fragment, done.stderr)


def test_the_url_is_not_a_setting_django_would_show() -> None:
    done = subprocess.run([sys.executable, "manage.py", "diffsettings", "--all"],
                          capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
                          env={**command_env(WORKER_ROLE),
                               "DATABASE_URL": "postgres://u:S3cretPw@127.0.0.1/pin_profile"})
    assert done.returncode == 0, done.stderr
    assert "DATABASE_URL" not in done.stdout
    assert "postgres://u:S3cretPw" not in done.stdout
