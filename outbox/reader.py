"""The stream's reads, on a database session of their own (docs/outbox-relay.md, "One
batch"): set up to read in index order (query `stream_reader_session`), and able to read the
next batch ahead, on a thread of its own, while the relay produces the current one, so that
PostgreSQL's work and the wire overlap the relay's.

Only reads run here (nothing is written, no lock is taken); the relay's own session keeps the
lead, moves the position and runs everything else. A read started after a position that is no
longer the one wanted (the batch before stopped short) is waited for and dropped. The session
stays open while the relay runs; `close()` ends it.
"""

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import psycopg

from core.db import DatabaseErrors, new_session
from outbox import store


class StreamReader:
    """Reads of the stream for one relay, at most one ahead."""

    def __init__(self, using: str, batch_size: int) -> None:
        self.using = using
        self.batch_size = batch_size
        self._session: psycopg.Connection[Any] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: tuple[store.Position, Future[store.Read]] | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        """The reader's session: connected like the alias's, in the same role."""
        if self._session is None or self._session.closed:
            self._session = new_session(self.using, store.QUERIES["stream_reader_session"])
        return self._session

    def _read(self, after: store.Position,
              session: psycopg.Connection[Any] | None = None) -> store.Read:
        return store.read_stream(session or self._connection(), batch_size=self.batch_size,
                                    after=after)

    def read_ahead(self, after: store.Position) -> None:
        """Start reading the batch after `after` in the background (the session is opened
        here, on the caller's thread: Django's connections are per thread)."""
        self.drop()
        session = self._connection()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-reader")
        self._ahead = (after, self._pool.submit(self._read, after, session))

    def read(self, after: store.Position) -> store.Read:
        """The batch after `after`: the read started ahead if it was for there, else now. A
        database failure of either is raised here (and the reader's session is dropped)."""
        ahead, self._ahead = self._ahead, None
        try:
            if ahead is not None and ahead[0] == after:
                return ahead[1].result()
            if ahead is not None:
                self._wait(ahead[1])
            return self._read(after)
        except DatabaseErrors:
            self._close_session()
            raise

    def drop(self) -> None:
        """Forget a read started ahead (waiting for it to end: one read at a time)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            self._wait(ahead[1])

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

    def close(self) -> None:
        self.drop()
        self._close_session()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
