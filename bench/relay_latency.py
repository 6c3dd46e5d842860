"""Relay latency benchmark: how long an event waits from its insert to its recorded,
acknowledged delivery while the stream is nearly caught up, for the relay's read sizes.

    python bench/relay_latency.py [--batch-size default --batch-size 5000-fixed]
                                  [--shape trickle --shape bursts] [--seconds 8] [--json PATH]
                                  [--bootstrap HOST:PORT,...]

For each shape and batch size (as bench/relay_config.py reads them: `default`, `N`, `N-fixed`):
a `manage.py publish_outbox --loop` process with the relay's settings but for the batch size,
on librdkafka's mock cluster (3 brokers, in this process) or the cluster at `--bootstrap`
(Apache Kafka itself: scripts/kafka.sh start; its topics auto-created replicated 3 times with
min.insync.replicas 2, so acks=all waits for two brokers), while this process writes outbox
rows for `--seconds`: `trickle` 10 rows every 10 ms, `bursts` 500 rows every 500 ms (a cycle's
batch of owners), each write one transaction whose rows carry the time of the insert. Then it
waits for the relay to catch up, stops it (SIGTERM) and reads each row's latency from the
database: `outbox_published_at(row) - created_at` (the batch's record after the broker's
acknowledgement). Prints the percentiles; creates a fresh database (BENCH_DATABASE_URL, as
relay_bench does).
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Run as a file too (python bench/relay_latency.py): the project's root on the path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from bench.harness import ROOT, brokers, database_url, warm_up
from bench.outbox_rows import bench_messages, load_outbox
from bench.relay_config import BatchSpec, relay_environ

SHAPES = {"trickle": (10, 0.010), "bursts": (500, 0.500)}  # rows a write, seconds between


@dataclass(frozen=True)
class Latency:
    shape: str
    batch: str
    events: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    batches: int
    load_1m: float


def _relay_loop(url: str, bootstrap: str, batch: BatchSpec, topic: str,
                log: Path) -> subprocess.Popen[str]:
    environ = relay_environ(url, bootstrap, batch, topic,
                            drop=("OUTBOX_", "KAFKA_", "METRICS_"))
    with log.open("w") as output:
        return subprocess.Popen([sys.executable, "manage.py", "publish_outbox", "--loop"],
                                cwd=ROOT, env=environ, stdout=output, stderr=subprocess.STDOUT,
                                text=True)


def _wait_until_leading(relay: subprocess.Popen[str], log: Path, timeout_s: float) -> None:
    """Wait until the relay process holds the relays' lock (started and leading: its start-up is
    not what is measured); raise if it exits or the deadline passes first."""
    from outbox import store

    deadline = time.monotonic() + timeout_s
    while store.relay_lock_holder("default") is None:
        if relay.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the relay did not lead: {log.read_text()[-2000:]}")
        time.sleep(0.05)


def _waiting(cursor: Any) -> int:
    cursor.execute("select count(*) from outbox_messages m where outbox_published_at(m) is null")
    return int(cursor.fetchone()[0])


def measure_latency(shape: str, batch: BatchSpec, bootstrap: str, topic: str, *, seconds: float,
                    seed: int, start_s: float = 30.0) -> Latency:
    """One shape's latencies with one batch size, once the relay leads (it gets `start_s` to
    start and lead)."""
    from django.db import connection

    rows, every = SHAPES[shape]
    with connection.cursor() as cursor:
        cursor.execute("truncate outbox_messages")
    with tempfile.TemporaryDirectory(prefix="relay-latency-") as scratch:
        relay = _relay_loop(database_url("default"), bootstrap, batch, topic,
                            Path(scratch) / "log")
        try:
            _wait_until_leading(relay, Path(scratch) / "log", start_s)
            _write_rows(topic, rows, every, seconds=seconds, seed=seed)
            deadline = time.monotonic() + 60
            with connection.cursor() as cursor:
                while _waiting(cursor) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if _waiting(cursor):
                    log = (Path(scratch) / "log").read_text()[-2000:]
                    raise RuntimeError(f"the relay did not catch up: {log}")
        finally:
            relay.send_signal(signal.SIGTERM)
            relay.wait(30)
    with connection.cursor() as cursor:
        cursor.execute(
            "select count(*), percentile_cont(array[0.5, 0.95, 0.99]) within group (order by l),"
            "       max(l), avg(l)"
            " from (select extract(epoch from outbox_published_at(m) - m.created_at) * 1000 as l"
            "       from outbox_messages m) x")
        count, (p50, p95, p99), top, mean = cursor.fetchone()
        cursor.execute("select count(*) from outbox_relay_batches b"
                       " where b.published_at >= (select min(created_at) from outbox_messages)")
        (batches,) = cursor.fetchone()
    return Latency(shape, batch.label, int(count), round(p50, 1), round(p95, 1), round(p99, 1),
                   round(float(top), 1), round(float(mean), 1), int(batches),
                   os.getloadavg()[0])


def _write_rows(topic: str, rows: int, every: float, *, seconds: float, seed: int) -> None:
    """`rows` outbox rows every `every` seconds for `seconds`, each write one transaction whose
    rows carry the time of the insert."""
    started = time.monotonic()
    written = 0
    while time.monotonic() - started < seconds:
        now = datetime.now(UTC)
        burst = [replace(m, created_at=now)
                 for m in bench_messages(rows, topic_seed=seed + written)]
        load_outbox(burst, topic, analyze=False)
        written += rows
        time.sleep(max(0.0, started + written / rows * every - time.monotonic()))


def _print_table(results: list[Latency]) -> None:
    print(f"{'shape':<8} {'batch':>10} {'events':>7} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} "
          f"{'max ms':>7} {'mean ms':>7} {'batches':>7} {'load':>5}")
    for r in results:
        print(f"{r.shape:<8} {r.batch:>10} {r.events:>7} {r.p50_ms:>7} {r.p95_ms:>7} "
              f"{r.p99_ms:>7} {r.max_ms:>7} {r.mean_ms:>7} {r.batches:>7} {r.load_1m:>5.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser_for(__doc__)
    parser.add_argument("--batch-size", action="append", metavar="default|N|N-fixed")
    parser.add_argument("--shape", choices=sorted(SHAPES), action="append")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--bootstrap", metavar="HOST:PORT,...",
                        help="a running cluster (default: librdkafka's mock cluster)")
    args = parser.parse_args(argv)
    harness.setup_django(os.environ.get("BENCH_DATABASE_URL", harness.RELAY_DATABASE_URL))
    results = []
    run = os.urandom(4).hex()  # a cluster that outlives the run gets new topics each time
    with brokers(args.bootstrap) as servers:
        for number, shape in enumerate(args.shape or ["trickle", "bursts"]):
            for spec in [BatchSpec.parse(b) for b in args.batch_size or ["default", "5000-fixed"]]:
                topic = f"bench.latency.{run}.{shape}.{spec.label.replace(' ', '-')}"
                warm_up(servers, topic)
                results.append(measure_latency(shape, spec, servers, topic,
                                               seconds=args.seconds, seed=(number + 1) << 32))
    where = f"the cluster at {args.bootstrap}" if args.bootstrap else "mock cluster of 3 brokers"
    print(f"relay latency: {where}, {os.cpu_count()} cores")
    _print_table(results)
    if args.json:
        harness.write_json(args.json, [asdict(r) for r in results])
    return 0


if __name__ == "__main__":
    sys.exit(main())
