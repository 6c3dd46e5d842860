"""RelayProducer's acknowledgement rules with a fake producer (docs/outbox-relay.md, "Why nothing
is recorded before its acknowledgement"): a batch is acknowledged only when `flush` comes back
with nothing in flight or unreported on the producer that has it, and then every batch that
producer still had (`_unacked`) is; a batch whose wait ended otherwise (its deadline, the stop's
grace, a refusal, a fatal error, a replaced producer) is purged (`_drop`) and never acknowledged
later, by any producer. Error reports land in their batch by key, with their partition."""

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from outbox.config import RelaySettings
from outbox.kafka import KafkaRefusedError
from outbox.producer import Batch, EveryPartitionAble, RelayProducer, sort_reports
from outbox.store import Read, ReadMessage

Report = Callable[[KafkaError | None, Any], None]


class Clock:
    """The relay's monotonic clock, moved on by the fake producer's waits only."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class Record:
    """What a delivery report carries about its message."""

    def __init__(self, key: str, partition: int) -> None:
        self._key, self._partition = key, partition

    def key(self) -> bytes:
        return self._key.encode()

    def partition(self) -> int | None:
        return None if self._partition < 0 else self._partition  # as confluent-kafka says -1

    def topic(self) -> str:
        return "topic"


class FakeProducer:
    """librdkafka's producer as the relay uses it: messages stay in flight until the test
    acknowledges or fails them; `flush` serves the reports due and returns what is left (or
    raises what the test set), moving the clock on by its timeout when something is left."""

    def __init__(self, clock: Clock, on_error: Callable[[KafkaError], None]) -> None:
        self.clock = clock
        self.on_error = on_error
        self.in_flight: dict[str, Report] = {}
        self.reports: list[tuple[Report, KafkaError | None, Record]] = []
        self.acknowledging = True  # flush acknowledges everything in flight
        self.raises: KafkaException | None = None
        self.error_in_flush: KafkaError | None = None  # said by the error callback in a flush
        self.purged = 0
        self.flushes = 0

    def produce(self, topic: str, value: str, key: str, *, headers: Any, timestamp: int,
                on_delivery: Report) -> None:
        self.in_flight[key] = on_delivery

    def fail(self, key: str, error: KafkaError, partition: int = 0) -> None:
        """The broker's (or librdkafka's) error for `key`: reported at the next poll or flush."""
        self.reports.append((self.in_flight.pop(key), error, Record(key, partition)))

    def _serve(self) -> None:
        reports, self.reports = self.reports, []
        for report, error, record in reports:
            report(error, record)

    def poll(self, timeout: float) -> int:
        self._serve()
        return 0

    def flush(self, timeout: float) -> int:
        self.flushes += 1
        if self.raises is not None:
            raise self.raises
        self._serve()
        if self.error_in_flush is not None:
            self.on_error(self.error_in_flush)
        if self.acknowledging:
            self.in_flight.clear()  # acknowledged: no report (delivery.report.only.error)
        left = len(self.in_flight)
        if left:
            self.clock.now += timeout
        return left

    def purge(self, *, in_queue: bool, in_flight: bool, blocking: bool) -> None:
        self.purged += 1
        for key in list(self.in_flight):
            self.fail(key, KafkaError(KafkaError._PURGE_INFLIGHT))

    def __len__(self) -> int:
        return len(self.in_flight) + len(self.reports)


class Harness:
    def __init__(self, relay: RelayProducer, made: list[FakeProducer], clock: Clock,
                 stop: threading.Event) -> None:
        self.relay, self.made, self.clock, self.stop = relay, made, clock, stop

    @property
    def fake(self) -> FakeProducer:
        return self.made[-1]

    def batch(self, *keys: str) -> Batch:
        rows = [ReadMessage(str(n), n, f"id-{key}", "topic", key, "{}", "{}", 0, 0.0, False, 0)
                for n, key in enumerate(keys)]
        return self.relay.produce_batch(Read(rows, self.clock.now), ("0", 0))


DELIVERY_TIMEOUT_S = 30.0
GRACE_S = 2.0


@pytest.fixture
def harness(monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    clock = Clock()
    monkeypatch.setattr("outbox.producer.time", SimpleNamespace(monotonic=clock.monotonic))
    made: list[FakeProducer] = []

    def new_producer(settings: RelaySettings, client_id: str, on_error: Any = None,
                     on_statistics: Any = None) -> FakeProducer:
        made.append(FakeProducer(clock, on_error))
        return made[-1]

    monkeypatch.setattr("outbox.kafka.new_producer", new_producer)
    stop = threading.Event()
    settings = RelaySettings(bootstrap_servers="fake:9092",
                             delivery_timeout=timedelta(seconds=DELIVERY_TIMEOUT_S),
                             shutdown_grace=timedelta(seconds=GRACE_S),
                             topics=frozenset({"topic"}))
    relay = RelayProducer(settings, "relay-test", emit=lambda *_args: None, stop=stop)
    yield Harness(relay, made, clock, stop)


def test_flush_back_to_zero_acknowledges_every_batch_the_producer_has_at_that_moment(
    harness: Harness,
) -> None:
    first, second = harness.batch("a", "b"), harness.batch("c")

    harness.relay.await_batch(first)

    assert first.acked_at == harness.clock.now and second.acked_at == harness.clock.now
    flushes = harness.fake.flushes
    harness.relay.await_batch(second)  # acknowledged already: no wait
    assert harness.fake.flushes == flushes and harness.relay._unacked == []


def test_an_error_report_lands_in_its_batch_by_key_with_its_partition(harness: Harness) -> None:
    first, second = harness.batch("a", "b"), harness.batch("c", "d")
    timed_out = KafkaError(KafkaError._MSG_TIMED_OUT)
    harness.fake.fail("d", timed_out, partition=4)

    harness.relay.await_batch(first)

    assert first.errors == {} and first.partitions == {}
    assert second.errors == {"d": timed_out} and second.partitions == {"d": 4}
    assert second.acked_at is not None  # "c" was acknowledged; "d" has its error
    unassigned = harness.batch("e")
    harness.fake.fail("e", timed_out, partition=-1)  # timed out before it had a partition
    harness.relay.await_batch(unassigned)
    assert unassigned.partitions == {"e": -1}


def test_a_batch_past_its_deadline_is_purged_and_no_later_flush_acknowledges_it(
    harness: Harness,
) -> None:
    first, second = harness.batch("a"), harness.batch("b")
    harness.fake.acknowledging = False

    harness.relay.await_batch(first)

    assert first.acked_at is None and harness.fake.purged == 1
    assert harness.clock.now >= first.deadline
    assert first.errors["a"].code() == KafkaError._PURGE_INFLIGHT
    harness.relay.await_batch(second)  # dropped with the purge: nothing to wait for
    assert second.acked_at is None
    harness.fake.acknowledging = True
    third = harness.batch("c")
    harness.relay.await_batch(third)
    assert third.acked_at is not None and first.acked_at is None and second.acked_at is None


def test_a_stop_waits_the_shutdown_grace_not_the_delivery_timeout(harness: Harness) -> None:
    batch = harness.batch("a")
    harness.fake.acknowledging = False
    started = harness.clock.now
    harness.stop.set()

    harness.relay.await_batch(batch)

    assert batch.acked_at is None and harness.fake.purged == 1
    assert GRACE_S <= harness.clock.now - started < DELIVERY_TIMEOUT_S


def test_a_refusal_ends_the_wait_without_an_acknowledgement(harness: Harness) -> None:
    batch = harness.batch("a")
    harness.fake.on_error(KafkaError(KafkaError._AUTHENTICATION))

    harness.relay.await_batch(batch)  # flush would come back empty: the refusal comes first

    assert batch.acked_at is None and harness.fake.purged == 1 and harness.fake.flushes == 0


def test_a_flush_that_raises_the_fatal_error_is_no_acknowledgement(harness: Harness) -> None:
    batch = harness.batch("a")
    harness.fake.raises = KafkaException(KafkaError(KafkaError.UNKNOWN_PRODUCER_ID, fatal=True))

    harness.relay.await_batch(batch)

    assert batch.acked_at is None and harness.fake.purged == 1


def test_a_fatal_error_said_during_a_flush_that_comes_back_empty_is_no_acknowledgement(
    harness: Harness,
) -> None:
    batch = harness.batch("a")
    harness.fake.error_in_flush = KafkaError(KafkaError._FATAL, fatal=True)

    harness.relay.await_batch(batch)

    assert batch.acked_at is None and harness.fake.purged == 1


def test_a_replaced_producers_batches_are_never_acknowledged_by_its_replacement(
    harness: Harness,
) -> None:
    old_batch = harness.batch("a")
    old = harness.fake
    old.acknowledging = False
    old.on_error(KafkaError(KafkaError._FATAL, fatal=True))

    new_batch = harness.batch("b")  # a new producer takes over; the old one is purged

    assert harness.fake is not old and old.purged == 1
    harness.relay.await_batch(new_batch)
    harness.relay.await_batch(old_batch)
    assert new_batch.acked_at is not None and old_batch.acked_at is None
    assert old_batch.errors["a"].code() == KafkaError._PURGE_INFLIGHT


def test_the_barrier_on_one_producer_does_not_acknowledge_a_batch_of_another(
    harness: Harness,
) -> None:
    old_batch = harness.batch("a")
    harness.relay.state.fatal = KafkaError(KafkaError._FATAL, fatal=True)
    harness.made[0].purge = lambda **_kwargs: None  # type: ignore[method-assign]
    new_batch = harness.batch("b")  # the old producer is dropped, and keeps "a" in flight

    harness.relay._unacked.append(old_batch)  # as if the drop had kept it
    harness.relay._acknowledged(harness.fake, harness.clock.now)

    assert new_batch.acked_at is not None and old_batch.acked_at is None
    assert harness.relay._unacked == [old_batch]


def _said(stop: threading.Event) -> tuple[RelayProducer, list[tuple[str, dict[str, Any]]]]:
    lines: list[tuple[str, dict[str, Any]]] = []
    relay = RelayProducer(RelaySettings(bootstrap_servers="fake:9092"), "relay-test",
                          emit=lambda _level, event, fields: lines.append((event, fields)),
                          stop=stop)
    return relay, lines


def test_a_recorded_batch_with_released_rows_is_an_outage_and_one_delivered_ends_it() -> None:
    relay, _lines = _said(threading.Event())
    unavailable = KafkaError(KafkaError._ALL_BROKERS_DOWN)
    relay.batch_recorded(published=0, released=3, first_unavailable=unavailable)
    assert relay.outage.failing
    relay.batch_recorded(published=1, released=0, first_unavailable=None)
    assert not relay.outage.failing


def test_rows_released_at_stop_are_said_as_such_not_as_an_outage() -> None:
    stop = threading.Event()
    stop.set()
    relay, lines = _said(stop)
    relay.batch_recorded(published=0, released=2, first_unavailable=None)
    assert not relay.outage.failing
    assert lines == [("messages released at stop", {"released": 2, "error": "no report"})]


def test_rows_released_after_a_refusal_add_nothing_to_the_refusal_line() -> None:
    relay, lines = _said(threading.Event())
    relay.state.on_error(KafkaError(KafkaError._AUTHENTICATION))
    relay.batch_recorded(published=0, released=4, first_unavailable=None)
    assert not relay.outage.failing
    assert [event for event, _fields in lines] == ["kafka refused the relay"]


def test_a_row_the_topic_watch_finds_unsendable_is_not_produced_and_gets_its_error_at_once(
    harness: Harness,
) -> None:
    no_leader = KafkaError(KafkaError.LEADER_NOT_AVAILABLE, "not sent: the metadata shows no leader")

    class Topics(EveryPartitionAble):
        def admit(self, messages: list[ReadMessage]) -> dict[str, tuple[int, KafkaError]]:
            return {r.key: (2, no_leader) for r in messages if r.key == "b"}

    harness.relay.topics = Topics()

    batch = harness.batch("a", "b")

    assert set(harness.fake.in_flight) == {"a"} and batch.sent == 1
    assert batch.errors == {"b": no_leader} and batch.partitions == {"b": 2}
    assert batch.unsent == {"b"}
    harness.relay.await_batch(batch)
    assert batch.acked_at is not None  # nothing of "b" is awaited


def test_a_row_whose_topic_is_off_the_allowlist_is_neither_produced_nor_looked_at(
    harness: Harness,
) -> None:
    """OUTBOX_TOPICS: a row naming another topic is set apart, never handed to the producer
    nor to the topic watch (no metadata request for it), and sorted apart in its place."""
    looked: list[str] = []

    class Topics(EveryPartitionAble):
        def admit(self, messages: list[ReadMessage]) -> dict[str, tuple[int, KafkaError]]:
            looked.extend(m.topic for m in messages)
            return {}

    harness.relay.topics = Topics()
    rows = [ReadMessage(str(n), n, f"id-{key}", topic, key, "{}", "{}", 0, 0.0, held, 0)
            for n, (key, topic, held) in enumerate(
                [("a", "topic", False), ("b", "elsewhere", False), ("c", "elsewhere", True)])]

    batch = harness.relay.produce_batch(Read(rows, harness.clock.now), ("0", 0))
    harness.relay.await_batch(batch)
    reports = sort_reports(batch.read, batch.errors, acked_at=batch.acked_at,
                           read_at=batch.read_at, stop_at_unavailable=True,
                           off_allowlist=batch.off_allowlist)

    assert set(harness.fake.in_flight) == set() and batch.sent == 1
    assert looked == ["topic"]
    why = "topic 'elsewhere' is not on OUTBOX_TOPICS (topic): never sent, parked"
    assert batch.off_allowlist == {"b": why}
    assert reports.settled == 3 and [m.key for m in reports.delivered] == ["a"]
    assert [(m.key, reason) for m, reason in reports.off_allowlist] == [("b", why)]
    assert [(m.key, error) for m, error in reports.detoured] == [("c", None)]  # held: behind


def test_every_error_report_is_told_to_the_topic_watch_with_its_partition(
    harness: Harness,
) -> None:
    told: list[tuple[str, int, int]] = []

    class Topics(EveryPartitionAble):
        def partition_failed(self, topic: str, partition: int, error: KafkaError) -> None:
            told.append((topic, partition, error.code()))

    harness.relay.topics = Topics()
    batch = harness.batch("a", "b")
    harness.fake.fail("b", KafkaError(KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND), partition=3)

    harness.relay.await_batch(batch)

    assert told == [("topic", 3, KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND)]


def test_a_topic_the_principal_may_not_write_refuses_the_relay_and_its_row_is_read_again(
    harness: Harness,
) -> None:
    """TOPIC_AUTHORIZATION_FAILED in a delivery report (the principal has its producer id, from
    Write on some other topic, but may not write this one): the relay stops, exit 4, in one
    line; the row gets no error of its own, so it is read again, not refused and parked."""
    batch = harness.batch("a", "b")
    harness.fake.fail("b", KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), partition=3)

    harness.relay.await_batch(batch)

    assert harness.relay.refused and batch.acked_at is None and "b" not in batch.errors
    with pytest.raises(KafkaRefusedError, match="TOPIC_AUTHORIZATION_FAILED"):
        harness.relay.state.check_refused()
