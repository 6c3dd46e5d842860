"""Wake-up for `--loop`: LISTEN on the channel the outbox insert trigger notifies (migration
0003_relay_claims), so a new event goes out within a second; polling covers a lost connection
or a missed notification."""

import logging
import threading
import time
from typing import Any

import psycopg

from core.db import DatabaseErrors, new_session
from core.logs import log_event
from outbox import store

logger = logging.getLogger("outbox.wakeup")

# How often a wait looks at the stop event: a signal does not interrupt a blocking read.
STOP_CHECK_S = 0.2


class Wakeup:
    """A dedicated autocommit connection that LISTENs; `wait` returns on a notification, at the
    polling interval, or when `stop` is set. Reconnects lazily after a failure."""

    def __init__(self, using: str = "default") -> None:
        self.using = using
        self._conn: psycopg.Connection[Any] | None = None

    def listen(self) -> psycopg.Connection[Any] | None:
        """Start listening (if not already): call before looking for work, so that nothing
        inserted after the look goes unnoticed."""
        if self._conn is not None and not self._conn.closed:
            return self._conn
        try:
            conn = new_session(self.using, store.QUERIES["listen_for_new_rows"])
        except DatabaseErrors as exc:
            log_event(logger, logging.WARNING, "listen failed, polling instead",
                      error=f"{type(exc).__name__}: {exc}".strip()[:300])
            return None
        self._conn = conn
        return conn

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        """Wait up to `timeout` seconds; True if a notification arrived."""
        deadline = time.monotonic() + timeout
        conn = self.listen()
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if conn is None:
                stop.wait(min(left, STOP_CHECK_S))
                continue
            try:
                if any(True for _ in conn.notifies(timeout=min(left, STOP_CHECK_S), stop_after=1)):
                    self._drain(conn)
                    return True
            except psycopg.Error as exc:
                log_event(logger, logging.WARNING, "listen connection lost, polling instead",
                          error=f"{type(exc).__name__}: {exc}".strip()[:300])
                self.close()
                conn = None
        return False

    @staticmethod
    def _drain(conn: psycopg.Connection[Any]) -> None:
        # One wake-up covers every notification already queued.
        for _ in conn.notifies(timeout=0):
            pass

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
