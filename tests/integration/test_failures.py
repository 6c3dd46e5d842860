"""core.failures.classify on real failures: a refused port, a database that does not exist, a
role without a privilege, a missing table, and another error; no reason carries a password."""

import uuid

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction

from core.failures import DatabaseFailure, FailureKind, classify, one_line
from core.roles import WORKER_ROLE
from tests.support.chaos_proxy import refused_port
from tests.support.db_roles import as_role, test_database_url

SECRET = "s3cret-Pa55word"  # noqa: S105 - a test password that must not show


def _connect_failure(url: str) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as caught:
        psycopg.connect(url, connect_timeout=5)
    return caught.value


def _query_failure(sql: str, role: str | None = None) -> DatabaseError:
    """The error Django raises (wrapping psycopg's) for `sql`, run as `role`."""
    # In a savepoint: the test's transaction stays usable after the error.
    with (as_role(role or connection.settings_dict["USER"]), pytest.raises(DatabaseError) as caught,
          transaction.atomic(), connection.cursor() as cursor):
        cursor.execute(sql)
    return caught.value


def test_a_refused_port_is_unreachable_naming_host_and_port_never_the_password() -> None:
    with refused_port() as port:
        error = _connect_failure(f"postgres://{WORKER_ROLE}:{SECRET}@127.0.0.1:{port}/db")
    failure = classify(error, role=WORKER_ROLE)

    assert failure.kind is FailureKind.UNREACHABLE
    assert failure.reason.startswith("database unreachable: OperationalError: connection failed:")
    assert f'"127.0.0.1", port {port} failed: Connection refused' in failure.reason
    assert "\n" not in failure.reason and SECRET not in failure.reason
    assert failure.fields() == {"cause": "database unreachable", "error": failure.error}


@pytest.mark.django_db
def test_a_database_that_does_not_exist_is_unreachable_with_the_servers_reason() -> None:
    missing = f"pin_nowhere_{uuid.uuid4().hex[:8]}"
    # The local server trusts 127.0.0.1, so the password is sent and ignored: still not shown.
    url = test_database_url().rsplit("/", 1)[0].replace("@", f":{SECRET}@", 1) + f"/{missing}"
    failure = classify(_connect_failure(url))

    assert failure.kind is FailureKind.UNREACHABLE
    assert f'database "{missing}" does not exist' in failure.reason
    assert SECRET not in failure.reason


@pytest.mark.django_db
def test_a_role_without_the_privilege_is_a_missing_grant_naming_role_table_and_fix() -> None:
    # The worker may not read payload_cipher (core/sql/roles.sql): a real permission error.
    error = _query_failure("select payload_cipher from person_documents", role=WORKER_ROLE)
    failure = classify(error, role=WORKER_ROLE)

    assert failure == DatabaseFailure(
        FailureKind.MISSING,
        "InsufficientPrivilege: permission denied for table person_documents",
        f"role {WORKER_ROLE} lacks a privilege on person_documents: as the schema owner, grant "
        "it (manage.py apply_db_roles)",
    )
    assert failure.reason.startswith("missing table or grant: InsufficientPrivilege: ")


@pytest.mark.django_db
def test_a_missing_table_is_named_with_migrate_and_apply_db_roles_and_no_statement() -> None:
    failure = classify(_query_failure("select * from profile.no_such_table_here"),
                       role="postgres")

    assert failure.kind is FailureKind.MISSING
    assert failure.error == 'UndefinedTable: relation "profile.no_such_table_here" does not exist'
    assert failure.hint == ('"profile.no_such_table_here" is missing or invisible to role '
                            "postgres: as the schema owner, create it (manage.py migrate) and "
                            "grant it (manage.py apply_db_roles)")
    assert "LINE 1" not in failure.reason  # the server's pointer into the statement is left out


@pytest.mark.django_db
def test_other_errors_are_database_errors_with_their_sqlstate_name() -> None:
    failure = classify(_query_failure("select 1 / 0"))

    assert failure.kind is FailureKind.OTHER
    assert failure.reason == "database error: DivisionByZero: division by zero"


def test_a_lost_connection_is_unreachable() -> None:
    failure = classify(ConnectionError("database connection lost"))
    assert failure.reason == "database unreachable: ConnectionError: database connection lost"


@pytest.mark.parametrize("text", [
    f"could not connect to postgres://worker:{SECRET}@db:5432/x",
    f"host=db password={SECRET} user=worker",
])
def test_one_line_blanks_a_dsn_password(text: str) -> None:
    line = one_line(text)
    assert SECRET not in line and "***" in line and "worker" in line
