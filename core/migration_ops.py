"""Migrations that cannot stall the service (docs/deployment.md, "Writing a migration").

A migration that subclasses `LockTimeoutMigration` sets `lock_timeout` and `statement_timeout`
first (so `sqlmigrate` shows them, and squawk checks them), and turns a lock timeout into
`MigrationLockTimeoutError` naming the statement that waited. `migrate_with_lock_retries` runs a
whole `migrate` again, in a new transaction, a bounded number of times: the `migrate` command
(core/management/commands/migrate.py) wraps Django's in it.
"""

import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg.errors
from django.contrib.postgres import operations as postgres_operations
from django.db import OperationalError, connection, migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import ProjectState

from core.logs import log_event
from core.queries import QueryFile

log = logging.getLogger(__name__)

QUERIES = QueryFile(Path(__file__).parent / "sql" / "migrations.sql")

# A writer queued behind a migration's ACCESS EXCLUSIVE request waits at most this long.
LOCK_TIMEOUT = "5s"
# A statement under a lock that blocks writers must be quick; a long one is batched instead.
STATEMENT_TIMEOUT = "1min"
LOCK_ATTEMPTS = 5
LOCK_RETRY_PAUSE_SECONDS = 5.0


class MigrationLockTimeoutError(Exception):
    """A migration's statement could not take its lock within the migration's lock_timeout."""

    def __init__(self, migration: str, lock_timeout: str, statement: str,
                 detail: str = "") -> None:
        self.migration = migration
        self.lock_timeout = lock_timeout
        self.statement = statement
        super().__init__(f"migration {migration} could not take its lock within lock_timeout "
                         f"{lock_timeout}, in: {first_line(statement)}"
                         + (f" ({detail})" if detail else ""))


def first_line(statement: str, limit: int = 160) -> str:
    """The statement's first line that is no comment, cut to `limit` characters."""
    lines = [line.strip() for line in statement.splitlines()]
    text = next((line for line in lines if line and not line.startswith("--")), "")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_lock_timeout(error: BaseException) -> bool:
    """Whether `error` (or what Django wrapped) is PostgreSQL's lock_not_available (55P03)."""
    return isinstance(error, psycopg.errors.LockNotAvailable) or isinstance(
        error.__cause__, psycopg.errors.LockNotAvailable)


class LockTimeoutMigration(migrations.Migration):
    """Every migration after the squawk baseline subclasses this (core/squawk_baseline.toml).

    An atomic migration sets both timeouts with SET LOCAL (they end with its transaction); a
    non-atomic one (CREATE INDEX CONCURRENTLY) sets them for the session, and usually sets
    `statement_timeout = "0"`: a concurrent build blocks no writer but may take minutes.
    """

    lock_timeout = LOCK_TIMEOUT
    statement_timeout = STATEMENT_TIMEOUT

    def apply(self, project_state: ProjectState, schema_editor: BaseDatabaseSchemaEditor,
              collect_sql: bool = False) -> ProjectState:
        self.set_timeouts(schema_editor)
        with self.naming_lock_timeouts(schema_editor):
            return super().apply(project_state, schema_editor, collect_sql)

    def unapply(self, project_state: ProjectState, schema_editor: BaseDatabaseSchemaEditor,
                collect_sql: bool = False) -> ProjectState:
        self.set_timeouts(schema_editor)
        with self.naming_lock_timeouts(schema_editor):
            return super().unapply(project_state, schema_editor, collect_sql)

    def set_timeouts(self, schema_editor: BaseDatabaseSchemaEditor) -> None:
        scope = "SET LOCAL" if self.atomic else "SET"
        schema_editor.execute(f"{scope} lock_timeout = '{self.lock_timeout}'")
        schema_editor.execute(f"{scope} statement_timeout = '{self.statement_timeout}'")

    @contextmanager
    def naming_lock_timeouts(self, schema_editor: BaseDatabaseSchemaEditor) -> Iterator[None]:
        """Raise MigrationLockTimeoutError with the statement that waited, instead of the bare
        'canceling statement due to lock timeout'."""

        def execute(run: Callable[..., Any], sql: str, params: Any, many: bool,
                    context: dict[str, Any]) -> Any:
            try:
                return run(sql, params, many, context)
            except OperationalError as error:
                if is_lock_timeout(error):
                    raise MigrationLockTimeoutError(f"{self.app_label}.{self.name}",
                                               self.lock_timeout, str(sql)) from error
                raise

        with schema_editor.connection.execute_wrapper(execute):
            yield


class AddIndexConcurrently(postgres_operations.AddIndexConcurrently):
    """Django's AddIndexConcurrently, rerunnable (squawk's prefer-robust-stmts): it drops an
    index of that name first, since a concurrent build that failed or timed out leaves an
    INVALID one behind that `IF NOT EXISTS` alone would keep, then builds it IF NOT EXISTS."""

    def database_forwards(self, app_label: str, schema_editor: BaseDatabaseSchemaEditor,
                          from_state: ProjectState, to_state: ProjectState) -> None:
        self._ensure_not_in_transaction(schema_editor)
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        name = schema_editor.quote_name(self.index.name)
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        create = str(self.index.create_sql(model, schema_editor, concurrently=True))
        schema_editor.execute(_CREATE_INDEX.sub(r"\g<0> IF NOT EXISTS", create, count=1))


_CREATE_INDEX = re.compile(r"^CREATE (UNIQUE )?INDEX CONCURRENTLY")


def lock_holders(statement: str) -> list[str]:
    """Who holds a lock on a table `statement` names, one line each, for the error message."""
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["lock_holders"], {"statement": statement})
        rows = cursor.fetchall()
    return [f"{relation}: {mode} held by pid {pid} ({application}, {state}, transaction open "
            f"{seconds} s)" for relation, mode, pid, application, state, seconds in rows]


def migrate_with_lock_retries(run: Callable[[], object], *, attempts: int = LOCK_ATTEMPTS,
                              pause_seconds: float = LOCK_RETRY_PAUSE_SECONDS,
                              sleep: Callable[[float], None] = time.sleep) -> int:
    """Run `run` (a whole `migrate`) until no migration times out on a lock, at most `attempts`
    times, pausing between attempts (outside any transaction: the writers queued behind the
    migration go first). Returns the attempts used; the last MigrationLockTimeoutError is raised
    again, with the lock's holders, when every attempt timed out."""
    attempt = 1
    while True:
        try:
            run()
            return attempt
        except MigrationLockTimeoutError as timeout:
            holders = lock_holders(timeout.statement)
            log_event(log, logging.WARNING, "migration lock timeout",
                      migration=timeout.migration, attempt=attempt, attempts=attempts,
                      statement=first_line(timeout.statement), holders=holders)
            if attempt >= attempts:
                held = "; ".join(holders) or "none left (it ended after the timeout)"
                raise MigrationLockTimeoutError(
                    timeout.migration, timeout.lock_timeout, timeout.statement,
                    f"{attempts} attempts; lock held by: {held}") from timeout
        sleep(pause_seconds)
        attempt += 1
