"""The outbox relay (docs/outbox-relay.md): read the outbox as a stream, produce it to Kafka,
record one position per batch; this module runs a pass and the loop, prunes and closes. Its
parts, one concept each:

- outbox.leadership: one relay at a time publishes, the one holding the relays' session
  advisory lock (the others stand by, and one of them takes over when the leader's database
  session ends);
- outbox.producer: the Kafka producer's life, its callbacks, a batch produced and awaited;
- outbox.lanes: the stream lane (the batch cut, the pipeline, the position moved per batch);
- outbox.lanes: the slow lane, for rows that left the stream;
- outbox.producer: one classifier of delivery reports, for both lanes;
- outbox.lanes: when a row that did not go out is tried again (its backoff, its partition's);
- outbox.lanes: what each batch did, said and counted;
- outbox.lanes: the watch on a stream held back by a transaction open on the server.

No transaction is open during any Kafka call.
"""

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.db import connections

from core.db import DatabaseErrors, delete_in_chunks
from core.failures import classify_on, retry_event
from core.health import Heartbeat, Verdict
from core.logs import log_event
from core.supervise import Backoff, supervise
from outbox import metrics, store
from outbox.config import RelaySettings
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
from outbox.leadership import Leadership
from outbox.producer import RelayProducer
from outbox.topic_watch import TopicWatch
from outbox.wakeup import Wakeup

__all__ = ["BatchOutcome", "Relay", "RelayStats"]

logger = logging.getLogger("outbox.relay")

PRUNE_CHUNK = 5_000
PRUNE_EVERY_S = 600.0
# A stream held back this long by a transaction still open on the server is worth a warning.
STREAM_HELD_WARN_S = 60.0
# How often a pass looks again at rows held back by an open transaction.
HELD_POLL_S = 0.25

Wait = Callable[[float], object]


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
        # Each topic's first batch waits for a look at its durability and partitions.
        self.topics = TopicWatch(settings, using, client_id=self.relay_id, emit=self._say,
                                 kafka_failing=lambda: self.kafka.outage.failing)
        self.kafka = RelayProducer(settings, self.relay_id, emit=self._say, stop=self.stop,
                                   topics=self.topics)
        self.leadership = Leadership(using, emit=self._say)
        self._reader = StreamReader(using, ReadSize.of(settings), leader=self.leadership)
        self.retries = Retries(backoff_initial=settings.backoff_initial,
                               backoff_max=settings.backoff_max,
                               outage_log_interval=settings.outage_log_interval,
                               emit=self._say, rng=self.rng)
        self.tally = Tally(self.stats, emit=self._say, on_batch=on_batch)
        self.stream = StreamLane(using, max_attempts=settings.max_attempts,
                                 producer=self.kafka, reader=self._reader,
                                 leadership=self.leadership, retries=self.retries,
                                 tally=self.tally,
                                 held=HeldWatch(self._say, warn_after_s=STREAM_HELD_WARN_S),
                                 stop=self.stop, emit=self._say)
        self.slow = SlowLane(using, batch_size=settings.batch_size,
                             max_attempts=settings.max_attempts, producer=self.kafka,
                             retries=self.retries, tally=self.tally)
        self.topics.on_ready = self.retries.partitions.ready

    def _say(self, level: int, event: str, fields: dict[str, Any]) -> None:
        log_event(logger, level, event, relay_id=self.relay_id, **fields)

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
        self.kafka.check_refused()
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
