"""Database plumbing shared by both apps: the psycopg connection behind a Django alias,
server-binding cursors, the errors that mean "the database failed", chunked deletes, and the
probe for a connection pooler that pools by transaction."""

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import psycopg.sql
from django.db import Error as DjangoDatabaseError
from django.db import connections, transaction

from core.queries import QueryFile

# What a database failure looks like, from psycopg directly or through Django.
DatabaseErrors = (psycopg.Error, DjangoDatabaseError)
QUERIES = QueryFile(Path(__file__).parent / "sql" / "sessions.sql")
# Rounds of the pooler probe: a pooler may hand the other session another idle server once.
POOLER_PROBE_ROUNDS = 3


def raw_connection(using: str) -> psycopg.Connection[Any]:
    """The live psycopg connection behind a Django alias (connecting if needed)."""
    wrapper = connections[using]
    wrapper.ensure_connection()
    conn = wrapper.connection
    if conn is None:
        raise psycopg.InterfaceError(f"no connection for database alias {using!r}")
    return conn  # type: ignore[no-any-return]


def session_role(using: str) -> str:
    """The role this thread's session of the alias works as now (`current_user`: a process
    that SET ROLE is in that role)."""
    row = raw_connection(using).execute("select current_user").fetchone()
    if row is None:
        raise psycopg.ProgrammingError("the statement returned no row")
    return str(row[0])


def _enter_role(session: psycopg.Connection[Any], role: str) -> None:
    if role != session.info.user:
        session.execute(psycopg.sql.SQL("set role {}").format(psycopg.sql.Identifier(role)))


def join_role(using: str, role: str) -> None:
    """This thread's session of the alias (connected with the alias's settings) works as `role`,
    as another thread's does (`session_role` there)."""
    _enter_role(raw_connection(using), role)


def new_session(using: str, *setup: str) -> psycopg.Connection[Any]:
    """A new autocommit session connected like the alias's, in the role the alias's session
    is in now (a process that SET ROLE works as that role here too), set up by the `setup`
    statements (run last)."""
    role = session_role(using)
    wrapper = connections[using]
    session: psycopg.Connection[Any] = wrapper.get_new_connection(wrapper.get_connection_params())
    try:
        session.autocommit = True
        _enter_role(session, role)
        for statement in setup:
            session.execute(statement.encode())
    except BaseException:
        session.close()
        raise
    return session


def transaction_pooler_in_the_way(using: str) -> int | None:
    """The server process that the alias's session and a second one both reached, statement
    after statement: a pooler that pools by transaction hands the server connection this
    session just released to the next client (PgBouncer reuses the latest first); directly or
    by session, two sessions never share one. None when no round shared one."""
    wrapper = connections[using]
    mine = raw_connection(using)
    with wrapper.get_new_connection(wrapper.get_connection_params()) as other:
        other.autocommit = True
        for _ in range(POOLER_PROBE_ROUNDS):
            pid = _backend_pid(mine)
            if _backend_pid(other) == pid:
                return pid
    return None


def _backend_pid(conn: psycopg.Connection[Any]) -> int:
    with psycopg.Cursor(conn) as cur:
        cur.execute(QUERIES["backend_pid"])
        return int(one(cur)[0])


def server_cursor(using: str) -> psycopg.Cursor[Any]:
    """A plain psycopg cursor: it binds parameters on the server (Django's are client-side)."""
    return psycopg.Cursor(raw_connection(using))


def one(cur: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    """The single row a statement must return."""
    row = cur.fetchone()
    if row is None:
        raise psycopg.ProgrammingError("the statement returned no row")
    return tuple(row)


def connection_alive(using: str) -> bool:
    """Is the alias's connection open and usable (not lost mid-cycle)?"""
    wrapper = connections[using]
    raw = wrapper.connection
    return raw is not None and not raw.closed and wrapper.is_usable()


def session_lost(using: str, session: psycopg.Connection[Any]) -> bool:
    """Was `session`, the alias's session a statement ran on, lost? Also when Django has
    reconnected behind it (an atomic block whose rollback failed): the new session has none of
    the old one's state (a held cursor, the role, the tuning)."""
    return session.closed or not connection_alive(using)


@contextmanager
def thread_connection(using: str = "default") -> Iterator[None]:
    """Run the block on the current thread's connection, closed afterwards off the main thread
    (the main thread's connection belongs to the loop, or to a test's transaction)."""
    try:
        yield
    finally:
        if threading.current_thread() is not threading.main_thread():
            connections[using].close()


def apply_sql_file(path: Path, using: str = "default") -> None:
    """Run a whole SQL script (several statements, no parameters) in one transaction."""
    conn = raw_connection(using)
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(path.read_text(encoding="utf-8").encode())


def delete_in_chunks(
    using: str,
    delete_chunk: Callable[[int], int],
    *,
    chunk: int,
    stop: threading.Event | None = None,
    out_of_time: Callable[[], bool] = lambda: False,
    progress: Callable[[int], object] | None = None,
) -> int:
    """Call `delete_chunk(chunk)` in its own transaction until it deletes less than a chunk
    (or the stop or the time budget says so); the total deleted (also told to `progress`
    after each chunk)."""
    total = 0
    while not (stop and stop.is_set()) and not out_of_time():
        with transaction.atomic(using=using, durable=True):
            deleted = delete_chunk(chunk)
        total += deleted
        if progress is not None:
            progress(total)
        if deleted < chunk:
            break
    return total
