"""Where a cycle's batches are claimed (docs/design.md §3.8): on the cycle's connection, and
with `REMINDER_CLAIM_CONNECTIONS=2` on a second one beside it, held by a thread of its own.

`claimed` is the pairing policy: which batch goes to which connection, and the order in which
their outcomes come back to the cycle, as values (`ClaimOutcome`: committed, rolled back, or
rolled back with its connection lost). A session (`ClaimSession`) claims one batch at a time
and tells a lost connection from a failed statement; `AliasConnections` gives the Django
alias's sessions, and reads the due owners on the cycle's.

Django's connections are per thread: the second connection's is opened, used and closed in its
thread only, always by `SecondConnection.close()`. It is the alias's connection (the same
settings, so the same timeouts and application name), in the role the cycle's session works
as, tuned as the cycle's (`store.tune_claim_session`).
"""

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext, suppress
from datetime import date
from types import TracebackType
from typing import NamedTuple, Protocol, Self

from django.db import connections

from core.config import ConfigError
from core.db import (
    DatabaseErrors,
    join_role,
    raw_connection,
    session_lost,
    session_role,
    transaction_pooler_in_the_way,
)
from core.logs import log_event
from reminders import rules, store

logger = logging.getLogger("reminders.cycle")  # logged as the cycle's doing

Claim = Callable[[list[store.DueOwner]], store.BatchClaim]

CYCLES_CONNECTION, SECOND_CONNECTION = 0, 1


class ConnectionLostError(ConnectionError):
    """The database connection was lost mid-cycle; the cycle ends as failed."""

    @classmethod
    def after(cls, cause: BaseException) -> "ConnectionLostError":
        """The error a cycle ends with once a claim's connection was lost to `cause`."""
        lost = cls("database connection lost")
        lost.__cause__ = cause
        return lost


class ClaimOutcome(NamedTuple):
    """What a batch's claim came to (`result`): what it did (committed), or the database error
    that rolled it back whole, and whether its connection was lost with it; on which connection
    it was claimed, and when its claim began (`time.time_ns()`)."""

    owners: list[store.DueOwner]
    result: store.BatchClaim | Exception
    connection_lost: bool = False
    connection: int = CYCLES_CONNECTION
    started_ns: int = 0


class ClaimSession(Protocol):
    """One thread's connection to claim on: connected, then one claim at a time, then closed,
    all in that thread."""

    def connect(self) -> None:
        """Ready to claim (the cycle's own session is, from the due owners' read)."""

    def claim(self, claim: Claim, owners: list[store.DueOwner]) -> ClaimOutcome:
        """`claim(owners)` on this session: its failure a value, never raised."""

    def close(self) -> None:
        """Closed (the cycle's own session stays open: the prune and the run history use it)."""


class DueOwnerRows(Protocol):
    """The due owners as a cycle reads them (`store.DueOwners`, `store.DuePages`)."""

    window_documents: int
    due_documents: int

    def fetch(self, size: int) -> list[store.DueOwner]:
        """Up to `size` more due owners, most urgent first; empty at the end."""


class CycleConnections(Protocol):
    """The cycle's connections: its own, where the due owners are read and batches claimed, and
    the sessions of a second claim connection."""

    def refuse_a_transaction_pooler(self, run_id: uuid.UUID) -> None:
        """Before anything is written: a ConfigError if the due owners could not be held."""

    def due_owners(
        self, window: rules.Window, thresholds: Sequence[int], as_of_date: date,
        *, run_id: uuid.UUID, page_owners: int,
    ) -> AbstractContextManager[DueOwnerRows]:
        """The due owners and the window's census, read on the cycle's connection."""

    def cycle_session(self) -> ClaimSession:
        """The cycle's own session (this thread's)."""

    def second_session(self) -> ClaimSession:
        """A session for a second claim connection, to connect in a thread of its own (asked on
        the cycle's thread: the database error if it cannot be had)."""


class AliasSession:
    """A thread's session of the Django alias `using`; `role`: the role to work as once
    connected (a second connection's: the cycle's)."""

    def __init__(self, using: str, role: str | None = None) -> None:
        self.using = using
        self.role = role

    def connect(self) -> None:
        if self.role is not None:
            join_role(self.using, self.role)
        store.tune_claim_session(self.using)

    def claim(self, claim: Claim, owners: list[store.DueOwner]) -> ClaimOutcome:
        session = raw_connection(self.using)
        try:
            return ClaimOutcome(owners, claim(owners))
        except DatabaseErrors as exc:
            # Lost also when Django has reconnected behind the failed claim (an atomic block
            # whose rollback failed): the new session has neither the held cursor nor the role.
            return ClaimOutcome(owners, exc,
                                connection_lost=session_lost(self.using, session))

    def close(self) -> None:
        with suppress(*DatabaseErrors):
            connections[self.using].close()


class AliasConnections:
    """The cycle's connections on the Django alias `using` (PostgreSQL)."""

    def __init__(self, using: str) -> None:
        self.using = using

    def refuse_a_transaction_pooler(self, run_id: uuid.UUID) -> None:
        """Where the alias holds its session across transactions (DATABASE_POOL_MODE=session,
        the default) and the due owners' cursor with it, a pooler that pools by transaction
        would drop that cursor mid-cycle: a ConfigError naming DATABASE_POOL_MODE (exit 2).
        Without a second connection to probe with (the server's or the pooler's limit) the
        cycle goes on, as it did before the probe."""
        using = self.using
        if not store.holds_sessions(using):
            return  # by pages, nothing held: a transaction pooler is fine
        raw_connection(using)  # the cycle's own session: if that fails, the cycle does
        try:
            pid = transaction_pooler_in_the_way(using)
        except DatabaseErrors as exc:
            log_event(logger, logging.WARNING, "transaction pooler probe skipped: no second "
                      "connection", run_id=run_id, error=type(exc).__name__)
            return
        if pid is not None:
            raise ConfigError(
                "DATABASE_POOL_MODE",
                f"unset or session, but the worker's session and another one both reached "
                f"server process {pid}: a connection pooler that pools by transaction "
                "(PgBouncer pool_mode=transaction) is between the worker and PostgreSQL; set "
                "DATABASE_POOL_MODE=transaction (the cycle then reads its due owners by pages), "
                "or connect directly or through session pooling; nothing was written")

    def due_owners(
        self, window: rules.Window, thresholds: Sequence[int], as_of_date: date,
        *, run_id: uuid.UUID, page_owners: int,
    ) -> AbstractContextManager[DueOwnerRows]:
        return store.due_owners(self.using, window, thresholds, as_of_date, run_id=run_id,
                                page_owners=page_owners)

    def cycle_session(self) -> ClaimSession:
        return AliasSession(self.using)

    def second_session(self) -> ClaimSession:
        return AliasSession(self.using, role=session_role(self.using))  # the cycle's role


class SecondConnection:
    """`with SecondConnection.open(session, claim) as second`: a connected second claim
    connection; `second.send(owners)` claims a batch there; leaving the block waits for the
    batch in flight and closes the connection."""

    def __init__(self, session: ClaimSession, claim: Claim) -> None:
        self._session = session
        self._claim = claim
        self._executor = ThreadPoolExecutor(max_workers=1,
                                            thread_name_prefix="second-claim-connection")
        self._closed = False

    @classmethod
    def open(cls, session: ClaimSession, claim: Claim) -> Self:
        """Connected in its thread; the database error if it cannot connect (nothing left open
        then)."""
        second = cls(session, claim)
        try:
            second._executor.submit(session.connect).result()
        except BaseException:
            second.close()
            raise
        return second

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def send(self, owners: list[store.DueOwner]) -> "Future[ClaimOutcome]":
        """Claim `owners` there (one batch at a time: a second waits for the first)."""
        started = time.time_ns()  # on the sender's thread: before any batch claimed meanwhile
        return self._executor.submit(self._claim_batch, owners, started)

    def close(self) -> None:
        """Wait for the batch in flight, close the connection in its thread, end the thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._executor.submit(self._session.close).result()
        finally:
            self._executor.shutdown(wait=True)

    def _claim_batch(self, owners: list[store.DueOwner], started: int) -> ClaimOutcome:
        outcome = self._session.claim(self._claim, owners)
        return outcome._replace(connection=SECOND_CONNECTION, started_ns=started)


def open_second_connection(
    connections: CycleConnections, claim: Claim, *, wanted: int, run_id: uuid.UUID,
) -> AbstractContextManager[SecondConnection | None]:
    """A second claim connection if `wanted` is 2 and one can be had; else None (logged: the
    server's or the pooler's limit), and the cycle's connection claims alone."""
    if wanted < 2:
        return nullcontext()
    try:
        return SecondConnection.open(connections.second_session(), claim)
    except DatabaseErrors as exc:
        log_event(logger, logging.WARNING, "second claim connection unavailable, claiming on"
                  " one", run_id=run_id, error=type(exc).__name__)
        return nullcontext()


def claimed(
    batches: Iterable[list[store.DueOwner]], claim: Claim, here: ClaimSession,
    second: SecondConnection | None,
) -> Iterator[ClaimOutcome]:
    """Each batch's outcome, in the order the cycle is to settle them. On the cycle's
    connection alone (`second` None), batch after batch. With a second connection, in pairs:
    the first sent there, the next claimed `here` while it runs and yielded, then the sent one
    yielded once done. A batch is taken from `batches` only when it is to start: a source that
    ends (a stop, the deadline, a lost connection) starts none, and the batch in flight is
    still yielded."""
    sent: Future[ClaimOutcome] | None = None
    for owners in batches:
        if second is not None and sent is None:
            sent = second.send(owners)
            continue
        started = time.time_ns()
        yield here.claim(claim, owners)._replace(started_ns=started)
        if sent is not None:
            settling, sent = sent, None
            yield settling.result()
    if sent is not None:
        yield sent.result()
