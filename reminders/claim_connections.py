"""The cycle's second claim connection (docs/design.md §3.8): a thread of its own that claims
one batch at a time on a connection of its own while the cycle's thread claims the next batch
on the cycle's connection.

Django's connections are per thread: the lane's is opened, used and closed in the lane's
thread only, always by `close()`. It is the alias's connection (the same settings, so the
same timeouts and application name), in the role the cycle's session works as, tuned as the
cycle's (`store.tune_claim_session`).
"""

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from types import TracebackType
from typing import NamedTuple, Self

from django.db import connections

from core.db import DatabaseErrors, join_role, raw_connection, session_lost, session_role
from reminders import store

Claim = Callable[[list[store.DueOwner]], store.BatchClaim]


class LaneOutcome(NamedTuple):
    """What a batch sent to the lane came to: its claim (committed), or the database error
    that rolled it back whole, and whether the lane's connection was lost with it."""

    claim: store.BatchClaim | None = None
    error: Exception | None = None
    connection_lost: bool = False


class ClaimLane:
    """`with ClaimLane.open(using, claim) as lane`: a connected lane; `lane.send(owners)`
    claims a batch there; leaving the block waits for the batch in flight and closes the
    connection."""

    def __init__(self, using: str, claim: Claim) -> None:
        self.using = using
        self._claim = claim
        self._role = session_role(using)  # read on the cycle's thread, from the cycle's session
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="claim-lane")
        self._closed = False

    @classmethod
    def open(cls, using: str, claim: Claim) -> Self:
        """A lane connected in its thread; the database error if it cannot connect (nothing
        left open then)."""
        lane = cls(using, claim)
        try:
            lane._executor.submit(lane._connect).result()
        except BaseException:
            lane.close()
            raise
        return lane

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def send(self, owners: list[store.DueOwner]) -> "Future[LaneOutcome]":
        """Claim `owners` on the lane (one batch at a time: a second waits for the first)."""
        return self._executor.submit(self._claim_batch, owners)

    def close(self) -> None:
        """Wait for the batch in flight, close the lane's connection in its thread, end it."""
        if self._closed:
            return
        self._closed = True
        try:
            self._executor.submit(self._disconnect).result()
        finally:
            self._executor.shutdown(wait=True)

    # --- in the lane's thread ----------------------------------------------------------------

    def _connect(self) -> None:
        join_role(self.using, self._role)
        store.tune_claim_session(self.using)

    def _claim_batch(self, owners: list[store.DueOwner]) -> LaneOutcome:
        session = raw_connection(self.using)
        try:
            return LaneOutcome(claim=self._claim(owners))
        except DatabaseErrors as exc:
            return LaneOutcome(error=exc, connection_lost=session_lost(self.using, session))

    def _disconnect(self) -> None:
        with suppress(*DatabaseErrors):
            connections[self.using].close()
