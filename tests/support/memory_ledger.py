"""A cycle's database in memory, for the one-minute tier (tests/unit): a ledger
(`reminders.ledger.Ledger`) and the cycle's connections (`reminders.claim_connections.
CycleConnections`: the due owners, the cycle's session and a second one), the same protocols
as production's on plain Python data, after procrastinate's in-memory connector.

Failures are ordered by owner: a claim holding a `failing` owner rolls back with a database
error, one holding a `losing` owner loses its session with it. As in PostgreSQL a claim
commits whole or not at all, a document is marked once (insert-wins: a second claim of it wins
nothing), and a lost session is never used again (the memory fails the test if it is)."""

import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

import psycopg

from reminders import rules, store
from reminders.claim_connections import Claim, ClaimOutcome
from reminders.result import CycleResult

EXPIRY = datetime(2026, 12, 1, tzinfo=UTC)


class LostSessionError(psycopg.OperationalError):
    """The claim's session was terminated (as `pg_terminate_backend` does)."""


def due_owners(*documents: int) -> list[store.DueOwner]:
    """Owners with these many due documents each, most urgent first."""
    return [store.DueOwner(uuid.uuid4(), EXPIRY, n, [str(uuid.uuid4()) for _ in range(n)])
            for n in documents]


@dataclass(frozen=True)
class ClaimMade:
    """A claim as the ledger saw it: on which thread, for which owners, and if it committed."""

    thread: str
    owners: tuple[uuid.UUID, ...]
    committed: bool


@dataclass
class MemoryLedger:
    """The ledger: markers (document ids) and events (owner ids), written by whole claims."""

    due: Sequence[store.DueOwner]
    failing: set[uuid.UUID] = field(default_factory=set)
    losing: set[uuid.UUID] = field(default_factory=set)
    reminder_event: str = "reminder queued"
    markers: set[str] = field(default_factory=set)
    events: list[uuid.UUID] = field(default_factory=list)
    claims: list[ClaimMade] = field(default_factory=list)
    started: bool = False
    prunes: int = 0
    finished: CycleResult | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        self.started = True

    def claim(self, owners: list[store.DueOwner]) -> store.BatchClaim:
        ids = {owner.owner_user_id for owner in owners}
        lost, failed = bool(ids & self.losing), bool(ids & self.failing)
        with self._lock:
            self.claims.append(ClaimMade(threading.current_thread().name,
                                         tuple(o.owner_user_id for o in owners),
                                         not (lost or failed)))
            if failed:  # the first error stands, as the statement's would
                raise psycopg.errors.RaiseException("the outbox refused the owner's event")
            if lost:
                raise LostSessionError("terminating connection due to administrator command")
            return self._commit(owners)

    def _commit(self, owners: list[store.DueOwner]) -> store.BatchClaim:
        notified = []
        for owner in owners:
            won = [doc for doc in owner.document_ids if doc not in self.markers]
            self.markers.update(won)
            if won:
                self.events.append(owner.owner_user_id)
            notified += [store.NotifiedItem(str(owner.owner_user_id), doc, "Passport", 7, 5)
                         for doc in won]
        return store.BatchClaim(
            markers_won=len(notified), due_documents=sum(len(o.document_ids) for o in owners),
            events_written=len({item.owner_user_id for item in notified}), markers_rearmed=0,
            owners_already_queued=0, notified=notified)

    def prune(self, stop: threading.Event, out_of_time: Callable[[], bool]) -> int:
        self.prunes += 1
        return 0

    def finish(self, result: CycleResult) -> None:
        self.finished = result

    def claimed_owners(self) -> list[uuid.UUID]:
        """The owners of committed claims, in the order they committed."""
        return [owner for made in self.claims if made.committed for owner in made.owners]


@dataclass
class MemorySession:
    """A session: connected, closed and lost as a thread's PostgreSQL session is."""

    name: str
    lost: bool = False
    connected_in: str | None = None
    closed_in: str | None = None

    def connect(self) -> None:
        self.connected_in = threading.current_thread().name

    def claim(self, claim: Claim, owners: list[store.DueOwner]) -> ClaimOutcome:
        assert not self.lost, f"a claim on the {self.name}'s session, lost before"
        try:
            return ClaimOutcome(owners, claim(owners))
        except psycopg.Error as exc:
            self.lost = isinstance(exc, LostSessionError)
            return ClaimOutcome(owners, exc, connection_lost=self.lost)

    def close(self) -> None:
        self.closed_in = threading.current_thread().name


class MemoryDueOwners:
    """The due owners as the held cursor gives them: read once, on the cycle's session."""

    def __init__(self, due: Sequence[store.DueOwner], session: MemorySession) -> None:
        self._due = list(due)
        self._session = session
        self.due_documents = sum(owner.due_documents for owner in due)
        self.window_documents = self.due_documents
        self.fetched = 0

    def fetch(self, size: int) -> list[store.DueOwner]:
        assert not self._session.lost, "due owners read on the cycle's session, lost before"
        chunk = self._due[self.fetched:self.fetched + size]
        self.fetched += len(chunk)
        return chunk


@dataclass
class MemoryConnections:
    """The cycle's connections to the memory: its own session and any second one."""

    ledger: MemoryLedger
    second_available: bool = True
    cycle: MemorySession = field(default_factory=lambda: MemorySession("cycle"))
    seconds: list[MemorySession] = field(default_factory=list)
    read: list[MemoryDueOwners] = field(default_factory=list)

    def refuse_a_transaction_pooler(self, run_id: uuid.UUID) -> None:
        pass

    @contextmanager
    def due_owners(
        self, window: rules.Window, thresholds: Sequence[int], as_of_date: date,
        *, run_id: uuid.UUID, page_owners: int,
    ) -> Iterator[MemoryDueOwners]:
        due = MemoryDueOwners(self.ledger.due, self.cycle)
        self.read.append(due)
        yield due

    def cycle_session(self) -> MemorySession:
        return self.cycle

    def second_session(self) -> MemorySession:
        if not self.second_available:
            raise psycopg.OperationalError("too many connections for role")
        self.seconds.append(MemorySession("second connection"))
        return self.seconds[-1]


def memory(*documents: int, failing: Iterable[int] = (), losing: Iterable[int] = (),
           second_available: bool = True) -> tuple[MemoryLedger, MemoryConnections]:
    """A ledger of owners with these many due documents each (most urgent first), the ones at
    the `failing` and `losing` positions failing, and the connections to it."""
    owners = due_owners(*documents)
    ledger = MemoryLedger(owners, failing={owners[i].owner_user_id for i in failing},
                          losing={owners[i].owner_user_id for i in losing})
    return ledger, MemoryConnections(ledger, second_available=second_available)
