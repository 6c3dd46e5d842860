"""The relay's Kafka producer, from start to close (docs/outbox-relay.md, "One batch"): started on
first use and replaced after a fatal error; its callbacks (a refusal stops the relay, anything
else is a failing connection for the outage log); a batch handed to it and awaited, up to the
delivery timeout or the shutdown grace.

Delivery reports come for errors only (`delivery.report.only.error`): a batch is acknowledged
as a whole once the producer has nothing left in flight or unreported after it (`flush` comes
back empty), and then each of its rows without an error report was acknowledged by the broker.
A batch that never got there (the deadline, the stop, a refusal, a fatal error) counts each row
without an error report as not delivered: it is sent again later (at least once).

`sort_reports` says what a batch's delivery reports say about its rows: one pure classifier for
both lanes (docs/outbox-relay.md, "One batch").

A row is delivered (no error reported, in a batch the producer acknowledged as a whole), held (a
stream row behind its key's slow-lane head: never sent), off the allowlist (its topic is not on
OUTBOX_TOPICS: never sent, parked at once), refused (the broker will never take it
as it is: an attempt is counted), deferred (its partition could not take it now while the
cluster took others: it waits in the slow lane, no attempt counted), or unavailable (not
acknowledged, or an error that says only that Kafka could not be reached: nothing is wrong with
the row, it is read again later).

The patient producer (docs/outbox-relay.md, "Copies"): rows whose earlier attempt may already
be on the topic are sent again by a producer that never gives up on a message for time.

An attempt that timed out in the client may still be appended by a leader that was only slow
(or appended already, its acknowledgement waiting on a follower). A new attempt by the relay's
producer is a new message to the broker: librdkafka starts a new idempotence epoch after such a
time-out, so the broker cannot tell the retry from the first, and a retry that times out too may
leave one copy more, every time. The patient producer has no message time-out
(`message.timeout.ms=0`): librdkafka retries each of its messages under one sequence number until
a broker answers, and the broker keeps one copy of it whatever the retries. So a row that timed
out once is on the topic at most twice: once for that attempt, once for its patient one.

The same producer sends the probe of a partition that did not answer in time (outbox.topic_watch
keeps it from the relay's producer meanwhile): one row of it at a time, and an acknowledgement
within the delivery timeout says the partition answers again.

Its reports come for every message, success included (few go this way), and are kept by row id
until the lane that holds the row takes them: the stream for a row still after the position,
the slow lane for a row it holds (one the stream detoured while it was still on its way).
"""

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from confluent_kafka import KafkaError, KafkaException, Producer

from outbox import kafka, metrics
from outbox.config import Emit, RelaySettings, off_allowlist_error
from outbox.kafka import (
    PRODUCER_STATE_CODES,
    OutageLog,
    broker_unavailable,
    describe,
    local_timeout,
    partition_unavailable,
    possibly_appended,
    redacting,
    refusal,
    refused,
)
from outbox.metrics import parse_statistics
from outbox.store import Position, Read, ReadMessage

# --- what a batch's delivery reports say -----------------------------------------------------------

@dataclass(slots=True)
class Reports:
    """A batch's rows sorted by their reports, in the batch's order. With `stop_at_unavailable`
    only the rows before the first unavailable one are sorted (`settled` of them)."""

    settled: int = 0
    delivered: list[ReadMessage] = field(default_factory=list)
    # The delivered rows' ages at the batch's acknowledgement: (seconds, rows) pairs, one for
    # each created_at (a writer's transaction stamps all its rows with one).
    latencies: list[tuple[float, int]] = field(default_factory=list)
    # Rows that leave for the slow lane, with the broker's refusal (None: held, never sent).
    detoured: list[tuple[ReadMessage, KafkaError | None]] = field(default_factory=list)
    # Rows whose partition could not take them now (no leader, not enough replicas, timed out)
    # in a batch the cluster otherwise took: they leave for the slow lane, no attempt counted.
    deferred: list[tuple[ReadMessage, KafkaError]] = field(default_factory=list)
    unavailable: list[ReadMessage] = field(default_factory=list)
    # Rows never sent because their topic is not on OUTBOX_TOPICS, with why: parked at once.
    off_allowlist: list[tuple[ReadMessage, str]] = field(default_factory=list)
    first_unavailable: KafkaError | None = None  # the first unavailable row's error, if any

    @property
    def refused(self) -> list[tuple[ReadMessage, KafkaError]]:
        return [(m, e) for m, e in self.detoured if e is not None]


def sort_reports(messages: Sequence[ReadMessage], errors: Mapping[str, KafkaError], *,
                 acked_at: float | None, read_at: float, stop_at_unavailable: bool,
                 unavailable: Callable[[KafkaError], bool] = broker_unavailable,
                 unsent: Collection[str] = (), unsent_open: bool = False,
                 off_allowlist: Mapping[str, str] | None = None,
                 cluster_answers: Callable[[], bool] = lambda: True) -> Reports:
    """Sort `messages` by the `errors` reported for them (by message key: a batch has one row
    per key) and the batch's acknowledgement (`acked_at`, monotonic; None: the batch was not
    acknowledged, so a row without an error report is not known to be delivered). The stream
    stops at the first unavailable row (its position cannot pass it); the slow lane sorts every
    row. A row's latency is its age when read (`read_at`) plus the time to the acknowledgement
    of its batch.

    A partition's outage is told from the broker's by the batch itself: a row with a
    partition-level error (`partition_unavailable`) is deferred when the batch was acknowledged
    and the stream's batch had a row delivered (the cluster answers; that partition does not);
    in a batch with nothing delivered it is unavailable and the stream stops before it, as for
    a broker that cannot be reached. The slow lane defers such a row whatever the rest did
    (its rows are detoured already: nothing floods, and the stream judges the broker). Rows
    `unsent` (keys: kept back because the topic's metadata showed their partition unable to
    take them) are no answer of the cluster: a stream batch with nothing delivered stops before
    them as well, so that a topic whose every partition is short of in-sync replicas stops the
    stream instead of detouring it row by row; unless the batch sent nothing at all and
    `unsent_open` (the relay sends to other partitions of their topics: it is their partitions
    that cannot take them, as when a row is its batch's only one). Rows `off_allowlist`
    (keys: why) were never sent: they are sorted apart, in their place, whatever the rest did.

    A row that timed out in this client (`local_timeout`) beside delivered rows may be a broker
    that died halfway through the batch, not its partition: the stream defers it only if
    `cluster_answers()` (asked then, once: a metadata request) says a broker answers now."""
    reports = Reports(settled=len(messages))
    off_allowlist = off_allowlist or {}
    if (acked_at is not None and not errors and not off_allowlist
            and not any(m.held for m in messages)):
        reports.delivered = list(messages)  # the usual batch: every row delivered
    else:
        defer = acked_at is not None and _cluster_answered(
            messages, errors, stop_at_unavailable=stop_at_unavailable, unsent=unsent,
            unsent_open=unsent_open, off_allowlist=off_allowlist,
            cluster_answers=cluster_answers)
        _sort_each(reports, messages, errors, acked=acked_at is not None, defer=defer,
                   stop_at_unavailable=stop_at_unavailable, unavailable=unavailable,
                   off_allowlist=off_allowlist, kept_back=frozenset() if unsent_open else unsent)
    if acked_at is not None and reports.delivered:
        reports.latencies = _latencies(reports.delivered, acked_at=acked_at, read_at=read_at)
    return reports


def _cluster_answered(messages: Sequence[ReadMessage], errors: Mapping[str, KafkaError], *,
                      stop_at_unavailable: bool, unsent: Collection[str], unsent_open: bool,
                      off_allowlist: Mapping[str, str],
                      cluster_answers: Callable[[], bool]) -> bool:
    """Did the cluster answer an acknowledged batch, so that its rows with a partition-level
    error are deferred (`sort_reports`)? The slow lane's always; the stream's if a row it sent
    was delivered, and, when a row timed out in this client, if `cluster_answers()` says so;
    one that sent nothing, if `unsent_open`."""
    if not stop_at_unavailable:
        return True
    sent = [m for m in messages
            if not m.held and m.key not in unsent and m.key not in off_allowlist]
    if not sent and unsent:
        return unsent_open
    if all(m.key in errors for m in sent):
        return False
    timed_out = (partition_unavailable(e) and local_timeout(e)
                 for e in (errors[m.key] for m in sent if m.key in errors))
    return cluster_answers() if any(timed_out) else True


def _latencies(delivered: Sequence[ReadMessage], *, acked_at: float,
               read_at: float) -> list[tuple[float, int]]:
    """The delivered rows' ages at the acknowledgement: (seconds, rows), one per created_at."""
    since_read = acked_at - read_at
    clock_s = delivered[0].clock_s  # one read: one clock
    return [(max(0.0, clock_s - created_ms / 1000) + since_read, rows)
            for created_ms, rows in Counter(m.timestamp_ms for m in delivered).items()]


def _sort_each(reports: Reports, messages: Sequence[ReadMessage],
               errors: Mapping[str, KafkaError], *, acked: bool, defer: bool,
               stop_at_unavailable: bool, unavailable: Callable[[KafkaError], bool],
               off_allowlist: Mapping[str, str], kept_back: Collection[str]) -> None:
    """Sort each row (`sort_reports`); a row of `kept_back` (not sent while every partition of
    its topic was kept back) is never deferred: the probes that answered beside it may have
    freed its partition, and it is read again."""
    for index, message in enumerate(messages):
        if message.held:
            reports.detoured.append((message, None))
            continue
        if message.key in off_allowlist:
            reports.off_allowlist.append((message, off_allowlist[message.key]))
            continue
        error = errors.get(message.key)
        if error is None and acked:
            reports.delivered.append(message)
        elif (error is not None and defer and partition_unavailable(error)
              and message.key not in kept_back):
            reports.deferred.append((message, error))
        elif error is None or unavailable(error):
            reports.first_unavailable = reports.first_unavailable or error
            if stop_at_unavailable:
                reports.settled = index
                return
            reports.unavailable.append(message)
        else:
            reports.detoured.append((message, error))


# --- the patient producer -----------------------------------------------------------------------------

# How long the patient producer's start waits for each topic's metadata (it goes on without).
PATIENT_METADATA_S = 2.0


@dataclass(frozen=True, slots=True)
class PatientReport:
    """A row's patient attempt, answered: acknowledged (no error) or failed."""

    message: ReadMessage
    partition: int  # -1: none assigned
    error: KafkaError | None
    in_time: bool  # acknowledged within the delivery timeout of its send


class PatientProducer:
    """The relay's second producer, started on first use and replaced after a fatal error.
    `possibly_appended` holds the ids of rows whose attempt by the relay's producer ended
    without an answer (they go this way from then on, in either lane)."""

    def __init__(self, settings: RelaySettings, client_id: str, *, emit: Emit,
                 new_producer: Callable[..., Producer] = kafka.new_patient_producer) -> None:
        self.settings = settings
        self.client_id = client_id
        self._emit = emit
        self._new_producer = new_producer
        self._producer: Producer | None = None
        self._fatal: KafkaError | None = None
        self.possibly_appended: set[str] = set()
        # In flight, by row id: the row and the partition it is bound for (-1: not known yet).
        self._sent: dict[str, tuple[ReadMessage, int]] = {}
        self._reports: dict[str, PatientReport] = {}
        self._slow_lane: set[str] = set()  # ids whose report the slow lane takes

    @property
    def busy(self) -> bool:
        """Anything to look out for: rows possibly appended, in flight or answered."""
        return bool(self.possibly_appended or self._sent or self._reports)

    def holds(self, message_id: str) -> bool:
        """The row is in flight here, or answered and its report not taken yet."""
        return message_id in self._sent or message_id in self._reports

    def probing(self, topic: str, partition: int) -> bool:
        """A row bound for that partition is in flight here."""
        return any(m.topic == topic and p == partition for m, p in self._sent.values())

    def send(self, message: ReadMessage, partition: int) -> None:
        """Hand one row over (once: a row it holds is not sent again)."""
        if self.holds(message.id):
            return
        producer = self._current()
        self._sent[message.id] = (message, partition)

        def answered(error: KafkaError | None, record: Any) -> None:
            if error is not None and error.code() in PRODUCER_STATE_CODES:
                self._fatal = self._fatal or error  # this producer is done: a new one sends it
            sent = self._sent.pop(message.id, None)
            assigned = record.partition()
            latency = record.latency()
            self._reports[message.id] = PatientReport(
                message, assigned if assigned is not None and assigned >= 0
                else (sent[1] if sent else -1), error,
                error is None and latency is not None
                and latency <= self.settings.delivery_timeout.total_seconds())

        try:
            producer.produce(message.topic, message.payload, message.key,
                             headers=kafka.record_headers(orjson.loads(message.headers)),
                             timestamp=message.timestamp_ms, on_delivery=answered)
        except (BufferError, KafkaException) as exc:
            self._sent.pop(message.id, None)  # not handed over: sent again at its next turn
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if error is not None and error.fatal():
                self._fatal = error
            return
        self.serve()

    def start(self) -> None:
        """Start it now, with the metadata of the relay's topics, so that its connections, its
        idempotent producer id and where each partition is are known before a partition first
        fails to answer in time (its first probe would wait for them, behind a metadata request
        that may go to the very broker that does not answer)."""
        if self._producer is None:
            producer = self._current()
            for topic in sorted(self.settings.topics):
                with contextlib.suppress(KafkaException):
                    producer.list_topics(topic, timeout=PATIENT_METADATA_S)
        self.serve()

    def restart(self) -> None:
        """The relay's producer was replaced after a fatal error, or every broker went down:
        this one goes too (a broker that forgot one producer forgot both, and a restarted one
        may give its id to another); what it had in flight is purged, reported as such, and
        sent again by the next one."""
        self._drop()

    def serve(self, timeout: float = 0.0) -> None:
        """Serve its reports (up to `timeout`); a fatal error replaces the producer (what it had
        in flight is purged: reported as such, and sent again at its next turn)."""
        if self._producer is None:
            return
        try:
            self._producer.poll(timeout)
        except KafkaException as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if error is None or not error.fatal():
                raise
            self._fatal = error
        if self._fatal is not None:
            self._drop()

    def report(self, message_id: str) -> PatientReport | None:
        """The row's report, if it came (left for `take`)."""
        return self._reports.get(message_id)

    def take(self, message_id: str) -> PatientReport | None:
        """The row's report, if it came (taken: the row is recorded)."""
        self._slow_lane.discard(message_id)
        report = self._reports.pop(message_id, None)
        if report is not None and report.error is None:
            self.possibly_appended.discard(message_id)
        return report

    def to_slow_lane(self, message_id: str) -> None:
        """The stream detoured the row while it was on its way: the slow lane takes its report."""
        if self.holds(message_id):
            self._slow_lane.add(message_id)

    def slow_lane_reports(self) -> list[PatientReport]:
        """The reports of the rows the slow lane holds that came (taken)."""
        came = [i for i in self._slow_lane if i in self._reports]
        return [r for r in map(self.take, came) if r is not None]

    def _current(self) -> Producer:
        if self._fatal is not None:
            self._drop()
        if self._producer is None:
            self._producer = self._new_producer(self.settings, self.client_id, self._on_error)
        return self._producer

    def _on_error(self, error: KafkaError) -> None:
        """A failing connection is the relay's producer's to say (it fails too); a fatal error
        replaces this one."""
        if error.fatal():
            self._fatal = error

    def _drop(self) -> None:
        """Purge the producer: what it had in flight is reported purged; start anew."""
        producer, self._producer = self._producer, None
        if self._fatal is not None:
            self._emit(logging.ERROR, "patient producer failed fatally, starting a new one",
                       {"error": describe(self._fatal)})
            self._fatal = None
        if producer is not None:
            with contextlib.suppress(KafkaException):
                producer.purge(in_queue=True, in_flight=True, blocking=False)
                producer.poll(0)
        for message_id, (message, partition) in self._sent.items():  # no report came
            self._reports[message_id] = PatientReport(
                message, partition, KafkaError(KafkaError._PURGE_INFLIGHT), in_time=False)
        self._sent.clear()

    def close(self, grace: float) -> None:
        """Let what is in flight finish within `grace`, then drop it (sent again by whichever
        relay leads next)."""
        if self._producer is not None:
            with contextlib.suppress(KafkaException):
                self._producer.flush(grace)
        self._drop()


# --- the relay's producer ------------------------------------------------------------------------------

# Extra time past the producer's own delivery timeout before the relay stops waiting.
FLUSH_MARGIN_S = 5.0
FLUSH_SLICE_S = 0.2
# A metadata request's first wait; then twice as long each time, the callbacks served between.
METADATA_SLICE_S = 0.5
# How long a stream batch that delivered nothing waits for another leader's answer (or, where
# none is known, a metadata answer: two slices) before its late rows are blamed on their partitions.
LATE_ALONE_ANSWER_S = 1.5
# A row still on its way on the patient producer when the rest of its stream batch was
# delivered: it did not answer while the others did (PatientProducer).
PENDING = KafkaError(KafkaError._MSG_TIMED_OUT,
                     "not acknowledged yet: sent again by the patient producer, which waits for "
                     "the broker's answer")


@dataclass(slots=True, eq=False)  # a batch is itself: compared by identity
class Batch:
    """Rows read, those handed to the producer (`sent`: a held stream row is not), the errors
    reported for them, and when to stop waiting. A stream batch also has the position it was
    read after."""

    read: list[ReadMessage]
    read_at: float  # when the read returned (monotonic)
    sent: int
    errors: dict[str, KafkaError]  # by message key: a batch has one row per key
    deadline: float
    producer: Producer  # the one that has it, even if a fatal error replaced it since
    start: Position | None = None
    # When the producer was found with nothing in flight or unreported after this batch (every
    # row sent without an error report acknowledged then); None until then, and for good if the
    # wait ended otherwise.
    acked_at: float | None = None
    # The partition of each row an error was reported for (-1: none assigned yet), by key.
    partitions: dict[str, int] = field(default_factory=dict)
    # Keys of rows not sent: the topic's metadata showed their partition unable to take them.
    unsent: set[str] = field(default_factory=set)
    # The relay sent to other partitions of the unsent rows' topics when the batch was produced.
    unsent_open: bool = False
    # Keys of rows whose outcome is the patient producer's (sent there, or already on their way).
    patient: set[str] = field(default_factory=set)
    # Rows not sent because their topic is not on OUTBOX_TOPICS, by key: why (they are parked).
    off_allowlist: dict[str, str] = field(default_factory=dict)

    @property
    def keys(self) -> set[str]:
        return {m.key for m in self.read}


class Topics(Protocol):
    """What the producer asks of the relay's look at its topics (outbox.topic_watch.TopicWatch)."""

    def admit(self, messages: list[ReadMessage]) -> Mapping[str, tuple[int, KafkaError]]:
        """Before a batch is produced: the rows not to send, by key, with their partition and
        the error to report for them."""
        ...

    def partition_failed(self, topic: str, partition: int, error: KafkaError) -> None:
        """Told each error report."""
        ...

    def partition_of(self, topic: str, key: str) -> int:
        """The partition a key goes to (-1: not known)."""
        ...

    @property
    def suspecting(self) -> bool:
        """Some broker is suspected of holding up a late partition (delivered rows vouch)."""
        ...

    def sends_to_some(self, topic: str) -> bool:
        """Some partition of `topic` is not kept back now."""
        ...

    def others_answer(self, topic: str, late: Collection[int], timeout: float) -> bool | None:
        """Whether a broker that leads none of the `late` partitions answers now (None: no
        such broker known)."""
        ...

    def partitions_late(self, topic: str, late: Iterable[int],
                        answered: Iterable[int] = ()) -> None:
        """Rows of `late` timed out in the client while the cluster answered (rows of
        `answered` were acknowledged beside them)."""
        ...

    def answered_in_time(self, topic: str, partition: int) -> None:
        """A row of it was acknowledged within the delivery timeout."""
        ...


class EveryPartitionAble:
    """No look at the topics: every row is sent."""

    def admit(self, messages: list[ReadMessage]) -> Mapping[str, tuple[int, KafkaError]]:
        return {}

    def partition_failed(self, topic: str, partition: int, error: KafkaError) -> None:
        pass

    def partition_of(self, topic: str, key: str) -> int:
        return -1

    suspecting = False

    def sends_to_some(self, topic: str) -> bool:
        return True

    def others_answer(self, topic: str, late: Collection[int], timeout: float) -> bool | None:
        return None

    def partitions_late(self, topic: str, late: Iterable[int],
                        answered: Iterable[int] = ()) -> None:
        pass

    def answered_in_time(self, topic: str, partition: int) -> None:
        pass


class PatientRoute:
    """A batch's rows whose outcome is the patient producer's: sent there while the batch is
    produced (`takes`), waited for beside it (`await_reports`), their reports taken once it is
    recorded (`record`), and the rows the relay's producer gave up on while they may have been
    sent marked for the patient way from then on."""

    def __init__(self, patient: PatientProducer, topics: Topics, stop: threading.Event) -> None:
        self.patient = patient
        self.topics = topics
        self._stop = stop

    def takes(self, message: ReadMessage, batch: Batch,
              unsendable: Mapping[str, tuple[int, KafkaError]], *, careful: bool) -> bool:
        """Whether a row of a batch being produced goes the patient way (its outcome is then the
        patient producer's): one that producer has, one whose earlier attempt may be on the
        topic (sent there, whatever the metadata says), or the probe of a partition kept back
        for not answering in time (one row of it at a time). `careful`: the patient producer
        had rows, or had to, when the batch began."""
        if careful and self._careful(message, batch, unsendable):
            return True
        kept = unsendable.get(message.key) if unsendable else None
        if kept is None:
            return False
        partition, error = kept
        if (error.code() != KafkaError._MSG_TIMED_OUT
                or self.patient.probing(message.topic, partition)):
            return False
        self._send(message, batch, partition)  # the partition's probe
        return True

    def _careful(self, message: ReadMessage, batch: Batch,
                 unsendable: Mapping[str, tuple[int, KafkaError]]) -> bool:
        """A row the patient producer has, or one whose earlier attempt may be on the topic."""
        patient = self.patient
        if patient.holds(message.id):
            batch.patient.add(message.key)
            return True
        if message.id not in patient.possibly_appended:
            return False
        partition = (unsendable[message.key][0] if message.key in unsendable
                     else self.topics.partition_of(message.topic, message.key))
        self._send(message, batch, partition)
        return True

    def _send(self, message: ReadMessage, batch: Batch, partition: int) -> None:
        self.patient.send(message, partition)
        batch.patient.add(message.key)

    def await_reports(self, batch: Batch) -> None:
        """A stream batch's rows on the patient producer: waited for while nothing else of the
        batch was delivered (they may be all the batch has to say), up to the delivery timeout
        from the batch's produce; once the rest was delivered, or one of them, a moment more (a
        row still on its way then did not answer while the others did). Their outcomes go into
        the batch's errors (PENDING: still on its way); nothing is taken before the batch is
        recorded (`record`)."""
        if not batch.patient:
            return
        waiting = {m.id for m in batch.read if m.key in batch.patient and not m.held}
        patient = self.patient
        deadline = batch.deadline - FLUSH_MARGIN_S  # the delivery timeout, from the produce
        while not self._stop.is_set():
            reports = [patient.report(i) for i in waiting]
            if all(r is not None for r in reports):
                break
            now = time.monotonic()
            if batch.acked_at is not None and batch.sent > _failed_sent(batch):
                deadline = min(deadline, max(now, batch.acked_at) + FLUSH_SLICE_S)
            elif any(r is not None and r.error is None for r in reports):
                deadline = min(deadline, now + FLUSH_SLICE_S)  # one of them was acknowledged
            if now >= deadline:
                break
            patient.serve(min(FLUSH_SLICE_S, deadline - now))
        for message in batch.read:
            if message.key in batch.patient and not message.held:
                report = patient.report(message.id)
                if report is None:
                    batch.errors[message.key] = PENDING
                    batch.partitions[message.key] = self.topics.partition_of(message.topic,
                                                                             message.key)
                elif report.error is not None:
                    batch.errors[message.key] = report.error
                    batch.partitions[message.key] = report.partition

    def record(self, batch: Batch, reports: Reports, *, stream: bool) -> None:
        """After a batch was recorded: its patient rows' reports (`_take_reports`); the
        rows the relay's producer gave up on while they may have been sent are possibly
        appended from now on (in either lane they go to the patient producer); a partition
        whose rows timed out in the client while the rest of the batch was delivered is late,
        and the delivered rows' partitions vouch for the brokers they waited on
        (outbox.topic_watch keeps back what waits on a late one)."""
        patient = self.patient
        if not (batch.errors or batch.patient or patient.possibly_appended):
            return
        if batch.patient:
            self._take_reports(batch, reports.settled if stream else None)
        if batch.errors:
            self._mark_possibly_appended(batch)
        if not reports.delivered:
            return
        if patient.possibly_appended:
            patient.possibly_appended.difference_update(m.id for m in reports.delivered)
        late: dict[str, set[int]] = {}
        for message, error in reports.deferred:
            if local_timeout(error) and message.key not in batch.unsent:
                late.setdefault(message.topic, set()).add(batch.partitions.get(message.key, -1))
        if late or self.topics.suspecting:  # else no partition of them is needed (murmur2)
            answered: dict[str, set[int]] = {}
            for message in reports.delivered:
                answered.setdefault(message.topic, set()).add(
                    self.topics.partition_of(message.topic, message.key))
            for topic in sorted(late.keys() | answered.keys()):
                self.topics.partitions_late(topic, late.get(topic, ()), answered.get(topic, ()))

    def _mark_possibly_appended(self, batch: Batch) -> None:
        """The rows the relay's producer sent and gave up on while they may have been sent."""
        by_key = {m.key: m for m in batch.read}
        for key, error in batch.errors.items():
            if key not in batch.unsent and key not in batch.patient and possibly_appended(error):
                self.patient.possibly_appended.add(by_key[key].id)

    def _take_reports(self, batch: Batch, settled: int | None) -> None:
        """A stream batch (rows up to `settled` recorded): a recorded row's report is taken
        (one that came within the delivery timeout says its partition answers again), one
        detoured on its way is left to the slow lane, and a failure of a row read again is
        forgotten (it is sent again then), an answer in time of one vouches for its partition's
        brokers all the same. A slow-lane batch (`settled` None): its patient rows'
        reports are the slow lane's (outbox.lanes.SlowLane)."""
        patient = self.patient
        for index, message in enumerate(batch.read):
            if message.key not in batch.patient or message.held:
                continue
            if settled is None:
                patient.to_slow_lane(message.id)
            elif index >= settled:  # read again: a failure is forgotten, an answer kept
                came = patient.report(message.id)
                if came is not None and came.error is not None:
                    patient.take(message.id)
                elif came is not None and came.in_time:  # its brokers answered all the same
                    self.topics.answered_in_time(message.topic, came.partition)
            else:
                report = patient.take(message.id)
                if report is None:
                    patient.to_slow_lane(message.id)
                elif report.error is None and report.in_time:
                    self.topics.answered_in_time(message.topic, report.partition)


def _failed_sent(batch: Batch) -> int:
    """How many rows the relay's producer sent in `batch` got an error report."""
    return sum(1 for key in batch.errors
               if key not in batch.unsent and key not in batch.patient)


class LateRows:
    """What the relay's producer makes of a stream batch's rows that timed out in the client
    (docs/outbox-relay.md, "A slow leader"): whether the cluster answers beside them, and, for a
    batch that delivered nothing, whether their partitions are late all the same."""

    def __init__(self, relay: "RelayProducer", stop: threading.Event) -> None:
        self._relay = relay
        self._stop = stop
        self._delivered_at: float | None = None  # when a batch last had a row delivered

    def delivered(self) -> None:
        """A recorded batch had a row delivered."""
        self._delivered_at = time.monotonic()

    def answers_beside(self, batch: Batch, within: float | None = None) -> bool:
        """Whether the cluster answers now, beside the partitions of the batch's rows that timed
        out in this client: a broker that leads none of them answers a request sent to it
        (TopicWatch.others_answer), else, where none is known, a metadata request
        (RelayProducer.cluster_answers). Not once stop is set: the rows are read again."""
        if self._stop.is_set():
            return False
        timeout_s = self._relay.settings.delivery_timeout.total_seconds() if within is None else within
        late = self._late_partitions(batch)
        found = [self._relay.topics.others_answer(topic, partitions, timeout_s)
                 for topic, partitions in sorted(late.items())]
        if any(found):
            return True
        if found and None not in found:
            return False
        return self._relay.cluster_answers(within)

    def _late_partitions(self, batch: Batch) -> dict[str, set[int]]:
        """The partitions of the rows sent in `batch` that timed out in the client, by topic."""
        by_key = {m.key: m for m in batch.read}
        late: dict[str, set[int]] = {}
        for key, error in batch.errors.items():
            partition = batch.partitions.get(key, -1)
            if key not in batch.unsent and local_timeout(error) and partition >= 0:
                late.setdefault(by_key[key].topic, set()).add(partition)
        return late

    def note_late_alone(self, batch: Batch) -> None:
        """A stream batch that delivered nothing, some of its rows timed out in this client: if
        the cluster answered (a batch was delivered within the delivery timeout before this one
        was produced, or another leader answers within LATE_ALONE_ANSWER_S: `answers_beside`,
        whose request may wait on the slow broker), their partitions are late
        (outbox.topic_watch keeps back whatever waits on the brokers they waited on), so that
        the next batch does not wait out the same broker. The batch stops the stream all the
        same: nothing of it is deferred, so a cluster that answers but takes no record (its
        quorum lost) floods nothing."""
        late = self._late_partitions(batch)
        timeout_s = self._relay.settings.delivery_timeout.total_seconds()
        produced_at = batch.deadline - FLUSH_MARGIN_S - timeout_s
        answered = self._delivered_at is not None and self._delivered_at >= produced_at - timeout_s
        if late and (answered or self.answers_beside(batch, LATE_ALONE_ANSWER_S)):
            for topic, partitions in sorted(late.items()):
                self._relay.topics.partitions_late(topic, partitions)


class KafkaState:
    """What Kafka said of the relay's producer, by its callbacks and its batches: a refusal
    (said once; the relay stops on it, `check_refused`), a fatal error (the producer is
    replaced: `fatal`), a failing connection or a batch released (Kafka's outage log), an
    answer (the connection metric, the outage's end)."""

    def __init__(self, settings: RelaySettings, *, emit: Emit, stop: threading.Event,
                 outage: OutageLog | None = None) -> None:
        self._settings = settings
        self._emit = emit
        self._stop = stop
        # Kafka's outage, said in a few lines (given by the relay, whose topic watch reads it too).
        self.outage = outage or OutageLog(redacting(emit, settings),
                                          interval_s=settings.outage_log_interval.total_seconds())
        self.fatal: KafkaError | None = None
        self.refusal: KafkaError | None = None  # the first refusal: the relay stops on it
        self.all_brokers_went_down = False  # since the patient producer last started

    def on_error(self, error: KafkaError) -> None:
        """librdkafka's error callback: a refusal stops the relay, a fatal error replaces the
        producer (its line is the replacement's), anything else is a failing connection."""
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            metrics.set_connected(False)
            self.all_brokers_went_down = True
        if error.fatal():
            self.fatal = error
        if refused(error):
            self.refuse(error)
            return
        if error.fatal():
            return  # said by the replacement's line ("producer failed fatally")
        if self.refusal is not None and error.code() == KafkaError._ALL_BROKERS_DOWN:
            return  # the refusal's consequence, already said
        self.outage.failed(describe(error))

    def refuse(self, error: KafkaError) -> None:
        """The broker refused the relay: said once; the relay stops (check_refused)."""
        if self.refusal is None:
            self.refusal = error
            self._emit(logging.ERROR, "kafka refused the relay", {"error": describe(error)})

    def on_statistics(self, text: str) -> None:
        """librdkafka's statistics: the metrics, and a broker up means Kafka answers again."""
        stats = parse_statistics(text)
        metrics.observe_statistics(stats)
        if stats.any_broker_up:
            self.reached_kafka()

    def reached_kafka(self) -> None:
        metrics.set_connected(True)
        self.outage.restored()

    def batch_recorded(self, *, published: int, released: int,
                       first_unavailable: KafkaError | None) -> None:
        """What a recorded batch says of Kafka: a delivery, that it answers; rows released, that
        it did not (the outage log), or that the shutdown grace ran out at stop; nothing more
        once the broker refused the relay (its line says it all)."""
        if published:
            self.reached_kafka()
        if released and self.refusal is None:
            error_text = describe(first_unavailable) if first_unavailable else "no report"
            if self._stop.is_set():  # the shutdown grace ran out, not necessarily the broker
                self._emit(logging.WARNING, "messages released at stop",
                           {"released": released, "error": error_text})
            else:
                self.outage.failed(error_text, released=released)

    def check_refused(self) -> None:
        """Raise KafkaRefusedError once the broker refused the credentials or the handshake."""
        if self.refusal is not None:
            raise refusal(self.refusal, self._settings)


def _reporter(batch: Batch, state: KafkaState, topics: Topics) -> Callable[..., None]:
    """The delivery callback of `batch`'s rows: each error lands in the batch under its row's
    key, with its partition, and is told to the topic watch."""
    errors, partitions, partition_failed = batch.errors, batch.partitions, topics.partition_failed

    def failed(error: KafkaError | None, record: Any) -> None:
        if error is None:  # only errors are reported (delivery.report.only.error)
            return
        if refused(error):  # not allowed to write the topic: the relay stops (exit 4)
            state.refuse(error)  # and the row, with no report, is read again
            return
        if error.code() in PRODUCER_STATE_CODES and not error.fatal():
            # A broker that forgot this producer (or gave its id to the patient one, Tansu
            # after a restart) fences every message of it: replace it.
            state.fatal = state.fatal or error
        key = record.key().decode()
        errors[key] = error
        partition = record.partition()  # None while none was assigned
        partitions[key] = -1 if partition is None else partition
        partition_failed(record.topic(), partitions[key], error)

    return failed


class RelayProducer:
    """One relay's producer: what Kafka said is its KafkaState's, patient rows its PatientRoute's."""

    def __init__(self, settings: RelaySettings, client_id: str, *, emit: Emit,
                 stop: threading.Event, topics: Topics | None = None,
                 outage: OutageLog | None = None) -> None:
        self.settings = settings
        self.client_id = client_id
        self._emit = emit
        self._stop = stop
        self.topics: Topics = topics or EveryPartitionAble()
        self._producer: Producer | None = None
        self._stop_seen_at: float | None = None
        # Batches handed to the current producer and not acknowledged yet, oldest first.
        self._unacked: list[Batch] = []
        self.patient = PatientProducer(settings, client_id, emit=emit)
        self.route = PatientRoute(self.patient, self.topics, stop)
        self.state = KafkaState(settings, emit=emit, stop=stop, outage=outage)
        self.outage = self.state.outage
        self.late = LateRows(self, stop)

    @property
    def producer(self) -> Producer:
        if self._producer is None or self.state.fatal is not None:
            if self.state.fatal is not None:
                self._emit(logging.ERROR, "producer failed fatally, starting a new one",
                           {"error": describe(self.state.fatal)})
                if self._producer is not None:
                    self._drop(self._producer)
                    self.patient.restart()
            self.state.fatal = None
            self._producer = kafka.new_producer(self.settings, self.client_id,
                                                self.state.on_error, self.state.on_statistics)
        return self._producer

    @property
    def refused(self) -> bool:
        return self.state.refusal is not None

    def batch_recorded(self, *, published: int, released: int,
                       first_unavailable: KafkaError | None) -> None:
        """What a recorded batch says of Kafka (KafkaState.batch_recorded)."""
        if published:
            self.late.delivered()
        self.state.batch_recorded(published=published, released=released,
                                  first_unavailable=first_unavailable)

    def _poll(self, producer: Producer, timeout: float) -> bool:
        """Serve callbacks; False if the producer failed fatally (UNKNOWN_PRODUCER_ID...)."""
        return self._unless_fatal(producer.poll, timeout) is not None

    def _flush(self, producer: Producer, timeout: float) -> int | None:
        """Serve callbacks until nothing is in flight or unreported, up to `timeout`: how many
        messages are left, None if the producer failed fatally."""
        return self._unless_fatal(producer.flush, timeout)

    def _unless_fatal(self, serve: Callable[[float], int], timeout: float) -> int | None:
        """`serve(timeout)` (poll or flush); None if it raised the producer's fatal error."""
        try:
            return serve(timeout)
        except KafkaException as exc:
            error = exc.args[0]
            if not (isinstance(error, KafkaError) and error.fatal()):
                raise
            self.state.fatal = self.state.fatal or error
            if refused(error):  # a principal that may not produce: no new producer may either
                self.state.refuse(error)
            return None

    def _drop(self, producer: Producer) -> None:
        """Purge a failed producer: its messages get their (failed) reports, nothing lingers;
        none of its batches is acknowledged from then on."""
        with contextlib.suppress(KafkaException):  # a failed producer may refuse; reports come
            producer.purge(in_queue=True, in_flight=True, blocking=False)
        self._poll(producer, 0)
        self._unacked = [b for b in self._unacked if b.producer is not producer]

    def connect(self) -> None:
        """Start the producer now, so a refusal shows before any event; and the patient one,
        anew after every broker went down (a broker restarted may not know its id)."""
        self._poll(self.producer, 0)
        self.state.check_refused()
        if self.state.all_brokers_went_down:
            self.state.all_brokers_went_down = False
            self.patient.restart()
        self.patient.start()

    def check_broker(self) -> bool:
        """Ask the broker for its metadata, up to the delivery timeout: True if it answered;
        a refusal (credentials, TLS handshake) raises KafkaRefusedError."""
        failure = self._ask_metadata()
        self.state.check_refused()
        if failure is not None:
            self.outage.failed(describe(failure.args[0]) if failure.args else str(failure))
            return False
        self.state.reached_kafka()
        return True

    def cluster_answers(self, within: float | None = None) -> bool:
        """Whether a broker answers a metadata request now, up to `within` seconds (the delivery
        timeout by default; LateRows asks it). Not once stop is set: the rows are read again."""
        return not self._stop.is_set() and self._ask_metadata(within) is None

    def _ask_metadata(self, within: float | None = None) -> KafkaException | None:
        """A metadata request, up to `within` seconds (the delivery timeout by default): None
        if a broker answered, else the failure (classified by the error callback, served after
        it). Asked again after slices that double, the callbacks served between: a refusal ends
        the wait early, a slow broker still gets the whole timeout."""
        producer = self.producer
        deadline = time.monotonic() + (self.settings.delivery_timeout.total_seconds()
                                       if within is None else within)
        slice_s = METADATA_SLICE_S
        while True:
            try:
                producer.list_topics(timeout=max(0.0, min(slice_s, deadline - time.monotonic())))
            except KafkaException as exc:
                failure = exc
            else:
                return None
            finally:
                self._poll(producer, 0)
            if self.state.refusal is not None or time.monotonic() >= deadline:
                return failure
            slice_s *= 2

    def _produce(self, producer: Producer, message: ReadMessage,
                 errors: dict[str, KafkaError], failed: Callable[..., None]) -> None:
        """Hand one row to the producer; an error reported for it lands in `errors` under its
        key (a batch has one row per key), through the batch's one `failed` callback."""
        headers: Any = orjson.loads(message.headers)
        recorded = False
        while True:
            try:
                producer.produce(message.topic, message.payload, message.key, headers=headers,
                                 timestamp=message.timestamp_ms, on_delivery=failed)
                return
            except BufferError:
                if not self._poll(producer, 0.05):  # the local queue is full: let it drain
                    errors[message.key] = self.state.fatal or KafkaError(KafkaError._FATAL)
                    return
            except TypeError:
                if recorded:
                    raise
                headers, recorded = kafka.record_headers(headers), True  # another JSON type
            except KafkaException as exc:
                error = exc.args[0]
                if isinstance(error, KafkaError) and error.fatal():
                    self.state.fatal = self.state.fatal or error
                errors[message.key] = error
                return

    def produce_batch(self, read: Read, start: Position | None = None) -> Batch:
        """Hand a batch's rows to the producer (a held stream row is not sent, nor a row whose
        topic is not on OUTBOX_TOPICS: that one is parked, and its topic never looked at; nor a
        row its partition cannot take now, by the topic's metadata: that one gets its error at
        once; a row whose earlier attempt may be on the topic, and the probe of a partition that
        did not answer in time, go to the patient producer)."""
        allowed = self.settings.topics
        off_topics = {m.key for m in read.messages if m.topic not in allowed}
        unsendable = self.topics.admit([m for m in read.messages if m.key not in off_topics]
                                       if off_topics else read.messages)
        producer = self.producer
        deadline = (time.monotonic() + self.settings.delivery_timeout.total_seconds()
                    + FLUSH_MARGIN_S)
        batch = Batch(read.messages, read.read_at, 0, {}, deadline, producer, start)
        errors, partitions = batch.errors, batch.partitions
        failed = _reporter(batch, self.state, self.topics)
        produce, loads = producer.produce, orjson.loads
        careful = self.patient.busy  # rows the patient producer has, or must have
        for message in batch.read:
            if message.held:
                continue
            if off_topics and message.key in off_topics:
                batch.off_allowlist[message.key] = off_allowlist_error(message.topic, allowed)
                continue
            if (careful or unsendable) and self.route.takes(message, batch, unsendable,
                                                            careful=careful):
                continue
            if unsendable and message.key in unsendable:
                partitions[message.key], errors[message.key] = unsendable[message.key]
                batch.unsent.add(message.key)
                continue
            batch.sent += 1
            try:
                produce(message.topic, message.payload, message.key,
                        headers=loads(message.headers), timestamp=message.timestamp_ms,
                        on_delivery=failed)
            except (BufferError, TypeError, KafkaException):  # not handed over: the careful way
                self._produce(producer, message, errors, failed)
        if batch.unsent:  # not a pass over every row of the usual batch
            batch.unsent_open = all(self.topics.sends_to_some(topic) for topic in
                                    {m.topic for m in batch.read if m.key in batch.unsent})
        self._unacked.append(batch)
        self._poll(producer, 0)
        self._emit(logging.DEBUG, "batch produced",
                   {"produced": batch.sent, "lane": "slow" if start is None else "stream"})
        return batch

    def await_batch(self, batch: Batch) -> None:
        """Wait until the producer has nothing in flight or unreported after the batch (later
        batches' messages are waited for too): `batch.acked_at` is set then. Up to the delivery
        timeout, or the shutdown grace once stop is set; a refused, fatally failed or replaced
        producer is purged instead (no acknowledgement will come from it)."""
        producer, deadline = batch.producer, batch.deadline
        while batch.acked_at is None:
            now = time.monotonic()
            if self._stop.is_set():
                if self._stop_seen_at is None:
                    self._stop_seen_at = now
                deadline = min(deadline,
                               self._stop_seen_at + self.settings.shutdown_grace.total_seconds())
            failed = (self.state.refusal is not None or self.state.fatal is not None
                      or producer is not self._producer
                      or not any(b is batch for b in self._unacked))
            if now >= deadline or failed:
                # Whatever is still in flight is released, and delivered again later if need be.
                self._drop(producer)
                return
            left = self._flush(producer, min(FLUSH_SLICE_S, deadline - now))
            if left == 0 and self.state.fatal is None and self.state.refusal is None:
                self._acknowledged(producer, time.monotonic())

    def _acknowledged(self, producer: Producer, now: float) -> None:
        """`producer` has nothing in flight or unreported: every batch handed to it so far is
        acknowledged (each of its rows without an error report was delivered)."""
        for batch in self._unacked:
            if batch.producer is producer:
                batch.acked_at = now
        self._unacked = [b for b in self._unacked if b.producer is not producer]

    def close(self) -> None:
        """Let the producer finish (nothing is in flight between batches) and drop it; the
        patient producer gets the shutdown grace for what it has on its way."""
        self.patient.close(self.settings.shutdown_grace.total_seconds())
        if self.state.fatal is not None and self.state.refusal is None:  # no replacement said it
            self._emit(logging.ERROR, "producer failed fatally", {"error": describe(self.state.fatal)})
            self.state.fatal = None
        if self._producer is not None:
            try:
                self._producer.flush(self.settings.shutdown_grace.total_seconds())
            except KafkaException:
                self._drop(self._producer)  # failed fatally: nothing left to wait for
            self._producer = None

