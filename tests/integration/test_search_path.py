"""No role's search_path holds `public`: an operator another role planted there (possible on a
database created under PostgreSQL 14 or older, or restored from one) is never run by the
worker, the relay, the admin or the audit, and apply_db_roles takes CREATE on `public` away."""

from collections.abc import Iterator

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from core.db import apply_sql_file
from core.roles import ADMIN_WEB_ROLE, AUDITOR_ROLE, RELAY_ROLE, ROLES_SQL, WORKER_ROLE
from devtools.mock_kafka import MockKafkaCluster
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import as_role, test_database_url
from tests.support.factories import Documents
from tests.support.ledger import AS_OF, expiring_in
from tests.support.processes import command_env, run_command

PLANTER = "pin_test_planter"
PASSWORD = "a long test password"  # noqa: S105 - a test user's
ROLES = (WORKER_ROLE, RELAY_ROLE, ADMIN_WEB_ROLE, AUDITOR_ROLE)
# A better match than pg_catalog's text = text for any varchar compared with a literal, run as
# its owner (security definer) so that it can record who called it.
PLANT = [
    "create table public.planted_calls (caller text not null)",
    "grant insert on public.planted_calls to public",
    "create function public.planted_eq(varchar, varchar) returns boolean language plpgsql"
    " security definer as $$ begin insert into public.planted_calls values (session_user);"
    " return $1::text = $2::text; end $$",
    "create operator public.= (leftarg = varchar, rightarg = varchar,"
    " function = public.planted_eq)",
]


def _execute(*statements: str) -> None:
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


def _calls() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("select caller from public.planted_calls")
        return [row[0] for row in cursor.fetchall()]


@pytest.fixture
def planted(transactional_db: None) -> Iterator[None]:
    """`public` as a database from PostgreSQL 14 leaves it, an operator planted in it."""
    _execute(f"drop role if exists {PLANTER}", f"create role {PLANTER}",
             f"grant create, usage on schema public to {PLANTER}", f"set role {PLANTER}", *PLANT,
             "reset role")
    # The plant works for a session whose path holds public.
    with psycopg.connect(test_database_url(), options="-c search_path=profile,public") as probe:
        probe.execute("select 'a'::varchar = 'a'")
    assert _calls(), "the planted operator is not chosen where public is on the path"
    _execute("truncate public.planted_calls")
    yield
    _execute("drop owned by pin_test_planter cascade", f"drop role {PLANTER}")


def test_every_role_s_own_search_path_leaves_public_out(transactional_db: None) -> None:
    for role in ROLES:
        # Without the connection's options, as behind a pooler that drops them.
        with psycopg.connect(test_database_url(role)) as conn:
            [(path,)] = conn.execute("show search_path").fetchall()
            assert path.replace(" ", "") == "profile,pg_catalog", role


def test_apply_db_roles_takes_create_on_public_away(transactional_db: None) -> None:
    _execute("grant create on schema public to public")
    apply_sql_file(ROLES_SQL)
    for role in ROLES:
        with connection.cursor() as cursor:
            cursor.execute("select has_schema_privilege(%s, 'public', 'CREATE')", [role])
            assert cursor.fetchone() == (False,), role


def test_an_operator_planted_in_public_is_never_run_by_any_process(
    planted: None, documents: Documents,
) -> None:
    documents(expires_at=expiring_in(3), type="Passport")
    worker = run_command("run_expiry_reminders", "--as-of", AS_OF.isoformat(),
                         env=command_env(WORKER_ROLE))
    assert worker.returncode == 0, worker.stderr
    with MockKafkaCluster(1) as kafka:
        relay = run_command("publish_outbox", env=command_env(
            RELAY_ROLE, KAFKA_BOOTSTRAP_SERVERS=kafka.bootstrap_servers,
            OUTBOX_ALLOW_UNDURABLE_TOPIC="on"))
        audit = run_command("audit_reminders", env=command_env(
            AUDITOR_ROLE, KAFKA_BOOTSTRAP_SERVERS=kafka.bootstrap_servers))
    assert relay.returncode == 0, relay.stderr
    assert audit.returncode in (0, 1), audit.stderr
    User.objects.create_user("operator", password=PASSWORD, is_staff=True,
                             is_superuser=True)
    client = Client()
    with as_role(ADMIN_WEB_ROLE):
        assert client.post("/admin/login/?next=/admin/", {
            "username": "operator", "password": PASSWORD}).status_code == 302
        for page in ("/admin/", "/admin/reminders/documentexpiryreminder/?q=Passport",
                     "/admin/outbox/outboxmessage/", "/admin/reminders/reminderrun/"):
            assert client.get(page).status_code == 200, page
    assert _calls() == []
    assert_outbox_matches_contract()
