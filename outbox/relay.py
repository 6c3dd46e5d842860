"""The outbox relay (docs/outbox-relay.md): read the outbox as a stream, produce it to Kafka,
record one position per batch; this module builds a relay from its parts (`build_parts`), runs a
pass and the loop, prunes and closes. Here too are the two parts that are the relay's own:

- the lead (`Leadership`, "One relay at a time"): one relay at a time publishes, the one holding
  the relays' session advisory lock, taken without waiting once per database session, and never
  on a server in recovery (a standby: the relay stands by until it is promoted; when the
  leader's session ends another takes over). The leader checks that the stream belongs to this
  cluster before reading it (`settle`); a pooler by transaction is refused at start, before the
  lead (core.db's `transaction_pooler_in_the_way`); every batch it records checks that its
  statements still reach the server process that took the lead (`leader_pid`, store.advance:
  a pooler by transaction would break the lock's meaning), and its reader checks that it reads
  the server the relay leads on (`server`, outbox.lanes.StreamReader);
- the wake-up for `--loop` (`Wakeup`): LISTEN on the channel the outbox insert trigger notifies
  (migration 0003_relay_claims), so a new event goes out within a second; polling covers a lost
  connection or a missed notification.

The other parts, one concept a module: outbox.producer (the Kafka producer's life, a batch
produced and awaited, the delivery reports' classifier, the patient producer), outbox.lanes
(the stream lane and the slow lane, their reader, what each batch did and when a row is tried
again), outbox.topic_watch (the topics' durability and partitions).

No transaction is open during any Kafka call.
"""

import contextlib
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connections

from core.db import DatabaseErrors, delete_in_chunks, new_session, transaction_pooler_in_the_way
from core.failures import classify_on, retry_event
from core.health import Heartbeat, Verdict
from core.logs import log_event
from core.supervise import Backoff, supervise
from outbox import metrics, store
from outbox.config import Emit, RelaySettings
from outbox.kafka import OutageLog, redacting
from outbox.lanes import (
    BatchOutcome,
    HeldWatch,
    ReadSize,
    RelayStats,
    Retries,
    SlowLane,
    StreamLane,
    StreamReader,
    Tally,
)
from outbox.producer import RelayProducer
from outbox.topic_watch import TopicWatch

# --- the lead --------------------------------------------------------------------------------------

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


# --- the wake-up -----------------------------------------------------------------------------------

wakeup_logger = logging.getLogger("outbox.wakeup")

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
            log_event(wakeup_logger, logging.WARNING, "listen failed, polling instead",
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
                log_event(wakeup_logger, logging.WARNING, "listen connection lost, polling instead",
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


# --- the relay -------------------------------------------------------------------------------------

logger = logging.getLogger("outbox.relay")

PRUNE_CHUNK = 5_000
PRUNE_EVERY_S = 600.0
# A stream held back this long by a transaction still open on the server is worth a warning.
STREAM_HELD_WARN_S = 60.0
# How often a pass looks again at rows held back by an open transaction.
HELD_POLL_S = 0.25

Wait = Callable[[float], object]


@dataclass(frozen=True, slots=True)
class RelayParts:
    """A relay's collaborators, each built with what it needs (`build_parts`)."""

    leadership: Leadership
    topics: TopicWatch
    kafka: RelayProducer
    reader: StreamReader
    retries: Retries
    tally: Tally
    stream: StreamLane
    slow: SlowLane


def relay_log(relay_id: str) -> Emit:
    """The relay's log: `outbox.relay` lines, each naming the relay."""

    def say(level: int, event: str, fields: dict[str, Any]) -> None:
        log_event(logger, level, event, relay_id=relay_id, **fields)

    return say


def build_parts(settings: RelaySettings, *, using: str, relay_id: str, stop: threading.Event,
                emit: Emit, rng: random.Random,
                on_batch: Callable[[RelayStats], object] | None = None) -> RelayParts:
    """The relay's parts, each given what it needs when it is built, in the order they need
    each other: the partitions' outages (Retries) and Kafka's (OutageLog) first, which the
    topic watch is told of; then the producer, which asks the watch before each batch; the
    lead and the reader; the lanes over them all."""
    retries = Retries(backoff_initial=settings.backoff_initial, backoff_max=settings.backoff_max,
                      outage_log_interval=settings.outage_log_interval, emit=emit, rng=rng)
    outage = OutageLog(redacting(emit, settings),
                       interval_s=settings.outage_log_interval.total_seconds())
    # Each topic's first batch waits for a look at its durability and partitions; no look while
    # Kafka is failing; a partition found able again ends its outage.
    topics = TopicWatch(settings, using, client_id=relay_id, emit=emit,
                        kafka_failing=lambda: outage.failing, on_ready=retries.partitions.ready)
    producer = RelayProducer(settings, relay_id, emit=emit, stop=stop, topics=topics,
                             outage=outage)
    leadership = Leadership(using, emit=emit)
    reader = StreamReader(using, ReadSize.of(settings), leader=leadership)
    tally = Tally(RelayStats(), emit=emit, on_batch=on_batch)
    stream = StreamLane(using, max_attempts=settings.max_attempts, producer=producer,
                        reader=reader, leadership=leadership, retries=retries, tally=tally,
                        held=HeldWatch(emit, warn_after_s=STREAM_HELD_WARN_S), stop=stop,
                        emit=emit)
    slow = SlowLane(using, batch_size=settings.batch_size, max_attempts=settings.max_attempts,
                    producer=producer, retries=retries, tally=tally)
    return RelayParts(leadership, topics, producer, reader, retries, tally, stream, slow)


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
        self.heartbeat = heartbeat  # beaten every loop iteration: /healthz of publish_outbox --loop
        self._say = relay_log(self.relay_id)
        parts = build_parts(settings, using=using, relay_id=self.relay_id, stop=self.stop,
                            emit=self._say, rng=self.rng, on_batch=on_batch)
        self.leadership, self.topics, self.kafka = parts.leadership, parts.topics, parts.kafka
        self._reader, self.retries, self.tally = parts.reader, parts.retries, parts.tally
        self.stream, self.slow = parts.stream, parts.slow
        self.stats = parts.tally.stats

    def connect(self) -> None:
        """Start the producer now (it connects at once), so a refusal shows before any event."""
        self.kafka.connect()

    def check_broker(self) -> bool:
        """Ask the broker for its metadata (RelayProducer.check_broker). A pass does this first,
        so that it sees a broker it cannot use even when it has nothing to send."""
        return self.kafka.check_broker()

    def lead(self) -> bool:
        leading = self.leadership.lead()
        self.stats.stood_by = self.stats.stood_by or self.leadership.stood_by
        return leading

    def resign(self) -> None:
        self.leadership.resign()

    def publish_available(self) -> BatchOutcome:
        """The slow lane's due rows, then stream batches (StreamLane.publish), if this relay
        leads; raises KafkaRefusedError once the broker refused the relay."""
        total = BatchOutcome()
        if self.stop.is_set():
            return total
        self.kafka.state.check_refused()
        if not self.lead():
            return total
        total.merge(self.slow.publish())
        if total.broker_unavailable or self.stop.is_set():
            return total
        # The cluster check right before the stream's read (the slow lane reads by id only).
        self.leadership.settle()
        return self.stream.publish(total)

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
            self._say(logging.INFO, "published messages pruned",
                      {"pruned": total, "retention_s": self.settings.retention.total_seconds()})
        return total

    def run_pass(self, held_bound_s: float = STREAM_HELD_WARN_S) -> RelayStats:
        """Check that the broker answers, publish until nothing is deliverable (or the broker
        is unavailable), then prune; a relay that finds another one leading publishes nothing
        (that one does). Rows held back by a transaction open on the server are waited for up
        to `held_bound_s`; if they are still held then, `stats.held_for_s` says how long.
        Returns the relay's running totals, over all its passes (one pass a command)."""
        try:
            self.stats.broker_answered = self.check_broker()
            held_since: float | None = None
            while not self.stop.is_set():
                outcome = self.publish_available()
                if self.leadership.in_recovery is not None:  # nothing produced, nothing pruned
                    raise store.ServerInRecoveryError(in_recovery_line(self.leadership.in_recovery))
                if outcome.broker_unavailable:
                    break
                if outcome.read:
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
            self.topics.close()
        return self.stats

    def readiness(self) -> Verdict:
        """Not ready while standing by on a server in recovery (--loop's /readyz)."""
        if self.leadership.in_recovery is not None:
            return Verdict(False, in_recovery_line(self.leadership.in_recovery))
        return Verdict(True, "ok")

    def _stream_held(self) -> bool:
        """Are there stream rows this leader cannot read yet (a transaction older than theirs
        is still open somewhere on the server)? False when another relay leads."""
        return (self.leadership.leading
                and store.stream_waiting(self.using, store.read_position(self.using)))

    def run_loop(self, wakeup: Wakeup | None = None) -> RelayStats:
        """Publish continuously until `stop`: a full or productive batch reads again at once,
        an empty one waits for a notification or the poll interval, failures back off
        (core.supervise, OUTBOX_BACKOFF_INITIAL up to OUTBOX_BACKOFF_MAX)."""
        wakeup = wakeup or Wakeup(self.using)
        backoff = Backoff(self.settings.backoff_initial, self.settings.backoff_max,
                          wait=self._wait, rng=self.rng)
        next_prune = time.monotonic()

        def step() -> None:
            nonlocal next_prune
            if self.heartbeat is not None:
                self.heartbeat.beat()
            self.connect()
            self.lead()  # first: a server in recovery takes no statement that writes (prune)
            if time.monotonic() >= next_prune and self.leadership.in_recovery is None:
                self.prune()
                next_prune = time.monotonic() + PRUNE_EVERY_S
            outcome = self.publish_available()
            if self.leadership.leading:
                self.topics.look_again_if_due()  # a partition added, a configuration changed
            backoff.succeeded("database")
            if self.stop.is_set():
                return  # what the stop released is not the broker's fault
            if outcome.broker_unavailable:
                # The outage log (OutageLog) says it, once per interval.
                backoff.failed("broker", lambda failures, delay: self._backing_off(
                    failures, delay, "broker unavailable, backing off", logging.DEBUG, {}))
                return
            backoff.succeeded("broker")
            if outcome.read == 0:
                wakeup.wait(self.settings.poll_interval.total_seconds(), self.stop)

        def database_failed(exc: BaseException, failures: int, delay: float) -> None:
            connections[self.using].close()
            self._reader.close()
            failure = classify_on(exc, self.using)
            self._backing_off(failures, delay, retry_event(failure), logging.WARNING,
                              failure.fields())

        self._say(logging.INFO, "relay started", {
            "batch_size": self.settings.batch_size,
            "batch_size_min": self._reader.size.floor,
            "poll_interval_s": self.settings.poll_interval.total_seconds(),
            "topics": ",".join(sorted(self.settings.topics))})
        metrics.set_connected(False)  # until a delivery or the statistics show a broker up
        try:
            wakeup.listen()
            self.connect()
            supervise(step, stop=self.stop, backoff=backoff, retry_on=DatabaseErrors,
                      kind="database", said=database_failed)
        finally:
            wakeup.close()
            self.close()
        self._say(logging.INFO, "relay stopped",
                  {"published": self.stats.published, "parked": self.stats.parked})
        return self.stats

    def _backing_off(self, failures: int, delay: float, reason: str, level: int,
                     fields: dict[str, Any]) -> None:
        self.stats.backoffs.append(delay)
        self._say(level, reason, {"attempt": failures, "retry_in_s": round(delay, 3), **fields})

    def close(self) -> None:
        """Hand the lead over, let the producer finish (nothing is in flight between batches)
        and drop it."""
        self.resign()
        self._reader.close()
        self.kafka.close()
        self.topics.close()


def in_recovery_line(server: store.Server) -> str:
    """Why a relay does not publish on `server`, in one line."""
    return (f"the database server {server} is in recovery (a standby, or a restore under way): "
            "the relay publishes only on the primary; point DATABASE_URL at it (with several "
            "hosts: target_session_attrs=read-write)")
