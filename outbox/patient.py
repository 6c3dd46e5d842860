"""The patient producer (docs/outbox-relay.md, "Copies"): rows whose earlier attempt may already
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
the slow lane for a row it holds (one the stream detoured while it was still on its way)."""

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import KafkaError, KafkaException, Producer

from outbox import kafka
from outbox.config import Emit, RelaySettings
from outbox.kafka import PRODUCER_STATE_CODES, describe
from outbox.store import ReadMessage


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

