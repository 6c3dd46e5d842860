"""The outbox relay (docs/outbox-relay.md): read the outbox as a stream, produce it to Kafka,
record one position per batch.

One relay at a time publishes: the one holding the relays' session advisory lock (the others
stand by, and one of them takes over when the leader's database session ends).

The stream: one statement reads up to `batch_size` rows after the position, in the order their
transactions wrote them, of transactions that can no longer commit behind it; a batch ends
before a key it already has or one still in flight (one row per key in flight at a time). The
rows are produced, the relay waits for their delivery reports, then one transaction moves the
position past them and records the batch. A row the broker refused, and every later row of its
key, leaves the stream for the slow lane (it is "detoured"). If the broker could not take a
row, the position stops just before it and the rest is read again.

The slow lane delivers detoured rows one by one, each the oldest waiting row of its key, and
marks them published; an undeliverable row gets an attempt counted and a retry delay, and is
parked after `max_attempts`. No transaction is open during any Kafka call.
"""

import contextlib
import dataclasses
import logging
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from django.db import connections

from core.db import DatabaseErrors, backoff_delay, delete_in_chunks
from core.failures import classify_on, retry_event
from core.health import Heartbeat
from core.logs import log_event
from outbox import kafka, metrics, store
from outbox.config import RelaySettings
from outbox.outage import OutageLog
from outbox.reader import StreamReader
from outbox.statistics import parse_statistics
from outbox.wakeup import Wakeup

logger = logging.getLogger("outbox.relay")

PRUNE_CHUNK = 5_000
PRUNE_EVERY_S = 600.0
# Extra time past the producer's own delivery timeout before the relay stops waiting.
FLUSH_MARGIN_S = 5.0
FLUSH_SLICE_S = 0.2
# Batches in flight at once: the next read overlaps the previous batch's delivery wait.
PIPELINE_DEPTH = 2
# Stream batches per publish_available call, so that the slow lane gets its turn in a long run.
STREAM_BATCHES_PER_CALL = 20
# A stream held back this long by a transaction still open on the server is worth a warning.
STREAM_HELD_WARN_S = 60.0
# How often a pass looks again at rows held back by an open transaction.
HELD_POLL_S = 0.25

Wait = Callable[[float], object]


@dataclass(slots=True)
class _Deliveries:
    """Rows read and produced (`claimed`), and what became of them."""

    claimed: int = 0
    published: int = 0
    released: int = 0
    failed: int = 0

    def _add_deliveries(self, other: "_Deliveries") -> None:
        self.claimed += other.claimed
        self.published += other.published
        self.released += other.released
        self.failed += other.failed


@dataclass(slots=True)
class BatchOutcome(_Deliveries):
    """What one batch (or a run of batches) did."""

    parked: list[uuid.UUID] = field(default_factory=list)

    @property
    def broker_unavailable(self) -> bool:
        return self.released > 0

    def merge(self, other: "BatchOutcome") -> None:
        self._add_deliveries(other)
        self.parked.extend(other.parked)


@dataclass(slots=True)
class RelayStats(_Deliveries):
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
        self._add_deliveries(outcome)
        self.parked += len(outcome.parked)


@dataclass(frozen=True, slots=True)
class _Delivery:
    error: KafkaError | None
    acked_at: float | None = None  # when the broker's acknowledgement came back (monotonic)


@dataclass(slots=True)
class _Batch:
    """Rows read (`claimed`), those handed to the producer (`sent`: a held stream row is not),
    their delivery reports as they come, and when to stop waiting for them. A stream batch
    also has the position it was read after."""

    claimed: list[store.ClaimedMessage]
    sent: int
    deliveries: dict[bytes, _Delivery]  # by message key: a batch has one row per key
    deadline: float
    producer: Producer  # the one that has it, even if a fatal error replaced it since
    start: store.Position | None = None

    @property
    def keys(self) -> set[str]:
        return {m.key for m in self.claimed}


@dataclass(slots=True)
class _Stream:
    """A run of stream batches: the position recorded, where the next read starts (past the
    batches in flight), and the batches in flight."""

    position: store.Position
    after: store.Position = ("0", 0)
    in_flight: deque[_Batch] = field(default_factory=deque)
    reading: bool = True
    batches: int = 0
    # Keys this run detoured: held from then on, whatever a read started before said.
    detoured: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.after = self.position


class Relay:
    """One relay instance. `run_pass()` publishes what is deliverable now and prunes;
    `run_loop()` keeps going until `stop` is set."""

    def __init__(
        self,
        settings: RelaySettings,
        *,
        using: str = "default",
        stop: threading.Event | None = None,
        relay_id: str | None = None,
        rng: random.Random | None = None,
        wait: Wait | None = None,
        heartbeat: Heartbeat | None = None,
        on_batch: Callable[[RelayStats], object] | None = None,
    ) -> None:
        self.settings = settings
        self.using = using
        self.stop = stop or threading.Event()
        self.relay_id = relay_id or f"relay-{uuid.uuid4().hex[:12]}"
        self.rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
        self._wait: Wait = wait or self.stop.wait
        self.stats = RelayStats()
        self.heartbeat = heartbeat  # beaten every loop iteration: /healthz of publish_outbox --loop
        self.on_batch = on_batch  # told the running totals after each batch (a progress bar)
        self._producer: Producer | None = None
        self._fatal: KafkaError | None = None
        self._refused: KafkaError | None = None  # the first refusal: the relay stops on it
        self._outage = OutageLog(self._log_outage,
                                 interval_s=settings.outage_log_interval.total_seconds())
        self._stop_seen_at: float | None = None
        self._session: object | None = None  # the database session the relay last led on
        self._reader = StreamReader(using, settings.batch_size)
        self._held_since: float | None = None  # the stream waits for an open transaction
        self._held_said = False
        self._leading = False
        self._leader_pid = 0  # the server process holding the lead (advance checks it)
        self._standing_by = False

    # --- Kafka -----------------------------------------------------------------------------

    @property
    def producer(self) -> Producer:
        if self._producer is None or self._fatal is not None:
            if self._fatal is not None:
                log_event(logger, logging.ERROR, "producer failed fatally, starting a new one",
                          relay_id=self.relay_id, error=kafka.describe(self._fatal))
                if self._producer is not None:
                    self._drop(self._producer)
            self._fatal = None
            self._producer = kafka.new_producer(self.settings, self.relay_id, self._on_error,
                                                self._on_statistics)
        return self._producer

    def _log_outage(self, level: int, event: str, fields: dict[str, Any]) -> None:
        if "error" in fields:  # librdkafka's text: scrubbed, as every line that shows it
            fields = {**fields, "error": kafka.redact(fields["error"], self.settings)}
        log_event(logger, level, event, relay_id=self.relay_id, **fields)

    def _on_error(self, error: KafkaError) -> None:
        """librdkafka's error callback: a refusal stops the relay, a fatal error replaces the
        producer (its line is the replacement's), anything else is a failing connection."""
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            metrics.set_connected(False)
        if error.fatal():
            self._fatal = error
        if kafka.refused(error):
            if self._refused is None:
                self._refused = error
                log_event(logger, logging.ERROR, "kafka refused the relay",
                          relay_id=self.relay_id, error=kafka.describe(error))
            return
        if error.fatal():
            return  # said by the replacement's line ("producer failed fatally")
        if self._refused is not None and error.code() == KafkaError._ALL_BROKERS_DOWN:
            return  # the refusal's consequence, already said
        self._outage.failed(kafka.describe(error))

    def _on_statistics(self, text: str) -> None:
        """librdkafka's statistics: the metrics, and a broker up means Kafka answers again."""
        stats = parse_statistics(text)
        metrics.observe_statistics(stats)
        if stats.any_broker_up:
            self._reached_kafka()

    def _reached_kafka(self) -> None:
        metrics.set_connected(True)
        self._outage.restored()

    def _poll(self, producer: Producer, timeout: float) -> bool:
        """Serve callbacks; False if the producer failed fatally (poll raises that, for instance
        an idempotent producer whose broker forgot it: UNKNOWN_PRODUCER_ID after a restart)."""
        try:
            producer.poll(timeout)
        except KafkaException as exc:
            error = exc.args[0]
            if not (isinstance(error, KafkaError) and error.fatal()):
                raise
            self._fatal = self._fatal or error
            return False
        return True

    def _drop(self, producer: Producer) -> None:
        """Purge a failed producer: its messages get their (failed) reports, nothing lingers."""
        with contextlib.suppress(KafkaException):  # a failed producer may refuse; reports come
            producer.purge(in_queue=True, in_flight=True, blocking=False)
        self._poll(producer, 0)

    def _check_refused(self) -> None:
        """Raise KafkaRefusedError once the broker refused the credentials or the handshake."""
        if self._refused is not None:
            raise kafka.refusal(self._refused, self.settings)

    def connect(self) -> None:
        """Start the producer now (it connects at once), so a refusal shows before any event."""
        self._poll(self.producer, 0)
        self._check_refused()

    def check_broker(self) -> bool:
        """Ask the broker for its metadata, up to the delivery timeout: True if it answered;
        a refusal (credentials, TLS handshake) raises KafkaRefusedError. A pass does this
        first, so that it sees a broker it cannot use even when it has nothing to send."""
        producer = self.producer
        try:
            producer.list_topics(timeout=self.settings.delivery_timeout.total_seconds())
        except KafkaException as exc:
            self._poll(producer, 0)  # the error callback classifies what happened
            self._check_refused()
            self._outage.failed(kafka.describe(exc.args[0]) if exc.args else str(exc))
            return False
        self._poll(producer, 0)
        self._check_refused()
        self._reached_kafka()
        return True

    def _produce(self, producer: Producer, message: store.ClaimedMessage,
                 deliveries: dict[bytes, _Delivery], delivered: Callable[..., None]) -> None:
        """Hand one row to the producer; its report lands in `deliveries` under its key (a
        batch has one row per key), through the batch's one `delivered` callback."""
        key = message.key.encode()
        headers: dict[str, Any] = message.headers
        while True:
            try:
                producer.produce(message.topic, value=message.payload.encode(), key=key,
                                 headers=headers, timestamp=message.timestamp_ms,
                                 on_delivery=delivered)
                return
            except BufferError:
                if not self._poll(producer, 0.05):  # the local queue is full: let it drain
                    deliveries[key] = _Delivery(self._fatal)
                    return
            except TypeError:
                if headers is not message.headers:
                    raise
                headers = kafka.record_headers(message)  # a header stored as another JSON type
            except KafkaException as exc:
                error = exc.args[0]
                if isinstance(error, KafkaError) and error.fatal():
                    self._fatal = self._fatal or error
                deliveries[key] = _Delivery(error)
                return

    def _await_batch(self, producer: Producer, batch: "_Batch") -> None:
        """Serve delivery reports until the batch has all of its own, up to the delivery timeout
        (or the shutdown grace once stop is set); later batches' reports are served too."""
        deadline = batch.deadline
        while len(batch.deliveries) < batch.sent:
            now = time.monotonic()
            if self.stop.is_set():
                if self._stop_seen_at is None:
                    self._stop_seen_at = now
                deadline = min(deadline,
                               self._stop_seen_at + self.settings.shutdown_grace.total_seconds())
            # Refused, failed fatally, or already replaced: no report will come from it.
            failed = (self._refused is not None or self._fatal is not None
                      or producer is not self._producer)
            if now >= deadline or failed:
                # Whatever is still in flight is released, and delivered again later if need be.
                self._drop(producer)
                break
            self._poll(producer, min(FLUSH_SLICE_S, deadline - now))

    # --- leadership ------------------------------------------------------------------------

    def lead(self) -> bool:
        """True while this relay holds the relays' lock: taken, without waiting, once per
        database session (a session that ended released it, and a standby may hold it now)."""
        session = connections[self.using].connection
        if session is None or session is not self._session:
            # A new database session: its commits need no WAL flush wait (a lost mark after a
            # database crash only means sending those rows again).
            self._session = store.relax_commit_durability(self.using)
            self._leading = False
        if not self._leading:
            pid = store.try_to_lead(self.using)
            self._leading = pid is not None
            self._leader_pid = pid or 0
            if self._leading:
                log_event(logger, logging.INFO, "relay leading", relay_id=self.relay_id)
            elif not self._standing_by:  # said once, not at every look
                log_event(logger, logging.INFO, "another relay leads, standing by",
                          relay_id=self.relay_id)
            self._standing_by = not self._leading
            self.stats.stood_by = self.stats.stood_by or self._standing_by
        return self._leading

    def resign(self) -> None:
        """Release the lock (if this relay still holds it on a live session)."""
        session = connections[self.using].connection
        if self._leading and session is not None and session is self._session:
            with contextlib.suppress(*DatabaseErrors):
                store.resign(self.using)
        self._leading = False

    # --- batches ---------------------------------------------------------------------------

    def _produce_batch(self, read: list[store.ClaimedMessage],
                       start: store.Position | None = None) -> "_Batch":
        """Hand a batch's rows to the producer (a held stream row is not sent)."""
        producer = self.producer
        deadline = (time.monotonic() + self.settings.delivery_timeout.total_seconds()
                    + FLUSH_MARGIN_S)
        batch = _Batch(read, 0, {}, deadline, producer, start)
        deliveries = batch.deliveries
        monotonic = time.monotonic

        def delivered(error: KafkaError | None, record: Any) -> None:
            deliveries[record.key()] = _Delivery(error, None if error else monotonic())

        for message in read:
            if not message.held:
                self._produce(producer, message, deliveries, delivered)
                batch.sent += 1
        self._poll(producer, 0)
        log_event(logger, logging.DEBUG, "batch produced", relay_id=self.relay_id,
                  produced=batch.sent, lane="slow" if start is None else "stream")
        return batch

    def _read_stream(self, after: store.Position, busy: set[str],
                     held: frozenset[str] | set[str] = frozenset()) -> list[store.ClaimedMessage]:
        """The stream's rows after `after`, up to the first whose key is `busy` (in flight) or
        already in the batch: one row per key in flight, so that order per key holds whatever
        the broker does with each. A row of a `held` key (detoured since the read began) is
        held, as the read says of a key the slow lane holds."""
        read = self._reader.read(after)
        keys = set(busy)
        for index, message in enumerate(read):
            if message.key in keys:
                read = read[:index]
                break
            keys.add(message.key)
        if held:
            read = [dataclasses.replace(m, held=True) if m.key in held and not m.held else m
                    for m in read]
        return read

    def publish_batch(self) -> BatchOutcome:
        """One batch, start to end: the slow lane's due rows if any, else the stream's next
        rows: read, produce, await the reports, record the outcome."""
        if self.stop.is_set():
            return BatchOutcome()
        self._check_refused()
        if not self.lead():
            return BatchOutcome()
        outcome = self._publish_slow()
        if outcome.claimed:
            return outcome
        after = store.read_position(self.using)
        read = self._read_stream(after, set())
        if not read:
            return outcome
        return self._finish_stream(self._produce_batch(read, after), after)

    def _publish_slow(self) -> BatchOutcome:
        """One batch of the slow lane: its due rows, each the oldest waiting row of its key."""
        read = store.read_slow(self.using, batch_size=self.settings.batch_size)
        if not read:
            return BatchOutcome()
        batch = self._produce_batch(read)
        self._await_batch(batch.producer, batch)
        return self._record_slow(batch.claimed, batch.deliveries)

    def publish_available(self) -> BatchOutcome:
        """The slow lane's due rows, then stream batches until a read comes back empty, the
        broker is unavailable, stop, or STREAM_BATCHES_PER_CALL batches; the next batch is
        read (after the previous one) and produced while the previous one awaits its delivery
        reports. A batch is recorded only once the batch before it moved the position to where
        it starts; otherwise its rows are read again by the next call."""
        total = BatchOutcome()
        if self.stop.is_set():
            return total
        self._check_refused()
        if not self.lead():
            return total
        self._settle()
        total.merge(self._publish_slow())
        if total.broker_unavailable or self.stop.is_set():
            return total
        stream = _Stream(store.read_position(self.using))
        try:
            return self._run_stream(stream, total)
        finally:
            self._reader.drop()  # a read ahead is not reused: the slow lane runs in between

    def _run_stream(self, stream: "_Stream", total: BatchOutcome) -> BatchOutcome:
        while True:
            self._fill(stream)
            if not stream.in_flight:
                return total
            batch = stream.in_flight.popleft()
            if batch.start != stream.position:  # the batch before it stopped short
                self._drop_unrecorded(batch)
                outcome = BatchOutcome(claimed=len(batch.claimed), released=len(batch.claimed))
                self.stats.add(outcome)
            else:
                try:
                    outcome = self._finish_stream(batch, stream.position, stream.detoured)
                except store.PositionMovedError as exc:
                    self._stand_down(exc, stream.in_flight)
                    return total
                stream.position = self._position_after(batch, outcome) or stream.position
            total.merge(outcome)
            if outcome.broker_unavailable:
                stream.reading = False
            if self._refused is not None and not stream.in_flight:
                self._check_refused()  # every batch in flight accounted for first

    def _fill(self, stream: "_Stream") -> None:
        """Read and produce stream batches until PIPELINE_DEPTH are in flight (or nothing more
        can be read now)."""
        while (stream.reading and len(stream.in_flight) < PIPELINE_DEPTH
               and not self.stop.is_set() and self._refused is None):
            if stream.batches >= STREAM_BATCHES_PER_CALL:
                stream.reading = False
                return
            busy = set().union(*(b.keys for b in stream.in_flight))
            read = self._read_stream(stream.after, busy, stream.detoured)
            if not read:
                # Nothing after `after`, or its first row's key is in flight: read on once a
                # batch in flight is done (if none is, there is nothing to read).
                stream.reading = bool(stream.in_flight)
                if not stream.in_flight and stream.batches == 0:
                    self._look_for_a_held_stream(stream.after)
                return
            self._stream_moving()
            start, stream.after = stream.after, read[-1].position or stream.after
            stream.batches += 1
            if stream.batches < STREAM_BATCHES_PER_CALL:
                self._reader.read_ahead(stream.after)  # while this batch is produced
            stream.in_flight.append(self._produce_batch(read, start))

    def _settle(self) -> None:
        """Make sure the stream's ids belong to this cluster before reading it: re-based onto a
        new cluster the database moved to, if no writer did that first (StreamAheadError when
        the same cluster's stored ids are ahead of its own)."""
        settled = store.settle_stream(self.using)
        if settled.moved:
            log_event(logger, logging.WARNING,
                      "outbox database moved to another cluster: stream re-based onto it"
                      if settled.rebased else
                      "outbox database moved to another cluster: its transaction ids continue "
                      "past the stream's", relay_id=self.relay_id,
                      from_system=str(settled.recorded_system),
                      to_system=str(settled.this_system), txid_offset=settled.txid_offset)

    def _look_for_a_held_stream(self, after: store.Position) -> None:
        """Nothing to read although rows wait after the position: a transaction older than
        theirs is still open somewhere on the server. Said once it lasts STREAM_HELD_WARN_S."""
        if not store.stream_waiting(self.using, after):
            self._stream_moving()
            return
        now = time.monotonic()
        if self._held_since is None:
            self._held_since = now
        elif not self._held_said and now - self._held_since >= STREAM_HELD_WARN_S:
            self._held_said = True
            log_event(logger, logging.WARNING,
                      "stream held back by a transaction open on the database server",
                      relay_id=self.relay_id, held_for_s=round(now - self._held_since, 1))

    def _stream_moving(self) -> None:
        if self._held_said and self._held_since is not None:
            log_event(logger, logging.INFO, "stream moving again", relay_id=self.relay_id,
                      held_for_s=round(time.monotonic() - self._held_since, 1))
        self._held_since, self._held_said = None, False

    def _stand_down(self, exc: store.PositionMovedError, in_flight: "deque[_Batch]") -> None:
        """Another relay moved the stream: this one no longer leads (what it sent since is
        delivered again by the leader, at least once)."""
        log_event(logger, logging.ERROR, "stream position moved by another relay, standing by",
                  relay_id=self.relay_id, error=str(exc))
        for batch in in_flight:
            self._drop_unrecorded(batch)
        self.resign()

    def _drop_unrecorded(self, batch: "_Batch") -> None:
        """A batch read past a position that stopped short: wait for its reports all the same
        (nothing of it is recorded; what was delivered is sent again, at least once)."""
        self._await_batch(batch.producer, batch)

    @staticmethod
    def _position_after(batch: "_Batch", outcome: BatchOutcome) -> store.Position | None:
        """Where the stream's position is after a recorded batch (None if it did not move)."""
        recorded = len(batch.claimed) - outcome.released
        if recorded <= 0:
            return None
        return batch.claimed[recorded - 1].position

    def _finish_stream(self, batch: "_Batch", start: store.Position,
                       detoured_keys: set[str] | None = None) -> BatchOutcome:
        """Await a stream batch's reports, then move the position past every row accounted for:
        delivered, refused (detoured with an attempt counted) or held (detoured); it stops
        before the first row the broker could not take (or that the stop released)."""
        self._await_batch(batch.producer, batch)
        outcome = BatchOutcome()
        detours: list[store.Detour] = []
        latencies: list[float] = []
        first_unavailable: KafkaError | None = None
        recorded = len(batch.claimed)
        for index, message in enumerate(batch.claimed):
            if message.held:
                detours.append(store.Detour(message.id))
                continue
            report = batch.deliveries.get(message.key.encode())
            error = report.error if report else None
            if report is not None and error is None:
                outcome.published += 1
                if report.acked_at is not None:  # its age when read, plus the time since
                    latencies.append(message.age_at_read_s + report.acked_at - message.read_at)
            elif error is None or kafka.broker_unavailable(error):
                first_unavailable = error
                recorded = index
                break
            else:
                retry_in = self._retry_in(message)
                detours.append(store.Detour(message.id, kafka.describe(error),
                                            timedelta(seconds=retry_in)))
                self._say_not_delivered(message, error, retry_in)
        outcome.claimed = len(batch.claimed)  # the rows not recorded are read again later
        outcome.released = len(batch.claimed) - recorded
        outcome.failed = sum(1 for d in detours if d.error is not None)
        if recorded:
            end = batch.claimed[recorded - 1].position
            assert end is not None  # noqa: S101 - a stream row has a position
            outcome.parked = store.advance(self.using, start=start, end=end,
                                           published=outcome.published, detours=detours,
                                           max_attempts=self.settings.max_attempts,
                                           leader_pid=self._leader_pid)
            if detoured_keys is not None and detours:
                gone = {d.id for d in detours}
                detoured_keys.update(m.key for m in batch.claimed[:recorded] if m.id in gone)
        metrics.observe_delivery_latencies(latencies)
        return self._account(outcome, first_unavailable, lane="stream")

    def _retry_in(self, message: store.ClaimedMessage) -> float:
        return backoff_delay(message.attempts + 1, self.settings.backoff_initial,
                             self.settings.backoff_max, self.rng)

    def _say_not_delivered(self, message: store.ClaimedMessage, error: KafkaError,
                           retry_in: float) -> None:
        log_event(logger, logging.WARNING, "message not delivered", relay_id=self.relay_id,
                  message_id=message.id, attempt=message.attempts + 1,
                  error=kafka.describe(error), retry_in_s=round(retry_in, 3))

    def _record_slow(self, claimed: list[store.ClaimedMessage],
                     deliveries: dict[bytes, _Delivery]) -> BatchOutcome:
        outcome = BatchOutcome(claimed=len(claimed))
        delivered: list[uuid.UUID] = []
        unavailable: list[uuid.UUID] = []
        failures: list[store.Failure] = []
        first_unavailable: KafkaError | None = None
        for message in claimed:
            report = deliveries.get(message.key.encode())
            error = report.error if report else None
            if report is not None and error is None:
                delivered.append(message.id)
                if report.acked_at is not None:  # its age when read, plus the time since
                    metrics.observe_delivery_latency(
                        message.age_at_read_s + report.acked_at - message.read_at)
            elif error is None or kafka.broker_unavailable(error):
                unavailable.append(message.id)
                first_unavailable = first_unavailable or error
            else:
                retry_in = self._retry_in(message)
                failures.append(store.Failure(message.id, kafka.describe(error),
                                              timedelta(seconds=retry_in)))
                self._say_not_delivered(message, error, retry_in)
        outcome.published = store.mark_published(self.using, delivered)
        outcome.released = len(unavailable)  # left unpublished: read again next time
        outcome.failed = len(failures)
        outcome.parked = store.record_failures(self.using, failures, self.settings.max_attempts)
        return self._account(outcome, first_unavailable, lane="slow")

    def _account(self, outcome: BatchOutcome, first_unavailable: KafkaError | None, *,
                 lane: str) -> BatchOutcome:
        """Say and count what a recorded batch did."""
        for message_id in outcome.parked:
            log_event(logger, logging.ERROR, "message parked", relay_id=self.relay_id,
                      message_id=message_id, attempts=self.settings.max_attempts)
        if outcome.published:
            self._reached_kafka()
        if outcome.released and self._refused is None:
            error_text = kafka.describe(first_unavailable) if first_unavailable else "no report"
            if self.stop.is_set():  # the shutdown grace ran out, not necessarily the broker
                log_event(logger, logging.WARNING, "messages released at stop",
                          relay_id=self.relay_id, released=outcome.released, error=error_text)
            else:
                self._outage.failed(error_text, released=outcome.released)
        log_event(logger, logging.DEBUG, "batch done", relay_id=self.relay_id, lane=lane,
                  claimed=outcome.claimed, published=outcome.published,
                  released=outcome.released, failed=outcome.failed, parked=len(outcome.parked))
        self.stats.add(outcome)
        if self.on_batch is not None:
            self.on_batch(self.stats)
        metrics.record_published(outcome.published)
        metrics.record_failed(outcome.failed)
        metrics.record_parked(len(outcome.parked))
        return outcome

    # --- retention -------------------------------------------------------------------------

    def prune(self) -> int:
        """Delete rows published longer than the retention ago, in bounded chunks."""
        total = delete_in_chunks(
            self.using, lambda size: store.prune_published(self.using, self.settings.retention, size),
            chunk=PRUNE_CHUNK, stop=self.stop,
        )
        if not self.stop.is_set():
            store.prune_batches(self.using, self.settings.retention)
        self.stats.pruned += total
        if total:
            log_event(logger, logging.INFO, "published messages pruned", relay_id=self.relay_id,
                      pruned=total, retention_s=self.settings.retention.total_seconds())
        return total

    # --- one pass, and the loop ----------------------------------------------------------

    def run_pass(self, held_bound_s: float = STREAM_HELD_WARN_S) -> RelayStats:
        """Check that the broker answers, publish until nothing is deliverable (or the broker
        is unavailable), then prune; a relay that finds another one leading publishes nothing
        (that one does). Rows held back by a transaction open on the server are waited for up
        to `held_bound_s`; if they are still held then, `stats.held_for_s` says how long."""
        try:
            self.stats.broker_answered = self.check_broker()
            held_since: float | None = None
            while not self.stop.is_set():
                outcome = self.publish_available()
                if outcome.broker_unavailable:
                    break
                if outcome.claimed:
                    held_since = None
                    continue
                if not self._stream_held():
                    break
                now = time.monotonic()
                held_since = now if held_since is None else held_since
                if now - held_since >= held_bound_s:
                    self.stats.held_for_s = max(now - held_since, 1e-3)
                    break
                self._wait(min(HELD_POLL_S, held_bound_s))
            self.prune()
        finally:
            self.resign()
            self._reader.close()
        return self.stats

    def _stream_held(self) -> bool:
        """Are there stream rows this leader cannot read yet (a transaction older than theirs
        is still open somewhere on the server)? False when another relay leads."""
        return self._leading and store.stream_waiting(self.using, store.read_position(self.using))

    def _back_off(self, failures: int, reason: str, level: int = logging.WARNING,
                  **fields: Any) -> None:
        delay = backoff_delay(failures, self.settings.backoff_initial, self.settings.backoff_max,
                              self.rng)
        self.stats.backoffs.append(delay)
        log_event(logger, level, reason, relay_id=self.relay_id, attempt=failures,
                  retry_in_s=round(delay, 3), **fields)
        self._wait(delay)

    def run_loop(self, wakeup: Wakeup | None = None) -> RelayStats:
        """Publish continuously until `stop`: a full or productive batch reads again at once,
        an empty one waits for a notification or the poll interval, failures back off."""
        wakeup = wakeup or Wakeup(self.using)
        unavailable = db_failures = 0
        next_prune = time.monotonic()
        log_event(logger, logging.INFO, "relay started", relay_id=self.relay_id,
                  batch_size=self.settings.batch_size,
                  poll_interval_s=self.settings.poll_interval.total_seconds())
        metrics.set_connected(False)  # until a delivery or the statistics show a broker up
        try:
            wakeup.listen()
            self.connect()
            while not self.stop.is_set():
                if self.heartbeat is not None:
                    self.heartbeat.beat()
                self.connect()
                try:
                    if time.monotonic() >= next_prune:
                        self.prune()
                        next_prune = time.monotonic() + PRUNE_EVERY_S
                    outcome = self.publish_available()
                    db_failures = 0
                except DatabaseErrors as exc:
                    db_failures += 1
                    connections[self.using].close()
                    self._reader.close()
                    failure = classify_on(exc, self.using)
                    self._back_off(db_failures, retry_event(failure), **failure.fields())
                    continue
                if self.stop.is_set():
                    break  # what the stop released is not the broker's fault
                if outcome.broker_unavailable:
                    unavailable += 1
                    # The outage log (OutageLog) says it, once per interval.
                    self._back_off(unavailable, "broker unavailable, backing off", logging.DEBUG)
                    continue
                unavailable = 0
                if outcome.claimed == 0:
                    wakeup.wait(self.settings.poll_interval.total_seconds(), self.stop)
        finally:
            wakeup.close()
            self.close()
        log_event(logger, logging.INFO, "relay stopped", relay_id=self.relay_id,
                  published=self.stats.published, parked=self.stats.parked)
        return self.stats

    def close(self) -> None:
        """Hand the lead over, let the producer finish (nothing is in flight between batches)
        and drop it."""
        self.resign()
        self._reader.close()
        if self._fatal is not None:  # failed at the end of a pass: no replacement said it
            log_event(logger, logging.ERROR, "producer failed fatally", relay_id=self.relay_id,
                      error=kafka.describe(self._fatal))
            self._fatal = None
        if self._producer is not None:
            try:
                self._producer.flush(self.settings.shutdown_grace.total_seconds())
            except KafkaException:
                self._drop(self._producer)  # failed fatally: nothing left to wait for
            self._producer = None
