"""Relay benchmark: events per second from outbox rows to acknowledged
delivery on librdkafka's mock cluster, beside a raw confluent-kafka producer sending the same
messages from memory (the floor: no database at all), in one run.

    python bench/relay_bench.py [--events 100000 --events 1000000] [--relays 1 --relays 2]
                                [--batch-size default --batch-size 5000 --batch-size 500-fixed]
                                [--pass] [--no-db-floor] [--bootstrap HOST:PORT]

For each event count: the raw producer; for each batch size, the relay (`run_pass`) in 1 and
in 2 processes at once on the same outbox (one leads, the others stand by:
docs/outbox-relay.md), timed from the moment every process is ready until the last one is done
(start-up excluded); with `--pass`, a whole `manage.py publish_outbox` pass in a process of its
own, timed from before the process starts until it has exited (start-up, the checks, the
summary and the prune included: what an operator's pass costs); and the relay's database
statements alone (the stream's read and the position's move, no Kafka), the database's share.
"vs raw" compares each line with the raw producer of the same event count, measured minutes
apart.

A batch size is `default` (the relay's own settings: no OUTBOX_BATCH_SIZE; reads start small
and grow, outbox.lanes), `N` (OUTBOX_BATCH_SIZE=N: reads grow up to N) or `N-fixed` (every
read N rows: OUTBOX_BATCH_SIZE_MIN=N too, as the relay read before its reads grew).
bench/relay_config.py reads them; bench/outbox_rows.py writes the rows.

`--bootstrap` measures against a broker already running there (a Tansu process, for one)
instead of librdkafka's in-process mock cluster. It creates a fresh database
(BENCH_DATABASE_URL, default postgres://postgres@127.0.0.1:5432/pin_profile_relay_bench),
migrates it, COPYs the rows in, and prints a table (and --json PATH writes it as JSON). Not a
test: a smoke run of `measure` with a few hundred events runs in the test suite so that this
cannot rot.
"""

import argparse
import multiprocessing
import os
import queue
import re
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

# Run as a file too (python bench/relay_bench.py): the project's root on the path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from bench.harness import ROOT, brokers, database_url, quiet_kafka_logger, warm_up
from bench.outbox_rows import BenchMessage, bench_messages, load_outbox
from bench.relay_config import BatchSpec, relay_environ

RAW = "raw producer (from memory)"
RELAY = "relay (outbox -> acknowledged)"
RELAY_RUN = "publish_outbox pass, start-up in"
DB_ONLY = "database only (read + position)"
_PUBLISHED = re.compile(r"^Relay pass: (\d+) published", re.MULTILINE)


@dataclass(frozen=True)
class Measurement:
    name: str
    events: int
    batch_size: int | None  # the largest read (None: no relay, or the relay's default)
    seconds: float
    relays: int | None = None
    peak_rss_mb: float | None = None  # the relay processes' largest peak RSS
    batch: str = "-"  # the read sizes, as BatchSpec.label says them
    load_1m: float | None = None  # the machine's load average when the line was done

    @property
    def per_second(self) -> float:
        return self.events / self.seconds if self.seconds else float("inf")


def measure_raw(messages: list[BenchMessage], bootstrap: str, topic: str,
                linger_ms: int) -> Measurement:
    """The floor: the relay's producer configuration, the same records, straight from memory."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": linger_ms,
                         "queue.buffering.max.messages": max(100_000, len(messages)),
                         "logger": quiet_kafka_logger()})
    # The headers the relay sends: the row's thirteen (read_stream).
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
    return Measurement(RAW, len(messages), None, seconds, load_1m=os.getloadavg()[0])


@dataclass(frozen=True)
class RelayJob:
    database_url: str
    bootstrap: str
    batch: BatchSpec
    linger_ms: int
    topic: str  # a fresh one per line: the relay's allowlist (OUTBOX_TOPICS) names it


def _relay_process(job: RelayJob, ready: Any, start: Any, results: Any) -> None:
    """One relay process: set up Django, connect, say ready, wait for the start, one pass."""
    os.environ.update(DATABASE_URL=job.database_url, LOG_LEVEL="ERROR",
                      DJANGO_SETTINGS_MODULE="pin_profile.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from bench.peak_rss import peak_rss_mb
    from core.db import raw_connection
    from core.gc_tuning import relax_garbage_collection
    from outbox.relay import Relay

    settings = job.batch.settings(bootstrap_servers=job.bootstrap,
                                  linger=timedelta(milliseconds=job.linger_ms),
                                  topics=frozenset({job.topic}))
    relay = Relay(settings)
    raw_connection("default")
    relay.connect()
    relax_garbage_collection()  # as publish_outbox does
    ready.release()
    start.wait()
    stats = relay.run_pass()
    relay.close()
    results.put((stats.published, peak_rss_mb()))


def _fresh_outbox(messages: list[BenchMessage], topic: str, using: str) -> None:
    from django.db import connections

    with connections[using].cursor() as cursor:
        cursor.execute("truncate outbox_messages")
    load_outbox((m for m in messages), topic, using)


def measure_relay(messages: list[BenchMessage], bootstrap: str, topic: str, *, batch: BatchSpec,
                  linger_ms: int, relays: int = 1, using: str = "default") -> Measurement:
    """`relays` relay processes, one pass each, over the messages loaded as outbox rows first
    (not timed); timed from all processes ready to the last one done."""
    _fresh_outbox(messages, topic, using)
    context = multiprocessing.get_context("spawn")
    ready, start, results = context.Semaphore(0), context.Event(), context.Queue()
    job = RelayJob(database_url(using), bootstrap, batch, linger_ms, topic)
    processes = [context.Process(target=_relay_process, args=(job, ready, start, results))
                 for _ in range(relays)]
    for process in processes:
        process.start()
    for _ in processes:
        if not ready.acquire(timeout=120):
            raise RuntimeError("a relay process did not get ready")
    started = time.perf_counter()
    start.set()
    published: list[int] = []
    peak_rss: list[float] = []
    while len(published) < relays:
        try:
            count, rss_mb = results.get(timeout=1)
            published.append(count)
            peak_rss.append(rss_mb)
        except queue.Empty:
            if any(p.exitcode not in {None, 0} for p in processes):
                raise RuntimeError("a relay process failed") from None
    seconds = time.perf_counter() - started
    for process in processes:
        process.join(60)
    if sum(published) != len(messages):
        raise RuntimeError(f"relays published {published} of {len(messages)}")
    return Measurement(RELAY, len(messages), batch.ceiling, seconds, relays, max(peak_rss),
                       batch.label, os.getloadavg()[0])


def measure_pass(messages: list[BenchMessage], bootstrap: str, topic: str, *, batch: BatchSpec,
                 linger_ms: int, using: str = "default") -> Measurement:
    """One `manage.py publish_outbox` pass in a process of its own, with the relay's settings
    but for `batch` (and the linger, if not the default 5 ms), over the messages loaded as
    outbox rows first (not timed); timed from before the process starts until it has exited,
    Python's and Django's start-up, the broker and topic checks, the summary and the prune
    included. Its peak RSS is its own (bench.peak_rss)."""
    _fresh_outbox(messages, topic, using)
    environ = relay_environ(database_url(using), bootstrap, batch, topic)
    environ.pop("LOG_LEVEL", None)  # the relay's default logging, to a file
    if linger_ms != 5:
        environ["OUTBOX_LINGER"] = f"{linger_ms}ms"
    with tempfile.TemporaryDirectory(prefix="relay-pass-") as scratch:
        rss_file, log = Path(scratch) / "rss", Path(scratch) / "log"
        with log.open("w") as stderr:
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "bench.peak_rss", str(rss_file), "manage.py",
                 "publish_outbox"], cwd=ROOT, env=environ, stdout=subprocess.PIPE,
                stderr=stderr, text=True, check=False)
            seconds = time.perf_counter() - started
        published = _PUBLISHED.search(done.stdout)
        if done.returncode != 0 or published is None or int(published[1]) != len(messages):
            raise RuntimeError(f"publish_outbox exited {done.returncode}: {done.stdout}\n"
                               f"{log.read_text()[-2000:]}")
        rss_mb = float(rss_file.read_text())
    return Measurement(RELAY_RUN, len(messages), batch.ceiling, seconds, 1, rss_mb,
                       batch.label, os.getloadavg()[0])


def measure_db_floor(messages: list[BenchMessage], batch: BatchSpec,
                     using: str = "default") -> Measurement:
    """The database's share alone: the relay's stream read and position statements (one
    transaction a batch), no Kafka at all."""

    from outbox import store
    from outbox.lanes import ReadSize, StreamReader

    _fresh_outbox(messages, "bench.db-floor", using)
    settings = batch.settings()
    store.relax_commit_durability(using)  # as the relay's session does
    # As the relay reads: its own session, one ahead, its read sizes.
    reader = StreamReader(using, ReadSize.of(settings))
    leader_pid = store.try_to_lead(using)  # advance moves the position only for the leader
    assert leader_pid is not None, "a relay is leading on the benchmark's database"  # noqa: S101
    after = store.read_position(using)
    started = time.perf_counter()
    while read := reader.read(after).messages:
        end = read[-1].position or after
        reader.read_ahead(end)
        store.advance(using, start=after, end=end, published=len(read), detours=[],
                      max_attempts=10, leader_pid=leader_pid)
        after = end
    seconds = time.perf_counter() - started
    store.resign(using)
    reader.close()
    return Measurement(DB_ONLY, len(messages), batch.ceiling, seconds, batch=batch.label,
                       load_1m=os.getloadavg()[0])


def _measure_count(messages: list[BenchMessage], servers: str, topic: str, *,
                   specs: list[BatchSpec], relays: list[int], whole_pass: bool, db_floor: bool,
                   linger_ms: int, using: str) -> list[Measurement]:
    """One event count's lines: the raw producer, per batch size a `publish_outbox` pass (with
    `whole_pass`) and the relay with each number of processes, then the database alone. Each
    Kafka line on a fresh topic, named `topic` and what it measures."""
    # Every side with the relay's collector settings, the messages out of its walks.
    from core.gc_tuning import relax_garbage_collection

    relax_garbage_collection()
    warm_up(servers, f"{topic}.raw")
    results = [measure_raw(messages, servers, f"{topic}.raw", linger_ms)]
    for number, batch in enumerate(specs):
        if whole_pass:
            warm_up(servers, f"{topic}.pass.{number}")
            results.append(measure_pass(messages, servers, f"{topic}.pass.{number}",
                                        batch=batch, linger_ms=linger_ms, using=using))
        for processes in relays:
            line_topic = f"{topic}.relay.{number}.{processes}"
            warm_up(servers, line_topic)
            results.append(measure_relay(messages, servers, line_topic, batch=batch,
                                         linger_ms=linger_ms, relays=processes, using=using))
    if db_floor:
        results.append(measure_db_floor(messages, specs[0], using))
    return results


def measure(events: list[int], *, batch_size: int | None = None,
            batches: list[BatchSpec] | None = None, relays: list[int] | None = None,
            whole_pass: bool = False, db_floor: bool = True, linger_ms: int = 5,
            using: str = "default", bootstrap: str | None = None) -> list[Measurement]:
    """Per event count: the raw producer; per batch size (`batches`, or `batch_size` as a
    ceiling, or the relay's defaults), the relay with each number of processes (start-up
    excluded) and, with `whole_pass`, a `publish_outbox` pass (start-up included); and the
    database alone (the first batch size). Each Kafka line on a fresh topic of one mock cluster
    (or of the broker at `bootstrap`)."""
    specs = batches or [BatchSpec(batch_size) if batch_size else BatchSpec()]
    results = []
    run = uuid.uuid4().hex[:8]  # a broker that outlives the run gets new topics each time
    with brokers(bootstrap) as servers:
        for count in events:
            results += _measure_count(
                bench_messages(count), servers, f"bench.{run}.{count}", specs=specs,
                relays=[1, 2] if relays is None else relays, whole_pass=whole_pass,
                db_floor=db_floor, linger_ms=linger_ms, using=using)
    return results


def table(results: list[Measurement]) -> str:
    """One line a measurement; "vs raw" against the raw producer measured last before it (with
    --repeat, the one of the same round)."""
    raw: dict[int, float] = {}
    lines = [f"{'what':<32} {'events':>8} {'relays':>6} {'batch':>10} {'seconds':>8} "
             f"{'events/s':>10} {'vs raw':>7} {'RSS MB':>7} {'load':>5}"]
    for r in results:
        if r.name == RAW:
            raw[r.events] = r.per_second
        relays = "-" if r.relays is None else str(r.relays)
        share = f"{r.per_second / raw[r.events]:>6.0%}" if r.events in raw else "     -"
        rss = "-" if r.peak_rss_mb is None else f"{r.peak_rss_mb:.0f}"
        load = "-" if r.load_1m is None else f"{r.load_1m:.1f}"
        lines.append(f"{r.name:<32} {r.events:>8} {relays:>6} {r.batch:>10} {r.seconds:>8.2f} "
                     f"{r.per_second:>10,.0f} {share:>7} {rss:>7} {load:>5}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = harness.parser_for(__doc__)
    parser.add_argument("--events", type=int, action="append",
                        help="events per measurement, repeatable (default: 100000 and 1000000)")
    parser.add_argument("--relays", type=int, action="append",
                        help="relay processes at once, repeatable (default: 1 and 2; 0: no "
                        "in-process relay line, with --pass)")
    parser.add_argument("--batch-size", type=BatchSpec.parse, action="append",
                        metavar="default|N|N-fixed",
                        help="the relay's read sizes, repeatable (default: default, the "
                        "relay's own: reads from 100 rows growing up to 5,000)")
    parser.add_argument("--pass", dest="whole_pass", action="store_true",
                        help="also time a whole publish_outbox pass per batch size, start-up "
                        "included, in a process of its own")
    parser.add_argument("--db-floor", action=argparse.BooleanOptionalAction, default=True,
                        help="measure the database alone (default: yes)")
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--bootstrap", metavar="HOST:PORT",
                        help="a running broker to measure against (default: a mock cluster); "
                        "Apache Kafka itself: the KAFKA_BOOTSTRAP_SERVERS scripts/kafka.sh "
                        "start prints (topics auto-created with its durable defaults)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every line this many times, alternated (raw, relay, raw, "
                        "relay, ...), each on fresh topics (default 1)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    harness.setup_django(os.environ.get("BENCH_DATABASE_URL", harness.RELAY_DATABASE_URL))
    relays = [n for n in args.relays or [1, 2] if n > 0]
    load_before = harness.load_average()
    results = []
    for _ in range(args.repeat):
        results += measure(args.events or [100_000, 1_000_000],
                           batches=args.batch_size or [BatchSpec()], relays=relays,
                           whole_pass=args.whole_pass, db_floor=args.db_floor,
                           linger_ms=args.linger_ms, bootstrap=args.bootstrap)
    broker = f"the broker at {args.bootstrap}" if args.bootstrap else "mock cluster of 3 brokers"
    print(f"relay benchmark: {broker}, linger {args.linger_ms} ms, {os.cpu_count()} cores, "
          f"load average at the start {load_before}, at the end {harness.load_average()}")
    print(table(results))
    if args.json:
        harness.write_json(args.json, [{**asdict(r), "per_second": r.per_second}
                                       for r in results])
    return 0


if __name__ == "__main__":
    sys.exit(main())
