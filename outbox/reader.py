"""The stream's reads, on a database session of their own (docs/outbox-relay.md, "One
batch"): set up to read in index order (query `stream_reader_session`), and able to read the
next batch ahead, on a thread of its own, while the relay produces the current one, so that
PostgreSQL's work and the wire overlap the relay's. How many rows a read asks for adapts to the
stream (outbox.read_size: small while it is nearly caught up, growing while a backlog drains).

Only reads run here (nothing is written, no lock is taken); the relay's own session keeps the
lead, moves the position and runs everything else. A read started after a position that is no
longer the one wanted (the batch before stopped short) is waited for and dropped. The session
stays open while the relay runs; `close()` ends it.

The session reconnects on its own, so it may reach another server than the relay's (a failover
window, a virtual address that moved): at every (re)connection, and before every read, its
server must be the primary the relay leads on (same cluster, same postmaster start, not in
recovery), else the read stops with ReaderOnAnotherServerError and nothing is read there.
"""

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import psycopg

from core.db import DatabaseErrors, new_session
from outbox import store
from outbox.read_size import ReadSize


class Leader(Protocol):
    """The server the relay leads on (outbox.leadership.Leadership)."""

    server: store.Server | None

    def confirm_server(self) -> store.Server | None: ...


class StreamReader:
    """Reads of the stream for one relay, at most one ahead, each of `size.rows` rows at most
    (up to `batch_size`); with a `leader`, only on the server it leads on."""

    def __init__(self, using: str, batch_size: int, *, leader: Leader | None = None,
                 size: ReadSize | None = None) -> None:
        self.using = using
        self.size = size or ReadSize.up_to(batch_size)
        self._leader = leader
        self._session: psycopg.Connection[Any] | None = None
        self._server: store.Server | None = None  # the server the session reached
        self._pool: ThreadPoolExecutor | None = None
        # A read started ahead: where it starts, the rows it asked for, the read.
        self._ahead: tuple[store.Position, int, Future[store.Read]] | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        """The reader's session: connected like the alias's, in the same role, to the server the
        relay leads on."""
        if self._session is not None and not self._session.closed and self._on_the_leaders():
            return self._session
        self._close_session()  # closed, or on another server than the leader's now: anew
        session = new_session(self.using, store.QUERIES["stream_reader_session"])
        self._session, self._server = session, store.server_of(session)
        if not self._on_the_leaders(confirm=True):
            reached, leading = self._server, self._leader and self._leader.server
            self._close_session()
            raise store.ReaderOnAnotherServerError(
                f"the relay's reader reached {reached}, not the server the relay leads on, "
                f"{leading}: the pass is stopped before reading there (nothing read there is "
                "sent or recorded); check that DATABASE_URL names one primary")
        return session

    def _on_the_leaders(self, *, confirm: bool = False) -> bool:
        """Is the session on the server the relay leads on? With `confirm`, a mismatch is
        asked again of the leader's own session (a leader whose session ended raises there)."""
        if self._leader is None or self._leader.server is None:
            return True
        assert self._server is not None  # noqa: S101 - set with the session
        if self._server.is_the_same_primary_as(self._leader.server):
            return True
        leading = self._leader.confirm_server() if confirm else None
        return leading is not None and self._server.is_the_same_primary_as(leading)

    def _read(self, after: store.Position, rows: int,
              session: psycopg.Connection[Any] | None = None) -> store.Read:
        return store.read_stream(session or self._connection(), batch_size=rows, after=after)

    def _sized(self, asked: int, read: store.Read) -> store.Read:
        """The read, its outcome told to the read size (a read nobody takes is not)."""
        messages = read.messages
        self.size.observe(asked, len(messages),
                          sum(len(m.payload) + len(m.headers) for m in messages))
        return read

    def read_ahead(self, after: store.Position) -> None:
        """Start reading the batch after `after` in the background (the session is opened
        here, on the caller's thread: Django's connections are per thread)."""
        self.drop()
        session = self._connection()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-reader")
        rows = self.size.rows
        self._ahead = (after, rows, self._pool.submit(self._read, after, rows, session))

    def read(self, after: store.Position) -> store.Read:
        """The batch after `after`: the read started ahead if it was for there, else now. A
        database failure of either is raised here (and the reader's session is dropped)."""
        ahead, self._ahead = self._ahead, None
        try:
            if ahead is not None and ahead[0] == after:
                return self._sized(ahead[1], ahead[2].result())
            if ahead is not None:
                self._wait(ahead[2])
            rows = self.size.rows
            return self._sized(rows, self._read(after, rows))
        except DatabaseErrors:
            self._close_session()
            raise

    def drop(self) -> None:
        """Forget a read started ahead (waiting for it to end: one read at a time)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            self._wait(ahead[2])

    def _wait(self, future: "Future[store.Read]") -> None:
        """Wait for a read nobody wants any more; a session it failed on is dropped."""
        try:
            future.result()
        except DatabaseErrors:
            self._close_session()

    def _close_session(self) -> None:
        if self._session is not None:
            with contextlib.suppress(*DatabaseErrors):
                self._session.close()
            self._session = None
            self._server = None

    def close(self) -> None:
        self.drop()
        self._close_session()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
