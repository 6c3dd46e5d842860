"""A migration waits at most its lock_timeout for a lock another session holds, is tried again in
a new transaction, and fails naming the lock and its holder; a short lock is waited out; a
concurrent index build runs again over the invalid index a failed one left (core/migration_ops.py)."""

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, migrations, models
from django.db.migrations.state import ModelState, ProjectState

from core.migration_ops import (
    AddIndexConcurrently,
    LockTimeoutMigration,
    MigrationLockTimeoutError,
    migrate_with_lock_retries,
)
from core.migrations_lint import run_squawk
from tests.support.db_roles import test_database_url
from tests.support.relay_support import wait_for

ADD_COLUMN = "alter table public.lock_probe add column added integer"


class ProbeMigration(LockTimeoutMigration):
    lock_timeout = "200ms"
    operations = [migrations.RunSQL(ADD_COLUMN, "alter table public.lock_probe drop column added")]


class PatientProbeMigration(ProbeMigration):
    lock_timeout = "30s"


def apply(migration_class: type[LockTimeoutMigration]) -> None:
    """Apply the migration in its own transaction, as the executor does."""
    with connection.schema_editor(atomic=migration_class.atomic) as editor:
        migration_class("0001_probe", "lock_probe").apply(ProjectState(), editor)


def probe_columns() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("select column_name from information_schema.columns"
                       " where table_schema = 'public' and table_name = 'lock_probe'")
        return {row[0] for row in cursor.fetchall()}


@pytest.fixture
def holder(transactional_db: None) -> Iterator[psycopg.Connection[Any]]:
    """Another session holding ACCESS SHARE on lock_probe, as a relay's read does."""
    with connection.cursor() as cursor:
        cursor.execute("create table public.lock_probe (id integer)")
    with psycopg.connect(test_database_url(), application_name="lock_holder") as held:
        held.execute("lock table public.lock_probe in access share mode")
        yield held
        held.rollback()
    with connection.cursor() as cursor:
        cursor.execute("drop table public.lock_probe")


def test_a_held_lock_is_tried_again_then_fails_naming_it(
        holder: psycopg.Connection[Any]) -> None:
    pauses: list[float] = []
    with pytest.raises(MigrationLockTimeoutError) as failure:
        migrate_with_lock_retries(lambda: apply(ProbeMigration), attempts=3, pause_seconds=0.5,
                                  sleep=pauses.append)
    assert pauses == [0.5, 0.5]
    message = str(failure.value)
    assert message.startswith("migration lock_probe.0001_probe could not take its lock within "
                              f"lock_timeout 200ms, in: {ADD_COLUMN} (3 attempts; lock held by: ")
    assert (f"lock_probe: AccessShareLock held by pid {holder.info.backend_pid} (lock_holder, "
            "idle in transaction, transaction open") in message
    assert probe_columns() == {"id"}


def test_a_lock_released_between_attempts_lets_the_next_attempt_through(
        holder: psycopg.Connection[Any]) -> None:
    attempts = migrate_with_lock_retries(lambda: apply(ProbeMigration), attempts=3,
                                         pause_seconds=0, sleep=lambda _: holder.rollback())
    assert attempts == 2
    assert probe_columns() == {"id", "added"}


def test_a_short_lock_is_waited_out(holder: psycopg.Connection[Any]) -> None:
    outcome: list[int] = []

    def migrate() -> None:
        try:
            outcome.append(migrate_with_lock_retries(lambda: apply(PatientProbeMigration),
                                                     attempts=1))
        finally:
            connection.close()

    thread = threading.Thread(target=migrate)
    thread.start()
    wait_for(lambda: holder.execute(
        "select count(*) from pg_locks where relation = 'public.lock_probe'::regclass"
        " and not granted").fetchone() == (1,), what="the migration waiting for its lock")
    holder.rollback()
    thread.join(timeout=30)
    assert outcome == [1]
    assert probe_columns() == {"id", "added"}


def test_the_timeouts_come_first_in_the_migrations_sql(transactional_db: None) -> None:
    class Concurrent(ProbeMigration):
        atomic = False
        statement_timeout = "0"

    for migration_class, scope in ((ProbeMigration, "SET LOCAL"), (Concurrent, "SET")):
        with connection.schema_editor(collect_sql=True, atomic=False) as editor:
            migration_class("0001_probe", "lock_probe").apply(ProjectState(), editor,
                                                              collect_sql=True)
        assert editor.collected_sql[:2] == [
            f"{scope} lock_timeout = '200ms';",
            f"{scope} statement_timeout = '{migration_class.statement_timeout}';"]


def test_migrate_takes_the_lock_options(transactional_db: None) -> None:
    call_command("migrate", lock_attempts=1, lock_retry_pause=0, verbosity=0)
    with pytest.raises(TypeError):
        call_command("migrate", lock_attempt=1)


class IndexMigration(LockTimeoutMigration):
    atomic = False
    statement_timeout = "0"
    operations = [AddIndexConcurrently(
        "probe", models.Index(fields=["added"], name="index_probe_added"))]


def index_probe_state() -> ProjectState:
    state = ProjectState()
    state.add_model(ModelState("index_probe", "probe", [
        ("id", models.IntegerField(primary_key=True)), ("added", models.IntegerField(null=True))],
        options={"db_table": "index_probe"}))
    return state


def probe_indexes() -> list[tuple[str, bool]]:
    with connection.cursor() as cursor:
        cursor.execute("select indexrelid::regclass::text, indisvalid from pg_index"
                       " where indrelid = 'index_probe'::regclass order by 1")
        return [(name, valid) for name, valid in cursor.fetchall()]


@pytest.fixture
def index_probe(transactional_db: None) -> Iterator[None]:
    with connection.cursor() as cursor:
        cursor.execute("create table index_probe (id integer primary key, added integer)")
    yield
    with connection.cursor() as cursor:
        cursor.execute("drop table index_probe")


def test_a_concurrent_index_build_runs_again_over_an_invalid_leftover(index_probe: None) -> None:
    def build() -> None:
        with connection.schema_editor(atomic=False) as editor:
            IndexMigration("0002_index", "index_probe").apply(index_probe_state(), editor)

    build()
    assert probe_indexes() == [("index_probe_added", True), ("index_probe_pkey", True)]
    with connection.cursor() as cursor:  # what a build that timed out half-way leaves
        cursor.execute("update pg_index set indisvalid = false"
                       " where indexrelid = 'index_probe_added'::regclass")
    build()
    assert probe_indexes() == [("index_probe_added", True), ("index_probe_pkey", True)]


def test_the_concurrent_index_build_passes_squawk(index_probe: None) -> None:
    with connection.schema_editor(collect_sql=True, atomic=False) as editor:
        IndexMigration("0002_index", "index_probe").apply(index_probe_state(), editor,
                                                          collect_sql=True)
    assert [sql for sql in editor.collected_sql if not sql.startswith("--")][2:] == [
        'DROP INDEX CONCURRENTLY IF EXISTS "index_probe_added";',
        'CREATE INDEX CONCURRENTLY IF NOT EXISTS "index_probe_added" ON "index_probe" ("added");']
    assert run_squawk({"index_probe.0002_index": "\n".join(editor.collected_sql)}) == []
