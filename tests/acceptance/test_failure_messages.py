"""What the commands print when the database fails, as an operator reads it: the
database unreachable, a grant or a table missing, or owners failed; each says which, with the
fix, and never a password. Real failures: a refused port, a database that does not exist, a
role without a privilege, a renamed table."""

import json
from collections.abc import Iterator

import pytest
from django.db import connection

from core.db import apply_sql_file
from core.roles import RELAY_ROLE, ROLES_SQL, WORKER_ROLE
from tests.support.chaos_proxy import refused_port
from tests.support.db_roles import test_database_url
from tests.support.factories import Documents
from tests.support.ledger import expiring_in
from tests.support.processes import command_env, run_command

AS_OF_ARG = "2026-11-29T03:00:00Z"
SECRET = "n0t-Shown-pa55"  # noqa: S105 - a test password that must not show
REFUSED = "Connection refused Is the server running on that host and accepting TCP/IP connections?"


def _env(url: str, role: str = WORKER_ROLE, **extra: str) -> dict[str, str]:
    return {**command_env(role, **extra), "DATABASE_URL": url}


def _last_line(stderr: str) -> str:
    """The command's own last line (the log lines, JSON, are written by their own thread)."""
    return [line for line in stderr.splitlines() if not line.startswith("{")][-1]


def _logged(stderr: str, event: str) -> list[dict[str, str]]:
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [line for line in lines if line["event"] == event]


def _execute(*statements: str) -> None:
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


@pytest.fixture
def restore_grants(transactional_db: None) -> Iterator[None]:
    yield
    apply_sql_file(ROLES_SQL)


def test_a_refused_port_is_database_unreachable_with_host_and_port_and_no_password() -> None:
    with refused_port() as port:
        url = f"postgres://{WORKER_ROLE}:{SECRET}@127.0.0.1:{port}/nowhere"
        run = run_command("run_expiry_reminders", "--as-of", AS_OF_ARG,
                          env=_env(url))
        health = run_command("check_reminders_health", env=_env(url))
        relay = run_command("publish_outbox", env=_env(  # no broker: its wait, 2 s not 30 s
            url, RELAY_ROLE, KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:9", OUTBOX_DELIVERY_TIMEOUT="2s"))

    unreachable = (f'database unreachable: OperationalError: connection failed: connection to '
                   f'server at "127.0.0.1", port {port} failed: {REFUSED}')
    assert (run.returncode, _last_line(run.stderr)) == (3, f"CommandError: cycle failed: {unreachable}")
    [failed] = _logged(run.stderr, "cycle failed")
    assert failed["cause"] == "database unreachable" and "hint" not in failed
    assert (health.returncode, _last_line(health.stderr)) == (3, f"CommandError: {unreachable}")
    assert (relay.returncode, _last_line(relay.stderr)) == (
        3, f"CommandError: relay pass failed: {unreachable}")
    for done in (run, health, relay):
        assert SECRET not in done.stdout + done.stderr


@pytest.mark.django_db
def test_health_names_a_database_that_does_not_exist_and_a_role_that_does_not() -> None:
    base = test_database_url().rsplit("/", 1)[0]
    no_database = run_command("check_reminders_health", env=_env(
        base + "/pin_no_such_database"))
    no_role = run_command("check_reminders_health", env=_env(
        test_database_url("pin_no_such_role").replace("@", f":{SECRET}@", 1)))

    assert no_database.returncode == 3
    assert _last_line(no_database.stderr).startswith(
        "CommandError: database unreachable: OperationalError: connection failed: ")
    assert _last_line(no_database.stderr).endswith(
        'failed: FATAL: database "pin_no_such_database" does not exist')
    assert no_role.returncode == 3
    assert _last_line(no_role.stderr).endswith('failed: FATAL: role "pin_no_such_role" does not exist')
    assert SECRET not in no_role.stderr


def test_a_missing_grant_names_the_role_the_table_and_apply_db_roles(
    restore_grants: None,
) -> None:
    _execute(f"revoke all on profile.document_expiry_reminders from {WORKER_ROLE}")

    run = run_command("run_expiry_reminders", "--as-of", AS_OF_ARG)

    assert run.returncode == 4
    assert _last_line(run.stderr) == (
        "CommandError: cycle failed: missing table or grant: InsufficientPrivilege: permission "
        "denied for table document_expiry_reminders; role pin_reminder_worker lacks a privilege "
        "on document_expiry_reminders: as the schema owner, grant it (manage.py apply_db_roles)")
    [failed] = _logged(run.stderr, "cycle failed")
    assert failed["cause"] == "missing table or grant"
    assert failed["hint"].endswith("(manage.py apply_db_roles)")


def test_a_missing_table_names_migrate_and_apply_db_roles(transactional_db: None) -> None:
    _execute("alter table profile.document_expiry_reminder_runs rename to runs_moved_away")
    try:
        run = run_command("run_expiry_reminders", "--as-of", AS_OF_ARG)
        health = run_command("check_reminders_health")
    finally:
        _execute("alter table profile.runs_moved_away rename to document_expiry_reminder_runs")

    missing = ('missing table or grant: UndefinedTable: relation "document_expiry_reminder_runs" '
               'does not exist; "document_expiry_reminder_runs" is missing or invisible to role '
               "pin_reminder_worker: as the schema owner, create it (manage.py migrate) and grant "
               "it (manage.py apply_db_roles)")
    assert (run.returncode, _last_line(run.stderr)) == (4, f"CommandError: cycle failed: {missing}")
    assert (health.returncode, _last_line(health.stderr)) == (4, f"CommandError: {missing}")


def test_owners_failing_on_a_missing_column_grant_say_so_and_count_them(
    documents: Documents, restore_grants: None,
) -> None:
    # The claim re-arms markers in place (on conflict do update): without the UPDATE grant
    # every batch, then every owner, fails; the cycle is partial and says why.
    documents(expires_at=expiring_in(7))
    documents(expires_at=expiring_in(1))
    _execute(f"revoke update on profile.document_expiry_reminders from {WORKER_ROLE}")

    run = run_command("run_expiry_reminders", "--as-of", AS_OF_ARG)

    assert run.returncode == 1
    assert _last_line(run.stderr) == (
        "CommandError: cycle partial: 2 owner(s) failed (missing table or grant: "
        "InsufficientPrivilege: permission denied for table document_expiry_reminders; role "
        "pin_reminder_worker lacks a privilege on document_expiry_reminders: as the schema "
        "owner, grant it (manage.py apply_db_roles)); they are retried next cycle")
    failed = _logged(run.stderr, "owner failed")
    assert len(failed) == 2 and {f["cause"] for f in failed} == {"missing table or grant"}
    assert "failed owners            2" in run.stdout
