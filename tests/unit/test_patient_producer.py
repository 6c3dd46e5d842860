"""The patient producer's bookkeeping (outbox/producer.py), with a fake librdkafka producer: a
row is sent once whatever the lanes ask, its report waits by row id for the lane that records
it, an answer in time is told apart from a late one, and a producer whose messages are refused
for its state (PRODUCER_FENCED, ...) is replaced, what it had on its way reported purged."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from confluent_kafka import KafkaError

from outbox.config import RelaySettings
from outbox.producer import PatientProducer
from outbox.store import ReadMessage

SETTINGS = RelaySettings(bootstrap_servers="fake:9092", delivery_timeout=timedelta(seconds=2))


class Record:
    def __init__(self, partition: int, latency: float) -> None:
        self._partition, self._latency = partition, latency

    def partition(self) -> int:
        return self._partition

    def latency(self) -> float:
        return self._latency


class FakeProducer:
    """Keeps what was produced; `answer(key, ...)` serves its report at the next poll."""

    made: list["FakeProducer"] = []

    def __init__(self) -> None:
        self.produced: dict[str, Callable[[KafkaError | None, Any], None]] = {}
        self.due: list[tuple[Callable[..., None], KafkaError | None, Record]] = []
        self.purged = False
        FakeProducer.made.append(self)

    def produce(self, topic: str, value: str, key: str, *, headers: Any, timestamp: int,
                on_delivery: Callable[[KafkaError | None, Any], None]) -> None:
        self.produced[key] = on_delivery

    def answer(self, key: str, error: KafkaError | None = None, *, partition: int = 3,
               latency: float = 0.1) -> None:
        self.due.append((self.produced[key], error, Record(partition, latency)))

    def poll(self, _timeout: float) -> int:
        due, self.due = self.due, []
        for callback, error, record in due:
            callback(error, record)
        return len(due)

    def purge(self, **_flags: bool) -> None:
        self.purged = True

    def flush(self, _timeout: float) -> int:
        return 0


def row(n: int) -> ReadMessage:
    return ReadMessage(txid="1", seq=n, id=f"id-{n}", topic="t", key=f"k{n}", payload="{}",
                       headers='{"message_id": "m"}', timestamp_ms=0, clock_s=0.0, held=False,
                       attempts=0)


def patient() -> PatientProducer:
    FakeProducer.made = []
    return PatientProducer(SETTINGS, "relay-t", emit=lambda *_: None,
                           new_producer=lambda *_args: FakeProducer())


def test_a_row_is_sent_once_and_its_report_waits_for_the_lane_that_records_it() -> None:
    p = patient()
    p.send(row(1), 3)
    p.send(row(1), 3)  # the other lane meets it again: not sent twice
    [fake] = FakeProducer.made
    assert list(fake.produced) == ["k1"] and p.holds("id-1") and p.probing("t", 3)

    fake.answer("k1", latency=0.5)
    p.serve()

    report = p.report("id-1")
    assert report is not None and report.error is None and report.in_time
    assert p.holds("id-1") and not p.probing("t", 3)
    assert p.take("id-1") == report and not p.holds("id-1")


def test_an_answer_later_than_the_delivery_timeout_is_not_in_time() -> None:
    p = patient()
    p.send(row(1), 3)
    FakeProducer.made[0].answer("k1", latency=2.5)
    p.serve()
    report = p.report("id-1")
    assert report is not None and report.error is None and not report.in_time


def test_the_slow_lane_takes_only_the_reports_of_rows_handed_to_it() -> None:
    p = patient()
    p.send(row(1), 3)
    p.send(row(2), 4)
    p.to_slow_lane("id-2")
    fake = FakeProducer.made[0]
    fake.answer("k1")
    fake.answer("k2", KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), partition=4)
    p.serve()

    [taken] = p.slow_lane_reports()
    assert taken.message.id == "id-2" and taken.error is not None and taken.partition == 4
    assert p.report("id-1") is not None  # the stream's, left for it


def test_a_producer_refused_for_its_state_is_replaced_and_its_rows_reported_purged() -> None:
    p = patient()
    p.send(row(1), 3)
    p.send(row(2), 4)
    first = FakeProducer.made[0]
    first.answer("k1", KafkaError(KafkaError.PRODUCER_FENCED))
    p.serve()

    assert first.purged
    fenced, purged = p.report("id-1"), p.report("id-2")
    assert fenced is not None and fenced.error is not None
    assert fenced.error.code() == KafkaError.PRODUCER_FENCED
    assert purged is not None and purged.error is not None
    assert purged.error.code() == KafkaError._PURGE_INFLIGHT
    p.take("id-1")
    p.send(row(1), 3)  # sent again, by a new producer
    assert len(FakeProducer.made) == 2 and list(FakeProducer.made[1].produced) == ["k1"]


def test_a_delivered_row_is_no_longer_possibly_appended() -> None:
    p = patient()
    p.possibly_appended.update({"id-1", "id-2"})
    p.send(row(1), 3)
    FakeProducer.made[0].answer("k1")
    p.serve()
    p.take("id-1")
    assert p.possibly_appended == {"id-2"}
