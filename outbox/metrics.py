"""Outbox metrics: the backlog read from the table at scrape time, and the relay's own.

The relay calls `record_published(n)`, `record_failed(n)` and `record_parked(n)` per batch,
`observe_delivery_latencies()` per batch (a latency for each delivered row), `set_connected()`
on what librdkafka says, and `observe_statistics()` with its statistics. The outbox app offers its
backlog gauges through core.gauges (apps.py), so any process that serves metrics shows them:
the reminder worker does, so the backlog stays visible while the relay is down. The relay's own
metrics are in no registry until the relay installs them (`install_relay_metrics`): a worker,
which never relays, does not export them stuck at 0.

librdkafka's statistics (`statistics.interval.ms`, a JSON document per interval) are reduced
here to what an operator watches (`parse_statistics`): whether a broker is up, each broker's
round-trip time, and the producer's outbound queue. Reference: librdkafka's STATISTICS.md.
"""

import json
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from core.gauges import DatabaseGauges
from core.metrics import MetricSet
from outbox import store

# --- librdkafka's statistics, as the metrics read them ------------------------------------------

# librdkafka reports times in microseconds.
US_PER_S = 1_000_000


@dataclass(frozen=True, slots=True)
class ProducerStatistics:
    """One statistics document, as the metrics read it."""

    queue_messages: int = 0  # msg_cnt: produced, not yet acknowledged or failed
    queue_bytes: int = 0  # msg_size
    any_broker_up: bool = False
    # host:port of each broker that is up -> its round-trip time in seconds (p99 of the
    # interval), None when it answered no request in the interval; bootstrap entries (node id
    # -1) are not brokers yet.
    rtt_s: dict[str, float | None] = field(default_factory=dict)


def parse_statistics(text: str) -> ProducerStatistics:
    """The fields the relay exports; a field librdkafka left out counts as absent or zero."""
    document: dict[str, Any] = json.loads(text)
    brokers: dict[str, dict[str, Any]] = document.get("brokers") or {}
    rtt_s: dict[str, float | None] = {}
    for name, broker in brokers.items():
        if int(broker.get("nodeid", -1)) < 0 or broker.get("state") != "UP":
            continue
        rtt = broker.get("rtt") or {}
        answered = int(rtt.get("cnt", 0)) > 0
        rtt_s[str(broker.get("nodename") or name)] = (float(rtt.get("p99", 0)) / US_PER_S
                                                       if answered else None)
    return ProducerStatistics(
        queue_messages=int(document.get("msg_cnt", 0)),
        queue_bytes=int(document.get("msg_size", 0)),
        any_broker_up=any(b.get("state") == "UP" for b in brokers.values()),
        rtt_s=rtt_s,
    )


# --- the metrics ------------------------------------------------------------------------------------

UNPUBLISHED = "profile_outbox_unpublished_messages"
OLDEST_AGE = "profile_outbox_oldest_unpublished_age_seconds"
PARKED = "profile_outbox_parked_messages"
GAUGES = {
    UNPUBLISHED: "Outbox messages waiting for the relay (not published, not parked).",
    OLDEST_AGE: "Age in seconds of the oldest message waiting for the relay (0 when none): the lag.",
    PARKED: "Outbox messages the relay gave up on (parked_at set); they wait for a re-queue.",
}
GAUGE_REFRESH_S = 15.0

PUBLISHED_TOTAL = Counter(
    "profile_outbox_published_total", "Outbox messages the relay published (delivery confirmed).",
    registry=None,
)
FAILED_TOTAL = Counter(
    "profile_outbox_failed_total", "Failed delivery attempts of outbox messages (retried or parked).",
    registry=None,
)
PARKED_TOTAL = Counter(
    "profile_outbox_parked_total", "Outbox messages the relay parked after its last attempt.",
    registry=None,
)
BROKER_CONNECTED = Gauge(
    "profile_outbox_broker_connected",
    "1 while the relay reaches Kafka (a delivery succeeded or a broker is up in librdkafka's "
    "statistics), 0 from its start or once librdkafka reports all brokers down.",
    registry=None,
)
# From 50 ms (a relay keeping up) to hours (a backlog after an outage).
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
                   7200, 14400, 43200)
DELIVERY_LATENCY = Histogram(
    "profile_outbox_delivery_latency_seconds",
    "From an outbox row's created_at to the broker's acknowledgement of its message.",
    buckets=LATENCY_BUCKETS, registry=None,
)
BROKER_RTT = Gauge(
    "profile_outbox_broker_rtt_seconds",
    "Round-trip time of the relay's requests to each broker (p99 over librdkafka's last "
    "statistics interval).",
    ["broker"], registry=None,
)
QUEUE_MESSAGES = Gauge(
    "profile_outbox_producer_queue_messages",
    "Messages in the relay's producer queue, produced and not yet acknowledged or failed.",
    registry=None,
)
QUEUE_BYTES = Gauge(
    "profile_outbox_producer_queue_bytes",
    "Bytes of the messages in the relay's producer queue.", registry=None,
)
# The operator's one write, by the command or the admin's action: installed by the process that
# re-queues (the admin's serves it on METRICS_ADDR from its start; the command serves none).
REQUEUED_TOTAL = Counter(
    "profile_outbox_requeued_total",
    "Parked outbox messages re-queued by an operator (via: the requeue_outbox command or the "
    "admin's action).",
    ["via"], registry=None,
)
REQUEUE_VIAS = ("command", "admin")
REQUEUE_METRICS = MetricSet(REQUEUED_TOTAL)
RELAY_METRICS = MetricSet(PUBLISHED_TOTAL, FAILED_TOTAL, PARKED_TOTAL, BROKER_CONNECTED,
                          DELIVERY_LATENCY, BROKER_RTT, QUEUE_MESSAGES, QUEUE_BYTES)
_brokers: set[str] = set()


def install_relay_metrics(registry: CollectorRegistry = REGISTRY) -> None:
    """Register the relay's own metrics in `registry` (once): in a process that relays."""
    RELAY_METRICS.install(registry)
    PARTITION_METRICS.install(registry)
    TOPIC_METRICS.install(registry)


def install_requeue_metrics(registry: CollectorRegistry = REGISTRY) -> None:
    """Register the re-queue counter in `registry` (once), each `via` at 0 until it counts."""
    for via in REQUEUE_VIAS:
        REQUEUED_TOTAL.labels(via=via)
    REQUEUE_METRICS.install(registry)


def record_requeued(n: int, via: str) -> None:
    """An operator re-queued `n` parked messages through `via` (one of REQUEUE_VIAS)."""
    REQUEUED_TOTAL.labels(via=via).inc(n)


def record_published(n: int = 1) -> None:
    """The relay confirmed delivery of `n` messages."""
    PUBLISHED_TOTAL.inc(n)


def record_failed(n: int = 1) -> None:
    """`n` delivery attempts failed (the messages are retried, or parked)."""
    FAILED_TOTAL.inc(n)


def record_parked(n: int = 1) -> None:
    """The relay parked `n` messages."""
    PARKED_TOTAL.inc(n)


def set_connected(connected: bool) -> None:
    BROKER_CONNECTED.set(1 if connected else 0)


def observe_delivery_latencies(latencies: Iterable[tuple[float, int]]) -> None:
    """A batch's delivered rows at once, as (seconds, rows) pairs, from created_at to the
    acknowledgement (0 if the clocks disagree): as many observations as rows, but each bucket
    and the sum are added to once per batch, not once per row."""
    observe_many(DELIVERY_LATENCY, ((max(0.0, s), n) for s, n in latencies))


def observe_many(histogram: Histogram, amounts: Iterable[tuple[float, int]]) -> None:
    """`histogram.observe(a)` `n` times for each (a, n), bucket by bucket. prometheus_client
    has no bulk observe; this uses its Histogram's own bucket values (the version is pinned,
    and tests/unit/test_outbox_metrics.py compares both ways)."""
    histogram._raise_if_not_observable()  # type: ignore[no-untyped-call]
    bounds = histogram._upper_bounds
    counts: Tally[int] = Tally()
    total = 0.0
    for amount, times in amounts:
        counts[bisect_left(bounds, amount)] += times
        total += amount * times
    if not counts:
        return
    histogram._sum.inc(total)
    for index, count in counts.items():
        histogram._buckets[index].inc(count)


def observe_statistics(stats: ProducerStatistics) -> None:
    """librdkafka's statistics: the queue, and the round-trip time of the brokers it lists."""
    QUEUE_MESSAGES.set(stats.queue_messages)
    QUEUE_BYTES.set(stats.queue_bytes)
    for broker in _brokers - set(stats.rtt_s):
        BROKER_RTT.remove(broker)  # gone or down: no stale value
    for broker, rtt in stats.rtt_s.items():
        if rtt is not None:  # else idle in the interval: the last value stands
            BROKER_RTT.labels(broker=broker).set(rtt)
    shown = {b for b, rtt in stats.rtt_s.items() if rtt is not None or b in _brokers}
    _brokers.clear()
    _brokers.update(shown)


def read_outbox_backlog(using: str = "default") -> dict[str, float]:
    """{gauge name: value} from the one backlog query."""
    backlog = store.backlog(using)
    return {UNPUBLISHED: float(backlog.unpublished), OLDEST_AGE: backlog.oldest_age_s or 0.0,
            PARKED: float(backlog.parked)}


def outbox_gauges(using: str = "default", refresh_s: float = GAUGE_REFRESH_S) -> DatabaseGauges:
    """The outbox backlog gauges, read at most every `refresh_s` seconds (not registered)."""
    return DatabaseGauges(GAUGES, lambda: read_outbox_backlog(using), refresh_s=refresh_s,
                          using=using)


# --- one partition's outage (docs/outbox-relay.md, "One partition's outage") -----------------

PARTITION_UNAVAILABLE = Gauge(
    "profile_outbox_partition_unavailable",
    "1 while a partition of the topic could not take the relay's rows as the rest of the "
    "cluster did (its rows wait in the slow lane), 0 once one of them was delivered again.",
    ["topic", "partition"], registry=None,
)
DEFERRED_TOTAL = Counter(
    "profile_outbox_deferred_total",
    "Outbox messages a partition could not take now, sent to the slow lane or delayed there "
    "without an attempt counted.",
    ["topic", "partition"], registry=None,
)
PARTITION_METRICS = MetricSet(PARTITION_UNAVAILABLE, DEFERRED_TOTAL)


def record_deferred(topic: str, partition: int, n: int) -> None:
    """`n` rows bound for `partition` were deferred: it is unavailable."""
    DEFERRED_TOTAL.labels(topic=topic, partition=str(partition)).inc(n)
    PARTITION_UNAVAILABLE.labels(topic=topic, partition=str(partition)).set(1)


def set_partition_available(topic: str, partition: int) -> None:
    PARTITION_UNAVAILABLE.labels(topic=topic, partition=str(partition)).set(0)
# --- the topics the relay publishes to (outbox.topic_watch) ----------------------------------------

TOPIC_PARTITIONS = Gauge(
    "profile_outbox_topic_partitions",
    "Partitions of each topic the relay publishes to, as it last saw them.",
    ["topic"], registry=None,
)
TOPIC_PARTITIONS_CHANGED = Gauge(
    "profile_outbox_topic_partitions_changed_timestamp_seconds",
    "When a relay found the topic's partition count changed (recorded in outbox_topics, so it "
    "survives restarts); 0 if never. Order per key does not hold across such a change.",
    ["topic"], registry=None,
)
# The states of TOPIC_DURABILITY: exactly one is 1 for a topic the relay has looked at.
DURABILITY_STATES = ("verified", "unverified", "allowed")
TOPIC_DURABILITY = Gauge(
    "profile_outbox_topic_durability",
    "1 for the topic's durability state: verified (replicated, min.insync.replicas >= 2, no "
    "unclean leader election), unverified (its configuration could not be read: not checked), "
    "allowed (it may lose acknowledged records; published to by OUTBOX_ALLOW_UNDURABLE_TOPIC).",
    ["topic", "state"], registry=None,
)
TOPIC_METRICS = MetricSet(TOPIC_PARTITIONS, TOPIC_PARTITIONS_CHANGED, TOPIC_DURABILITY)


def set_topic_partitions(topic: str, partitions: int, changed_at_s: float | None) -> None:
    TOPIC_PARTITIONS.labels(topic=topic).set(partitions)
    TOPIC_PARTITIONS_CHANGED.labels(topic=topic).set(changed_at_s or 0)


def set_topic_durability(topic: str, state: str) -> None:
    for each in DURABILITY_STATES:
        TOPIC_DURABILITY.labels(topic=topic, state=each).set(1 if each == state else 0)
