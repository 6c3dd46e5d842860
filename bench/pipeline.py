"""The cycle benchmark's pipeline phase: documents to events on the topic. The cold cycle
again from the same ledger, then one pass of the relay (`publish_outbox`, as its role) to
librdkafka's mock cluster (or the broker at `--bootstrap`), each timed inside its process, and
the events counted on the topic."""

import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from bench import worker
from bench.cycle_phases import BenchConfig, Phase, run_worker_phase, seed_renewed_markers
from bench.harness import Activity, brokers, quiet
from core.roles import RELAY_ROLE
from reminders import events

PIPELINE_PARTITIONS = 6


def events_on_topic(bootstrap: str, topic: str) -> int:
    """Records on the topic: the sum of its partitions' high watermarks (0 if it is new)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                         "enable.auto.commit": False})
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return 0
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                   for p in metadata.partitions)
    finally:
        consumer.close()


def _relay_pass(conn: psycopg.Connection[Any], config: BenchConfig, logs: Path) -> Phase:
    """One relay pass of the outbox, timed inside its process; its events counted on the
    topic."""
    with brokers(config.bootstrap, {events.TOPIC: PIPELINE_PARTITIONS}) as bootstrap:
        before = events_on_topic(bootstrap, events.TOPIC)
        quiet(conn)
        activity = Activity.now(conn)
        run, reported = worker.run_relay(config.url(user=RELAY_ROLE), bootstrap,
                                         logs / "relay.log")
        on_topic = events_on_topic(bootstrap, events.TOPIC) - before
    seconds = float(reported.get("seconds", 0.0))
    published = int(reported.get("published", 0))
    return Phase(
        "pipeline: relay", seconds, events=published, events_on_topic=on_topic,
        events_per_second=published / seconds if seconds else None,
        peak_rss_mb=run.peak_rss_mb, worker_cpu_seconds=run.cpu_seconds,
        wall_seconds=run.wall_seconds,
        status="succeeded" if run.returncode == 0 else f"exit {run.returncode}: "
                                                       f"{reported.get('error')}",
    ).wrote(conn, activity)


def run_pipeline(conn: psycopg.Connection[Any], config: BenchConfig, as_of: datetime,
                 logs: Path) -> list[Phase]:
    """The cold cycle from the cold cycle's ledger (outbox empty), then one relay pass of
    everything it wrote: each timed inside its process, and the events counted on the topic."""
    seed_renewed_markers(conn, as_of)
    cycle = run_worker_phase(conn, config, "pipeline: cycle", as_of=as_of, logs=logs,
                             floor=None)
    if cycle.seconds and cycle.events is not None:
        cycle.events_per_second = cycle.events / cycle.seconds
    relay = _relay_pass(conn, config, logs)
    on_topic = relay.events_on_topic or 0
    total = cycle.seconds + relay.seconds
    whole = Phase(
        "pipeline: end to end", total, window_documents=cycle.window_documents,
        due_documents=cycle.due_documents, markers=cycle.markers, events=cycle.events,
        events_on_topic=on_topic, due_per_second=(cycle.due_documents or 0) / total if total
        else None, events_per_second=on_topic / total if total else None,
        wall_seconds=(cycle.wall_seconds or 0) + (relay.wall_seconds or 0),
        status="succeeded" if on_topic == cycle.events and relay.status == "succeeded"
        else f"{on_topic} on the topic of {cycle.events} written")
    return [cycle, relay, whole]
