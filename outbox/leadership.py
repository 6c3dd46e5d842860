"""Which relay publishes (docs/outbox-relay.md, "One relay at a time"): the one holding the
relays' session advisory lock, taken without waiting once per database session. The leader
checks that the stream belongs to this cluster before reading it (`settle`), and every batch it
records checks that its statements still reach the server process that took the lead
(`leader_pid`, store.advance: a pooler by transaction would break the lock's meaning)."""

import contextlib
import logging

from django.db import connections

from core.db import DatabaseErrors
from outbox import store
from outbox.outage import Emit


class Leadership:
    """One relay's lead on one database alias."""

    def __init__(self, using: str, *, emit: Emit) -> None:
        self.using = using
        self._emit = emit
        self._session: object | None = None  # the database session the relay last led on
        self.leading = False
        self.leader_pid = 0  # the server process holding the lead (advance checks it)
        self._standing_by = False
        self.stood_by = False  # another relay was leading at some look

    def lead(self) -> bool:
        """True while this relay holds the relays' lock: taken, without waiting, once per
        database session (a session that ended released it, and a standby may hold it now)."""
        session = connections[self.using].connection
        if session is None or session is not self._session:
            # A new database session: its commits need no WAL flush wait (a lost mark after a
            # database crash only means sending those rows again).
            self._session = store.relax_commit_durability(self.using)
            self.leading = False
        if not self.leading:
            pid = store.try_to_lead(self.using)
            self.leading = pid is not None
            self.leader_pid = pid or 0
            if self.leading:
                self._emit(logging.INFO, "relay leading", {})
            elif not self._standing_by:  # said once, not at every look
                self._emit(logging.INFO, "another relay leads, standing by", {})
            self._standing_by = not self.leading
            self.stood_by = self.stood_by or self._standing_by
        return self.leading

    def resign(self) -> None:
        """Release the lock (if this relay still holds it on a live session)."""
        session = connections[self.using].connection
        if self.leading and session is not None and session is self._session:
            with contextlib.suppress(*DatabaseErrors):
                store.resign(self.using)
        self.leading = False

    def settle(self) -> None:
        """Make sure the stream's ids belong to this cluster before reading it: re-based onto a
        new cluster the database moved to, if no writer did that first (StreamAheadError when
        the same cluster's stored ids are ahead of its own)."""
        settled = store.settle_stream(self.using)
        if settled.moved:
            self._emit(logging.WARNING,
                       "outbox database moved to another cluster: stream re-based onto it"
                       if settled.rebased else
                       "outbox database moved to another cluster: its transaction ids continue "
                       "past the stream's",
                       {"from_system": str(settled.recorded_system),
                        "to_system": str(settled.this_system),
                        "txid_offset": settled.txid_offset})
