"""Relay benchmark (issue 6): events per second from outbox rows to acknowledged delivery on
librdkafka's mock cluster, beside a raw confluent-kafka producer sending the same messages
from memory (the floor: no database at all).

    python bench/relay_bench.py [--events 100000] [--batch-size 500 --batch-size 5000]
                                [--bootstrap HOST:PORT]

`--bootstrap` measures against a broker already running there (a Tansu process, for one:
docs/outbox-relay.md) instead of librdkafka's in-process mock cluster.

A third line per batch size runs only the relay's claim and mark statements (no Kafka): the
database's share, which bounds the relay. It creates a fresh database (BENCH_DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/pin_profile_relay_bench), migrates it, COPYs the rows in,
and prints a table (and --json PATH writes it as JSON). Not a test: a smoke run of `measure`
with a few hundred events runs in the test suite so that this cannot rot.
"""

import argparse
import json
import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/pin_profile_relay_bench"


@dataclass(frozen=True)
class Measurement:
    name: str
    events: int
    batch_size: int | None
    seconds: float

    @property
    def per_second(self) -> float:
        return self.events / self.seconds if self.seconds else float("inf")


@dataclass(frozen=True)
class BenchMessage:
    id: uuid.UUID
    key: str
    payload: str
    headers: dict[str, str]
    created_at: datetime


def bench_messages(count: int, topic_seed: int = 0) -> list[BenchMessage]:
    """`count` reminder events, one per owner (as a cycle writes them), ~400 bytes each."""
    base = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
    messages = []
    for n in range(count):
        owner = str(uuid.UUID(int=(topic_seed << 64) + n + 1, version=4))
        message_id = uuid.uuid4()
        payload = json.dumps({
            "ownerUserId": owner,
            "remindedAt": "2026-11-29T03:00:00Z",
            "documents": [{"documentId": str(uuid.uuid4()), "type": "Passport",
                           "numberMask": f"45 ** ****{n % 100:02d}", "expiresAt": "2026-12-06",
                           "thresholdDays": 7, "daysLeft": 7}],
        })
        headers = {"message_id": str(message_id), "correlation_id": str(uuid.uuid4()),
                   "event_type": "DocumentExpiryReminderKafkaEvent", "contract_version": "1"}
        messages.append(BenchMessage(message_id, owner, payload, headers,
                                     base + timedelta(microseconds=n)))
    return messages


def load_outbox(messages: list[BenchMessage], topic: str, using: str = "default") -> None:
    """COPY the messages into outbox_messages as unpublished rows."""
    from core.db import raw_connection

    conn = raw_connection(using)
    columns = ("id, aggregate_type, aggregate_id, event_type, contract_version, topic, "
               "message_key, payload, headers, created_at, attempts")
    with conn.transaction(), conn.cursor() as cur, cur.copy(
        f"copy outbox_messages ({columns}) from stdin"
    ) as copy:
        for m in messages:
            copy.write_row((m.id, "Profile", m.key, m.headers["event_type"], 1, topic, m.key,
                            m.payload, json.dumps(m.headers), m.created_at, 0))
    with conn.cursor() as cur:
        if conn.autocommit:
            cur.execute("vacuum analyze outbox_messages")


def _warm_up(bootstrap: str, topic: str) -> None:
    """Create the topic and load its metadata, so neither side pays for auto-creation."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "logger": _quiet_logger()})
    producer.produce(topic, b"warm-up")
    if producer.flush(30):
        raise RuntimeError(f"could not warm up {topic} on {bootstrap}")


def _quiet_logger() -> Any:
    import logging

    logger = logging.getLogger("bench.kafka")
    logger.setLevel(logging.ERROR)
    return logger


def measure_raw(messages: list[BenchMessage], bootstrap: str, topic: str,
                linger_ms: int) -> Measurement:
    """The floor: the relay's producer configuration, the same records, straight from memory."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": linger_ms,
                         "queue.buffering.max.messages": max(100_000, len(messages)),
                         "logger": _quiet_logger()})
    records = [(m.key.encode(), m.payload.encode(),
                [(k, v.encode()) for k, v in m.headers.items()],
                int(m.created_at.timestamp() * 1000)) for m in messages]
    failed: list[object] = []

    def delivered(error: object, _message: object) -> None:
        if error is not None:
            failed.append(error)

    started = time.perf_counter()
    for key, value, headers, timestamp in records:
        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=headers,
                                 timestamp=timestamp, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
    remaining = producer.flush(120)
    seconds = time.perf_counter() - started
    if remaining or failed:
        raise RuntimeError(f"raw producer: {remaining} undelivered, {len(failed)} failed")
    return Measurement("raw producer (from memory)", len(messages), None, seconds)


def measure_relay(messages: list[BenchMessage], bootstrap: str, topic: str, *, batch_size: int,
                  linger_ms: int, using: str = "default") -> Measurement:
    """The relay's one pass over the same messages, loaded as outbox rows first (not timed)."""
    from django.db import connections

    from outbox.config import RelaySettings
    from outbox.relay import Relay

    with connections[using].cursor() as cursor:
        cursor.execute("truncate outbox_messages")
    load_outbox(messages, topic, using)
    settings = RelaySettings(bootstrap_servers=bootstrap, batch_size=batch_size,
                             linger=timedelta(milliseconds=linger_ms))
    relay = Relay(settings, using=using)
    started = time.perf_counter()
    stats = relay.run_pass()
    seconds = time.perf_counter() - started
    relay.close()
    if stats.published != len(messages):
        raise RuntimeError(f"relay published {stats.published} of {len(messages)}")
    return Measurement("relay (outbox -> acknowledged)", len(messages), batch_size, seconds)


def measure_db_floor(messages: list[BenchMessage], batch_size: int,
                     using: str = "default") -> Measurement:
    """The database's share alone: the relay's claim and mark statements, no Kafka at all."""
    from django.db import connections

    from outbox import store

    with connections[using].cursor() as cursor:
        cursor.execute("truncate outbox_messages")
    load_outbox(messages, "bench.db-floor", using)
    lease = timedelta(minutes=2)
    store.relax_commit_durability(using)  # as the relay's session does
    started = time.perf_counter()
    while claimed := store.claim_batch(using, batch_size=batch_size, lease=lease,
                                       relay_id="bench"):
        store.mark_published(using, [m.id for m in claimed])
    seconds = time.perf_counter() - started
    return Measurement("database only (claim + mark)", len(messages), batch_size, seconds)


def measure(events: int, batch_sizes: list[int], linger_ms: int = 5,
            using: str = "default", bootstrap: str | None = None) -> list[Measurement]:
    """Raw producer, then the relay at each batch size, each on a fresh topic of a fresh mock
    cluster (or of the broker at `bootstrap`)."""
    from devtools.mock_kafka import MockKafkaCluster

    results = []
    run = uuid.uuid4().hex[:8]  # a broker that outlives the run gets new topics each time
    with MockKafkaCluster(3) as cluster:
        servers = bootstrap or cluster.bootstrap_servers
        raw_topic = f"bench.raw.{run}"
        _warm_up(servers, raw_topic)
        results.append(measure_raw(bench_messages(events), servers, raw_topic, linger_ms))
        for n, batch_size in enumerate(batch_sizes):
            topic = f"bench.relay.{run}.{n}"
            _warm_up(servers, topic)
            results.append(measure_relay(bench_messages(events, n + 1), servers, topic,
                                         batch_size=batch_size, linger_ms=linger_ms,
                                         using=using))
    for batch_size in batch_sizes:
        results.append(measure_db_floor(bench_messages(events, 99), batch_size, using))
    return results


def table(results: list[Measurement]) -> str:
    floor = results[0].per_second
    lines = [f"{'what':<34} {'batch':>6} {'events':>8} {'seconds':>8} {'events/s':>10} {'vs raw':>7}"]
    for r in results:
        batch = "-" if r.batch_size is None else str(r.batch_size)
        lines.append(f"{r.name:<34} {batch:>6} {r.events:>8} {r.seconds:>8.2f} "
                     f"{r.per_second:>10,.0f} {r.per_second / floor:>6.0%}")
    return "\n".join(lines)


def _fresh_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'drop database if exists "{name}" with (force)')
        conn.execute(f'create database "{name}"')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, action="append", dest="batch_sizes")
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--bootstrap", metavar="HOST:PORT",
                        help="a running broker to measure against (default: a mock cluster)")
    args = parser.parse_args(argv)
    url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL)
    _fresh_database(url)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pin_profile.settings")
    os.environ.setdefault("LOG_LEVEL", "ERROR")
    sys.path.insert(0, str(ROOT))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    results = measure(args.events, args.batch_sizes or [500, 5000], args.linger_ms,
                      bootstrap=args.bootstrap)
    broker = f"the broker at {args.bootstrap}" if args.bootstrap else "mock cluster of 3 brokers"
    print(f"relay benchmark: {args.events} events, {broker}, "
          f"linger {args.linger_ms} ms, {os.cpu_count()} cores")
    print(table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(
            [{**asdict(r), "per_second": r.per_second} for r in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
