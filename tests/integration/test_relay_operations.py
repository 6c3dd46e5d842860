"""What an operator sees of the relay, in process on librdkafka's mock cluster: a broker outage
in a few log lines, and the relay's metrics (connected, delivery latency, librdkafka's
statistics)."""

import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from prometheus_client import REGISTRY

from devtools.mock_kafka import MockKafkaCluster
from outbox import metrics
from outbox.kafka import FAILING, RESTORED, STILL_FAILING
from outbox.relay import Relay
from tests.support.ledger import database_now
from tests.support.relay_support import (
    RelayThread,
    as_relay,
    insert_outbox,
    relay_settings,
    unpublished_count,
    wait_for,
)

RELAY_LOGGERS = ("outbox.relay", "outbox.kafka")


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


@pytest.fixture(autouse=True)
def _relay_metrics() -> None:
    metrics.install_relay_metrics()  # as publish_outbox --loop does before serving them


class Lines(logging.Handler):
    """The relay's log records, in order."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def events(self, level: int = logging.INFO) -> list[str]:
        return [r.getMessage() for r in list(self.records) if r.levelno >= level]


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    loggers = [logging.getLogger(name) for name in RELAY_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    yield handler
    for lg, level in zip(loggers, levels, strict=True):
        lg.removeHandler(handler)
        lg.setLevel(level)


def test_an_outage_is_one_line_then_a_summary_per_interval_then_one_line_when_back(
    transactional_db: None, kafka: MockKafkaCluster, lines: Lines
) -> None:
    for n in range(3):
        insert_outbox(f"owner-{n}", created_at=datetime.now(UTC))
    kafka.set_down()
    settings = relay_settings(kafka.bootstrap_servers, delivery_timeout=timedelta(seconds=1),
                              outage_log_interval=timedelta(seconds=2))
    relay = RelayThread(settings)
    relay.start()
    try:
        wait_for(lambda: FAILING in lines.events(), timeout=30, what="the outage's first line")
        wait_for(lambda: sample("profile_outbox_broker_connected") == 0, timeout=30,
                 what="all brokers down to show")
        # The window this test is about: two summaries logged, and the relay tried and released
        # its batch more than once meanwhile (each a delivery timeout and a back-off apart: how
        # many fit in two intervals depends on the machine's load, so it is waited for).
        wait_for(lambda: lines.events().count(STILL_FAILING) >= 2
                 and relay.relay.stats.batches >= 2, timeout=60,
                 what="two summaries and a second failed batch")
        during = [r for r in list(lines.records) if r.levelno >= logging.INFO]
        batches_tried = relay.relay.stats.batches
        kafka.set_up()
        wait_for(lambda: unpublished_count() == 0, timeout=60, what="every row published")
        wait_for(lambda: RESTORED in lines.events(), timeout=30, what="the recovery line")
    finally:
        relay.stop_and_join()

    said = [r.getMessage() for r in during]
    assert said.count(FAILING) == 1
    # The first failure, then summaries at most one per interval (however many intervals the
    # wait took), and at most the start and a fatal error besides; each failed batch was a
    # released batch and a back-off, each reconnect a librdkafka error, and none has a line.
    outage_lines = [r.created for r in during if r.getMessage() in (FAILING, STILL_FAILING)]
    assert said.count(STILL_FAILING) >= 2
    interval_s = settings.outage_log_interval.total_seconds()
    assert all(later - earlier >= interval_s - 0.1
               for earlier, later in pairwise(outage_lines)), outage_lines
    assert len([s for s in said if s not in (FAILING, STILL_FAILING)]) <= 3, said
    assert not [r for r in lines.records if r.name == "outbox.kafka" and "FAIL" in r.getMessage()]
    events = lines.events()
    assert events.count(RESTORED) == 1
    restored = next(r for r in lines.records if r.getMessage() == RESTORED)
    assert restored.levelno == logging.INFO
    assert restored.fields["failures"] >= batches_tried  # type: ignore[attr-defined]
    assert sample("profile_outbox_broker_connected") == 1


def test_delivery_latency_runs_from_created_at_to_the_acknowledgement(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    count_before = sample("profile_outbox_delivery_latency_seconds_count") or 0.0
    sum_before = sample("profile_outbox_delivery_latency_seconds_sum") or 0.0
    under_a_minute = sample("profile_outbox_delivery_latency_seconds_bucket", le="60.0") or 0.0
    # Ninety seconds old on the database's clock, which stamps created_at (the relay's own wall
    # clock plays no part: the age comes from the database, the rest from a monotonic clock).
    written = database_now() - timedelta(seconds=90)
    for n in range(4):
        insert_outbox(f"owner-{uuid.uuid4()}", created_at=written + timedelta(milliseconds=n))
    metrics.set_connected(False)

    with as_relay():
        stats = Relay(relay_settings(kafka.bootstrap_servers)).run_pass()

    assert stats.published == 4
    assert sample("profile_outbox_delivery_latency_seconds_count") == count_before + 4
    observed = (sample("profile_outbox_delivery_latency_seconds_sum") or 0.0) - sum_before
    assert 4 * 90 <= observed < 4 * 150, observed
    assert sample("profile_outbox_delivery_latency_seconds_bucket", le="60.0") == under_a_minute
    assert sample("profile_outbox_broker_connected") == 1  # a delivery proves it


def test_librdkafka_statistics_feed_the_queue_and_round_trip_gauges(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    for n in range(5):
        insert_outbox(f"owner-{uuid.uuid4()}", created_at=datetime.now(UTC),
                      seq=n)
    metrics.QUEUE_MESSAGES.set(-1)  # so that only a statistics document can set it
    relay = Relay(relay_settings(kafka.bootstrap_servers,
                                 statistics_interval=timedelta(milliseconds=100)))

    def round_trip_seen() -> bool:
        relay.connect()  # serves the callbacks, statistics among them
        return sample("profile_outbox_producer_queue_messages") == 0 and any(
            s.name == "profile_outbox_broker_rtt_seconds"
            for m in REGISTRY.collect() for s in m.samples)

    with as_relay():
        try:
            assert relay.run_pass().published == 5
            wait_for(round_trip_seen, timeout=30, what="a broker's round-trip time")
        finally:
            relay.close()

    rtts = {s.labels["broker"]: s.value for m in REGISTRY.collect() for s in m.samples
            if s.name == "profile_outbox_broker_rtt_seconds"}
    assert rtts and all(":" in broker and 0 <= rtt < 5 for broker, rtt in rtts.items()), rtts
    # Everything acknowledged: the queue a statistics document showed during the pass is empty.
    assert sample("profile_outbox_producer_queue_bytes") == 0
