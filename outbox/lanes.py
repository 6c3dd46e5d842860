"""The relay's two lanes, and what their batches did.

The stream lane (docs/outbox-relay.md, "One batch"): batches read after the position, in the
order their transactions wrote them, produced while the batch before awaits its reports, and
recorded in order, each by one transaction that moves the position past it (store.advance).

A batch ends before a key it already has or one still in flight (`cut`: one row per key in
flight at a time). A row the broker refused, a row its partition could not take while the
cluster took others (deferred), and every later row of its key, leave the stream for the slow
lane (they are "detoured"). If the broker could not take a row (nothing of the batch delivered),
the position stops just before it and the rest is read again: the next batch is then a probe,
cut past the keys it already has (their later rows held behind their head, not ending it), so
that a head row its partition cannot take does not make every batch that one row.

The stream's reads (`StreamReader`), on a database session of their own (docs/outbox-relay.md, "One
batch"): set up to read in index order (query `stream_reader_session`), and able to read the
next batch ahead, on a thread of its own, while the relay produces the current one, so that
PostgreSQL's work and the wire overlap the relay's. How many rows a read asks for adapts to the
stream (`ReadSize`: small while it is nearly caught up, growing while a backlog drains).

Only reads run here (nothing is written, no lock is taken); the relay's own session keeps the
lead, moves the position and runs everything else. A read started after a position that is no
longer the one wanted (the batch before stopped short) is waited for and dropped. The session
stays open while the relay runs; `close()` ends it.

The session reconnects on its own, so it may reach another server than the relay's (a failover
window, a virtual address that moved): at every (re)connection, and before every read, its
server must be the primary the relay leads on (same cluster, same postmaster start, not in
recovery), else the read stops with ReaderOnAnotherServerError and nothing is read there.

How many rows the stream's next read asks for (`ReadSize`, docs/outbox-relay.md, "The read size"): few
while the stream is nearly caught up, so a row waits behind few others; twice as many after
each read that came back full, so a backlog drains in large batches; fewer after a short one;
never more than OUTBOX_BATCH_SIZE (the ceiling) nor than MAX_READ_BYTES of rows hold (the
memory bound). Pure: no I/O, no clock.

A stream held back by a transaction open on the database server (`HeldWatch`, docs/outbox-relay.md,
"Settled transactions only"): rows wait after the position, but a transaction older than theirs has not
ended, so none can be read yet. Said once it lasts `warn_after_s`, and its end once more.

The slow lane (docs/outbox-relay.md, "The slow lane"): detoured rows delivered one per key at
a time, each the oldest waiting row of its key, and marked published; an undeliverable row gets
an attempt counted and a retry delay, and is parked after `max_attempts`; a row its partition
could not take now gets its partition's retry delay and no attempt (it is never parked for it);
a row whose topic is not on OUTBOX_TOPICS is never sent and parked at once.

A row whose earlier attempt may already be on the topic goes to the patient producer, which is
not waited for (outbox.producer.PatientProducer): the lane records its report at a later turn,
and meanwhile neither sends the row again nor lets its key's later rows by.

What batches did: one batch's outcome, a relay's running totals, and `Tally`, which says and
counts each recorded batch (the log, the metrics) for both lanes; what a batch says of Kafka is
the producer's (RelayProducer.batch_recorded).

When a row that did not go out is tried again, for both lanes (`Retries`): a row the broker refused after
its attempt's backoff, a row its partition could not take after that partition's backoff (it
grows with the batches the partition failed in a row; outbox.kafka.PartitionOutages); each said
in a line, the partitions' outages in their own log and metrics.
"""

import contextlib
import logging
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import psycopg
from confluent_kafka import KafkaError

from core.db import DatabaseErrors, new_session
from core.supervise import backoff_delay
from outbox import metrics, store
from outbox.config import MIN_READ_ROWS, Clock, Emit, RelaySettings
from outbox.kafka import Partition, PartitionOutages, describe
from outbox.producer import Batch, PatientReport, RelayProducer, Reports, sort_reports
from outbox.store import Position, Read, ReadMessage

# --- the read size (pure) -------------------------------------------------------------------------

# The payload and headers text one read may hold: with two batches in flight and one read ahead
# (and librdkafka's copies of the two in flight) the relay's peak RSS stays under 150 MB.
MAX_READ_BYTES = 8 * 1024 * 1024


def next_read_rows(asked: int, got: int, got_bytes: int, *, floor: int, ceiling: int,
                   max_bytes: int = MAX_READ_BYTES) -> int:
    """The size of the read after one that asked for `asked` rows and returned `got` of them,
    `got_bytes` of payload and headers: double after a full read, else twice what came (at
    most half the last size, at least `floor`); within the ceiling and the bytes' bound (which
    wins over the floor, down to one row)."""
    full = got >= asked
    rows = min(asked * 2 if full else max(floor, min(asked // 2, got * 2)), ceiling)
    if got and got_bytes:
        rows = min(rows, max(1, max_bytes * got // got_bytes))  # at this read's bytes a row
    return rows


@dataclass(slots=True)
class ReadSize:
    """The read size of one relay's stream: `rows` for the next read, then `observe` what came."""

    ceiling: int
    floor: int
    max_bytes: int = MAX_READ_BYTES
    rows: int = 0

    @classmethod
    def up_to(cls, ceiling: int, *, floor: int = MIN_READ_ROWS,
              max_bytes: int = MAX_READ_BYTES) -> "ReadSize":
        """Start at the floor (the ceiling, if it is smaller)."""
        if ceiling < 1 or floor < 1 or max_bytes < 1:
            raise ValueError(f"read sizes are positive, got ceiling {ceiling}, floor {floor}, "
                             f"max_bytes {max_bytes}")
        floor = min(floor, ceiling)
        return cls(ceiling, floor, max_bytes, floor)

    @classmethod
    def of(cls, settings: RelaySettings) -> "ReadSize":
        """The stream's read size for the relay's settings: from OUTBOX_BATCH_SIZE_MIN (at most
        OUTBOX_BATCH_SIZE) up to OUTBOX_BATCH_SIZE."""
        return cls.up_to(settings.batch_size, floor=settings.batch_size_min)

    def observe(self, asked: int, got: int, got_bytes: int) -> int:
        """Take a read's outcome into account; the next read's size."""
        self.rows = next_read_rows(asked, got, got_bytes, floor=self.floor,
                                   ceiling=self.ceiling, max_bytes=self.max_bytes)
        return self.rows


# --- the stream's reader --------------------------------------------------------------------------

class Leader(Protocol):
    """The relay's lead, as the lanes see it (outbox.relay.Leadership): the server it leads on,
    the server process that took the lead (store.advance checks it), and its end."""

    server: store.Server | None
    leader_pid: int

    def confirm_server(self) -> store.Server | None: ...

    def resign(self) -> None: ...


class StreamReader:
    """Reads of the stream for one relay, at most one ahead, each of `size.rows` rows at most
    (up to its ceiling, OUTBOX_BATCH_SIZE); with a `leader`, only on the server it leads on."""

    def __init__(self, using: str, size: ReadSize, *, leader: Leader | None = None) -> None:
        self.using = using
        self.size = size
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


# --- a stream held back ---------------------------------------------------------------------------

HELD = "stream held back by a transaction open on the database server"
MOVING = "stream moving again"


class HeldWatch:
    """Call `held()` at every look that finds the stream held, `moving()` when it reads again."""

    def __init__(self, emit: Emit, *, warn_after_s: float, clock: Clock = time.monotonic) -> None:
        self._emit = emit
        self.warn_after_s = warn_after_s
        self._clock = clock
        self._since: float | None = None
        self._said = False

    def held(self) -> None:
        now = self._clock()
        if self._since is None:
            self._since = now
        elif not self._said and now - self._since >= self.warn_after_s:
            self._said = True
            self._emit(logging.WARNING, HELD, {"held_for_s": round(now - self._since, 1)})

    def moving(self) -> None:
        if self._said and self._since is not None:
            self._emit(logging.INFO, MOVING, {"held_for_s": round(self._clock() - self._since, 1)})
        self._since, self._said = None, False


# --- what batches did -----------------------------------------------------------------------------

@dataclass(slots=True)
class Deliveries:
    """Rows read and produced (`read`), and what became of them."""

    read: int = 0
    published: int = 0
    released: int = 0
    failed: int = 0
    deferred: int = 0  # left for the slow lane, or delayed there: their partition was down

    def add_deliveries(self, other: "Deliveries") -> None:
        self.read += other.read
        self.published += other.published
        self.released += other.released
        self.failed += other.failed
        self.deferred += other.deferred


@dataclass(slots=True)
class BatchOutcome(Deliveries):
    """What one batch (or a run of batches) did."""

    parked: list[uuid.UUID] = field(default_factory=list)
    # Of the parked, those whose topic is not on OUTBOX_TOPICS (never sent): id -> topic.
    off_allowlist: dict[uuid.UUID, str] = field(default_factory=dict)

    @property
    def broker_unavailable(self) -> bool:
        return self.released > 0

    def merge(self, other: "BatchOutcome") -> None:
        self.add_deliveries(other)
        self.parked.extend(other.parked)
        self.off_allowlist.update(other.off_allowlist)


@dataclass(slots=True)
class RelayStats(Deliveries):
    """Running totals of a relay, for the command's summary, logs and tests."""

    batches: int = 0
    parked: int = 0
    pruned: int = 0
    stood_by: bool = False  # another relay was leading when this one looked for work
    broker_answered: bool = True  # a pass's metadata request (check_broker) had an answer
    # How long a pass waited for stream rows held back by a transaction open on the server,
    # when they were still held at its bound (0: none were left held back).
    held_for_s: float = 0.0
    # Seconds waited after each consecutive "broker unavailable" or database failure.
    backoffs: list[float] = field(default_factory=list)

    def add(self, outcome: BatchOutcome) -> None:
        self.batches += 1
        self.add_deliveries(outcome)
        self.parked += len(outcome.parked)


class Tally:
    """Says and counts what each recorded batch did: its log lines, the running totals, the
    metrics."""

    def __init__(self, stats: RelayStats, *, emit: Emit,
                 on_batch: Callable[[RelayStats], object] | None = None) -> None:
        self.stats = stats
        self._emit = emit
        self.on_batch = on_batch  # told the running totals after each batch (a progress bar)

    def unrecorded(self, outcome: BatchOutcome) -> None:
        """A batch whose rows are read again (the batch before it stopped short)."""
        self.stats.add(outcome)

    def account(self, outcome: BatchOutcome, *, lane: str, max_attempts: int) -> BatchOutcome:
        """Say and count what a recorded batch did (its parked rows had `max_attempts`, or their
        topic is not on OUTBOX_TOPICS)."""
        for message_id in outcome.parked:
            topic = outcome.off_allowlist.get(message_id)
            if topic is None:
                self._emit(logging.ERROR, "message parked",
                           {"message_id": message_id, "attempts": max_attempts})
            else:
                self._emit(logging.ERROR, "message parked, its topic is not on OUTBOX_TOPICS",
                           {"message_id": message_id, "topic": topic})
        self._emit(logging.DEBUG, "batch done", {
            "lane": lane, "read": outcome.read, "published": outcome.published,
            "released": outcome.released, "failed": outcome.failed,
            "deferred": outcome.deferred, "parked": len(outcome.parked)})
        self.stats.add(outcome)
        if self.on_batch is not None:
            self.on_batch(self.stats)
        metrics.record_published(outcome.published)
        metrics.record_failed(outcome.failed)
        metrics.record_parked(len(outcome.parked))
        return outcome


# --- when a row is tried again --------------------------------------------------------------------

class Retries:
    """The retry delays of one relay (OUTBOX_BACKOFF_INITIAL up to OUTBOX_BACKOFF_MAX, jittered)
    and its partitions' outages (said once per OUTBOX_OUTAGE_LOG_INTERVAL)."""

    def __init__(self, *, backoff_initial: timedelta, backoff_max: timedelta,
                 outage_log_interval: timedelta, emit: Emit, rng: random.Random) -> None:
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._emit = emit
        self._rng = rng
        self.partitions = PartitionOutages(emit, interval_s=outage_log_interval.total_seconds())

    def _delay(self, failures: int) -> float:
        return backoff_delay(failures, self._backoff_initial, self._backoff_max, self._rng)

    def describe_refusal(self, message: ReadMessage, error: KafkaError) -> tuple[str, timedelta]:
        """A row the broker refused: its error and retry delay to record, said in a line."""
        delay = self._delay(message.attempts + 1)
        self._emit(logging.WARNING, "message not delivered", {
            "message_id": message.id, "attempt": message.attempts + 1,
            "error": describe(error), "retry_in_s": round(delay, 3)})
        return describe(error), timedelta(seconds=delay)

    def describe_deferrals(self, deferred: Sequence[tuple[ReadMessage, KafkaError]],
                           partitions: Mapping[str, int]) -> dict[str, tuple[str, timedelta]]:
        """Rows their partition could not take now (`partitions`: by key, as reported): for each
        (by id) its error and retry delay, the partition's backoff, which grows with the batches
        it failed in a row; said in that partition's outage log and metrics."""
        by_partition: dict[Partition, list[tuple[ReadMessage, KafkaError]]] = {}
        for message, error in deferred:
            where = (message.topic, partitions.get(message.key, -1))
            by_partition.setdefault(where, []).append((message, error))
        described: dict[str, tuple[str, timedelta]] = {}
        for where, rows in by_partition.items():
            failures = self.partitions.failed(where, (m.key for m, _e in rows),
                                              describe(rows[0][1]))
            metrics.record_deferred(*where, len(rows))
            for message, error in rows:
                described[message.id] = (describe(error), timedelta(seconds=self._delay(failures)))
        return described

    def delivered(self, keys: Iterable[str]) -> None:
        """Rows of `keys` delivered: a partition they had been deferred for is back."""
        for topic, partition in self.partitions.delivered(keys):
            metrics.set_partition_available(topic, partition)


# --- the stream lane ------------------------------------------------------------------------------

# Batches in flight at once: the next read overlaps the previous batch's delivery wait.
PIPELINE_DEPTH = 2
# Stream batches per publish call, so that the slow lane gets its turn in a long run.
STREAM_BATCHES_PER_CALL = 20


def cut(read: list[ReadMessage], busy: Iterable[str],
        held: frozenset[str] | set[str] = frozenset(), *,
        probe: frozenset[str] | set[str] = frozenset()) -> list[ReadMessage]:
    """The batch in `read`: up to the first row whose key is `busy` (in flight) or already in
    the batch, so that order per key holds whatever the broker does with each. A row of a
    `held` key (detoured since the read began) is held, as the read says of a key the slow lane
    holds. A probe batch (after one that delivered nothing; `probe`: the keys that got no
    answer) goes on past those keys: their later rows are held (detoured behind their head,
    whatever becomes of it), so that the batch carries other keys' rows, and the cluster's
    answer tells a partition's outage from the broker's."""
    keys = set(busy)
    if probe:
        return _probe_cut(read, keys, held, probe)
    for index, message in enumerate(read):
        if message.key in keys:
            read = read[:index]
            break
        keys.add(message.key)
    if held:
        read = [m._replace(held=True) if m.key in held and not m.held else m for m in read]
    return read


def _probe_cut(read: list[ReadMessage], busy: set[str], held: frozenset[str] | set[str],
               probe: frozenset[str] | set[str]) -> list[ReadMessage]:
    batch: list[ReadMessage] = []
    keys: set[str] = set()
    for message in read:
        if message.key in busy or (message.key in keys and message.key not in probe):
            break
        repeated = (message.key in keys or message.key in held) and not message.held
        batch.append(message._replace(held=True) if repeated else message)
        keys.add(message.key)
    return batch


def position_after(batch: Batch, outcome: BatchOutcome) -> Position | None:
    """Where the stream's position is after a recorded batch (None if it did not move)."""
    recorded = len(batch.read) - outcome.released
    if recorded <= 0:
        return None
    return batch.read[recorded - 1].position


@dataclass(slots=True)
class StreamRun:
    """A run of stream batches: the position recorded, where the next read starts (past the
    batches in flight), and the batches in flight."""

    position: Position
    after: Position = ("0", 0)
    in_flight: deque[Batch] = field(default_factory=deque)
    reading: bool = True
    batches: int = 0
    # Keys this run detoured: held from then on, whatever a read started before said.
    detoured: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.after = self.position


class StreamLane:
    """The stream of one relay, run by its leader."""

    def __init__(self, using: str, *, max_attempts: int, producer: RelayProducer,
                 reader: StreamReader, leadership: Leader, retries: Retries, tally: Tally,
                 held: HeldWatch, stop: threading.Event, emit: Emit) -> None:
        self.using = using
        self._emit = emit
        self.max_attempts = max_attempts
        self._producer = producer
        self._reader = reader
        self._leadership = leadership
        self._retries = retries
        self._tally = tally
        self._held = held
        self._stop = stop
        # The keys of the last batch recorded if it delivered nothing and stopped before them:
        # the next run's first batch is a probe past them (`cut`).
        self._probe: frozenset[str] = frozenset()

    def read(self, after: Position, busy: Iterable[str] = (),
             held: frozenset[str] | set[str] = frozenset(), *,
             probe: frozenset[str] | set[str] = frozenset()) -> Read:
        """The next batch after `after` (see `cut`)."""
        read = self._reader.read(after)
        return Read(cut(read.messages, busy, held, probe=probe), read.read_at)

    def publish(self, total: BatchOutcome) -> BatchOutcome:
        """Stream batches until a read comes back empty, the broker is unavailable, stop, or
        STREAM_BATCHES_PER_CALL batches; the next batch is read (after the previous one) and
        produced while the previous one awaits its delivery reports. A batch is recorded only
        once the batch before it moved the position to where it starts; otherwise its rows are
        read again by the next call. Raises KafkaRefusedError once every batch is accounted for."""
        run = StreamRun(store.read_position(self.using))
        try:
            return self._run(run, total)
        finally:
            self._reader.drop()  # a read ahead is not reused: the slow lane runs in between

    def _run(self, run: StreamRun, total: BatchOutcome) -> BatchOutcome:
        while True:
            self._fill(run)
            if not run.in_flight:
                return total
            batch = run.in_flight.popleft()
            if batch.start != run.position:  # the batch before it stopped short
                self._drop_unrecorded(batch)
                outcome = BatchOutcome(read=len(batch.read), released=len(batch.read))
                self._tally.unrecorded(outcome)
            else:
                try:
                    outcome = self.finish(batch, run.position, run.detoured)
                except store.PositionMovedError as exc:
                    self._stand_down(exc, run.in_flight)
                    return total
                run.position = position_after(batch, outcome) or run.position
            total.merge(outcome)
            if outcome.broker_unavailable:
                run.reading = False
            if self._producer.refused and not run.in_flight:
                self._producer.state.check_refused()  # every batch in flight accounted for first

    def _fill(self, run: StreamRun) -> None:
        """Read and produce stream batches until PIPELINE_DEPTH are in flight (or nothing more
        can be read now)."""
        while (run.reading and len(run.in_flight) < PIPELINE_DEPTH
               and not self._stop.is_set() and not self._producer.refused):
            if run.batches >= STREAM_BATCHES_PER_CALL:
                run.reading = False
                return
            busy = set().union(*(b.keys for b in run.in_flight))
            read = self.read(run.after, busy, run.detoured,
                             probe=self._probe if run.batches == 0 else frozenset())
            if not read.messages:
                # Nothing after `after`, or its first row's key is in flight: read on once a
                # batch in flight is done (if none is, there is nothing to read).
                run.reading = bool(run.in_flight)
                if not run.in_flight and run.batches == 0:
                    self._look_for_a_held_stream(run.after)
                return
            self._held.moving()
            start, run.after = run.after, read.messages[-1].position or run.after
            run.batches += 1
            if run.batches < STREAM_BATCHES_PER_CALL:
                self._reader.read_ahead(run.after)  # while this batch is produced
            run.in_flight.append(self._producer.produce_batch(read, start))

    def _look_for_a_held_stream(self, after: Position) -> None:
        """Nothing to read: held if rows wait after the position all the same (a transaction
        older than theirs is still open somewhere on the server)."""
        if store.stream_waiting(self.using, after):
            self._held.held()
        else:
            self._held.moving()

    def _stand_down(self, exc: store.PositionMovedError, in_flight: deque[Batch]) -> None:
        """Another relay moved the stream: this one no longer leads (what it sent since is
        delivered again by the leader, at least once)."""
        self._emit(logging.ERROR, "stream position moved by another relay, standing by",
                   {"error": str(exc)})
        for batch in in_flight:
            self._drop_unrecorded(batch)
        self._leadership.resign()

    def _drop_unrecorded(self, batch: Batch) -> None:
        """A batch read past a position that stopped short: wait for its reports all the same
        (nothing of it is recorded; what was delivered is sent again, at least once, and a row
        its attempt may have left on the topic goes to the patient producer then)."""
        self._producer.await_batch(batch)
        self._producer.route.record(batch, Reports(settled=0), stream=True)

    def finish(self, batch: Batch, start: Position,
               detoured_keys: set[str] | None = None) -> BatchOutcome:
        """Await a stream batch's reports, then move the position past every row accounted for:
        delivered, refused (detoured with an attempt counted), deferred (detoured with a retry
        delay, no attempt counted) or held (detoured); it stops before the first row the broker
        could not take (or that the stop released)."""
        self._producer.await_batch(batch)
        self._producer.route.await_reports(batch)
        reports = sort_reports(batch.read, batch.errors, acked_at=batch.acked_at,
                               read_at=batch.read_at, stop_at_unavailable=True,
                               unsent=batch.unsent, unsent_open=batch.unsent_open,
                               off_allowlist=batch.off_allowlist,
                               cluster_answers=lambda: self._producer.late.answers_beside(batch))
        detours = self._detours(reports, batch.partitions)
        recorded = reports.settled
        outcome = BatchOutcome(read=len(batch.read),  # the rows not recorded are read again
                               published=len(reports.delivered),
                               released=len(batch.read) - recorded,
                               failed=sum(1 for _m, error in reports.detoured if error is not None),
                               deferred=len(reports.deferred))
        if recorded:
            self._advance(batch, start, reports, detours, outcome)
            if detoured_keys is not None and detours:
                detoured_keys.update(m.key for m, _error in reports.detoured)
                detoured_keys.update(m.key for m, _error in reports.deferred)
                detoured_keys.update(m.key for m, _why in reports.off_allowlist)
        if outcome.released and not outcome.published:
            # before the record: the brokers its probes' answers in time vouch for stay vouched
            self._producer.late.note_late_alone(batch)
        self._producer.route.record(batch, reports, stream=True)
        if outcome.published or outcome.released:
            self._probe = (frozenset() if outcome.published
                           else frozenset(m.key for m in batch.read[recorded:]))
        metrics.observe_delivery_latencies(reports.latencies)
        self._producer.batch_recorded(published=outcome.published, released=outcome.released,
                                      first_unavailable=reports.first_unavailable)
        return self._tally.account(outcome, lane="stream", max_attempts=self.max_attempts)

    def _detours(self, reports: Reports, partitions: dict[str, int]) -> list[store.Detour]:
        """The rows that leave the stream: held or refused (an attempt counted, the refusal's
        retry delay), deferred (their partition's retry delay, no attempt), off the allowlist
        (parked at once)."""
        detours = [store.Detour(m.id) if error is None else
                   store.Detour(m.id, *self._retries.describe_refusal(m, error))
                   for m, error in reports.detoured]
        deferrals = self._retries.describe_deferrals(reports.deferred, partitions)
        detours += [store.Detour(m.id, *deferrals[m.id], attempted=False)
                    for m, _error in reports.deferred]
        detours += [store.Detour(m.id, why, attempted=False, park=True)
                    for m, why in reports.off_allowlist]
        return detours

    def _advance(self, batch: Batch, start: Position, reports: Reports,
                 detours: list[store.Detour], outcome: BatchOutcome) -> None:
        """Move the position past the rows accounted for (store.advance): the batch recorded,
        its detours in the slow lane; the rows parked go into `outcome`."""
        end = batch.read[reports.settled - 1].position
        assert end is not None  # noqa: S101 - a stream row has a position
        outcome.parked = store.advance(self.using, start=start, end=end,
                                       published=outcome.published, detours=detours,
                                       max_attempts=self.max_attempts,
                                       leader_pid=self._leadership.leader_pid)
        outcome.off_allowlist = {uuid.UUID(m.id): m.topic for m, _why in reports.off_allowlist
                                 if uuid.UUID(m.id) in outcome.parked}


# --- the slow lane --------------------------------------------------------------------------------

class SlowLane:
    """The slow lane of one relay, run by its leader."""

    def __init__(self, using: str, *, batch_size: int, max_attempts: int,
                 producer: RelayProducer, retries: Retries, tally: Tally) -> None:
        self.using = using
        self.batch_size = batch_size
        self.max_attempts = max_attempts
        self._producer = producer
        self._retries = retries
        self._tally = tally

    def publish(self) -> BatchOutcome:
        """One batch of the slow lane: the patient producer's reports that came, then its due
        rows, each the oldest waiting row of its key (the rows of a partition that came back
        are due at once)."""
        outcome = self._record_patient_reports()
        store.make_due(self.using, self._retries.partitions.take_due())
        read = store.read_slow(self.using, batch_size=self.batch_size)
        patient = self._producer.patient
        rows = [m for m in read.messages if not patient.holds(m.id)]  # still on its way
        if not rows:
            return outcome
        batch = self._producer.produce_batch(Read(rows, read.read_at))
        self._producer.await_batch(batch)
        sent = [m for m in batch.read if m.key not in batch.patient]
        reports = sort_reports(sent, batch.errors, acked_at=batch.acked_at,
                               read_at=batch.read_at, stop_at_unavailable=False,
                               off_allowlist=batch.off_allowlist)
        self._producer.route.record(batch, reports, stream=False)
        outcome.merge(self._record(reports, batch.partitions, read=len(batch.read)))
        return outcome

    def _record_patient_reports(self) -> BatchOutcome:
        """The reports of rows the patient producer had on their way, as a batch of their own
        (a report that came within the delivery timeout says its partition is back)."""
        patient = self._producer.patient
        patient.serve()
        came: list[PatientReport] = patient.slow_lane_reports()
        if not came:
            return BatchOutcome()
        now = time.monotonic()
        reports = sort_reports([r.message for r in came],
                               {r.message.key: r.error for r in came if r.error is not None},
                               acked_at=now, read_at=now, stop_at_unavailable=False)
        reports.latencies = []  # their age is not the relay's batch's
        for report in came:
            if report.error is None and report.in_time:
                self._producer.topics.answered_in_time(report.message.topic, report.partition)
        in_time = {r.message.id for r in came if r.error is None and r.in_time}
        return self._record(reports, {r.message.key: r.partition for r in came}, read=0,
                            back=[m.key for m in reports.delivered if m.id in in_time])

    def _record(self, reports: Reports, partitions: dict[str, int], *, read: int,
                back: list[str] | None = None) -> BatchOutcome:
        """Record a batch's sorted rows: marked published, given an attempt, delayed."""
        failures = [store.Failure(m.id, *self._retries.describe_refusal(m, error))
                    for m, error in reports.refused]
        deferrals = self._retries.describe_deferrals(reports.deferred, partitions)
        metrics.observe_delivery_latencies(reports.latencies)
        outcome = BatchOutcome(read=read)
        outcome.published = store.mark_published(self.using, [m.id for m in reports.delivered])
        self._retries.delivered(m.key for m in reports.delivered if back is None or m.key in back)
        outcome.released = len(reports.unavailable)  # left unpublished: read again next time
        outcome.failed = len(failures)
        outcome.deferred = store.postpone(
            self.using, [store.Failure(i, *deferred) for i, deferred in deferrals.items()])
        outcome.parked = store.record_failures(self.using, failures, self.max_attempts)
        off_allowlist = store.park(self.using, {m.id: why for m, why in reports.off_allowlist})
        topics = {uuid.UUID(m.id): m.topic for m, _why in reports.off_allowlist}
        outcome.parked += off_allowlist
        outcome.off_allowlist = {i: topics[i] for i in off_allowlist}
        self._producer.batch_recorded(published=outcome.published, released=outcome.released,
                                      first_unavailable=reports.first_unavailable)
        return self._tally.account(outcome, lane="slow", max_attempts=self.max_attempts)
