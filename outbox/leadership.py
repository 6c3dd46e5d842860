"""Which relay publishes (docs/outbox-relay.md, "One relay at a time"): the one holding the
relays' session advisory lock, taken without waiting once per database session, and never on a
server in recovery (a standby: the relay stands by until it is promoted). The leader checks that
the stream belongs to this cluster before reading it (`settle`), a pooler by transaction is refused
at start, before the lead (core.db's `transaction_pooler_in_the_way`), and every batch it records checks
that its statements still reach the server process that took the lead (`leader_pid`,
store.advance: a pooler by transaction would break the lock's meaning), and its reader checks
that it reads the server the relay leads on (`server`, outbox.lanes)."""

import contextlib
import logging

from django.db import connections

from core.db import DatabaseErrors, transaction_pooler_in_the_way
from outbox import store
from outbox.config import Emit


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
        self.server: store.Server | None = None  # the server the relay leads on, while it does
        self.in_recovery: store.Server | None = None  # the server of the last look, if a standby
        self._probed = False

    def lead(self) -> bool:
        """True while this relay holds the relays' lock: taken, without waiting, once per
        database session (a session that ended released it, and a standby may hold it now)."""
        session = connections[self.using].connection
        if session is None or session is not self._session:
            if not self._probed:  # before anything lives in the session (its lock, its settings)
                self._refuse_a_transaction_pooler()
            # A new database session: its commits need no WAL flush wait (a lost mark after a
            # database crash only means sending those rows again).
            self._session = store.relax_commit_durability(self.using)
            self.leading = False
            self.server = None
        if not self.leading:
            # A session's server leaves recovery (promoted) but never enters it: a look per
            # session that does not lead is enough.
            lead = store.look_for_the_lead(self.using)
            if not self._on_a_primary(lead.server):
                return False
            self.leading = lead.taken
            self.leader_pid = lead.pid if lead.taken else 0
            self.server = lead.server if lead.taken else None
            if self.leading:
                self._emit(logging.INFO, "relay leading", {})
            elif not self._standing_by:  # said once, not at every look
                self._emit(logging.INFO, "another relay leads, standing by", {})
            self._standing_by = not self.leading
            self.stood_by = self.stood_by or self._standing_by
        return self.leading

    def _refuse_a_transaction_pooler(self) -> None:
        """SessionChangedError (exit 2) when a pooler by transaction is between the relay and
        PostgreSQL: its lock and settings would stay on a server connection others get."""
        pid = transaction_pooler_in_the_way(self.using)
        self._probed = True
        if pid is not None:
            raise store.SessionChangedError(
                f"the relay's session and another one both reached server process {pid}: a "
                "connection pooler that pools by transaction (PgBouncer pool_mode=transaction) "
                "is between the relay and PostgreSQL; give the relay a DATABASE_URL that "
                "connects directly or through session pooling (pool_mode=session)")

    def _on_a_primary(self, server: store.Server) -> bool:
        """False (and said once) while the server is in recovery; said again once promoted."""
        if server.in_recovery:
            if self.in_recovery is None:
                self._emit(logging.WARNING,
                           "database server in recovery (a standby), standing by until it is "
                           "promoted", {"server": str(server)})
            self.in_recovery = server
            return False
        if self.in_recovery is not None:
            self._emit(logging.WARNING, "database server promoted, looking for the lead",
                       {"server": str(server)})
            self.in_recovery = None
        return True

    def confirm_server(self) -> store.Server | None:
        """The server the relay leads on, asked again on its own session (a session that ended
        raises the database's error): None when it does not lead."""
        if not self.leading:
            return None
        self.server = store.session_server(self.using)
        return self.server

    def resign(self) -> None:
        """Release the lock (if this relay still holds it on a live session)."""
        session = connections[self.using].connection
        if self.leading and session is not None and session is self._session:
            with contextlib.suppress(*DatabaseErrors):
                store.resign(self.using)
        self.leading = False
        self.server = None

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
