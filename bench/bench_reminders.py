"""The reminder worker's benchmark against PostgreSQL's own limit (issue 6).

    python -m bench.bench_reminders --shape backlog            # N = 1,000,000
    python -m bench.bench_reminders --shape steady             # N = 10,000,000
    python -m bench.bench_reminders --shape backlog -n 100000

Builds the shape's data set with COPY in a fresh database, then times, on the same data: the
floor (the whole cold cycle as one SQL statement: the worker's claim statement over the
whole window, `floor_statement`), the worker's cold cycle (checked to write exactly the floor's
markers and events, headers included), the warm cycle (same as-of again), the next day
(as-of + 1 day) and a prune (a month of expiries at once). Before the floor and before the
cold cycle, about 1 window document in 20 gets markers of an earlier expiry date (as a
renewal leaves them), so both re-arm the same markers (docs/design.md §3.2, renewal
re-arms). The worker runs as production does: `manage.py run_expiry_reminders` in a
subprocess, as the least-privilege role. Then the whole pipeline, documents to events on the
topic: the cold cycle again from the same ledger, then one pass of the relay
(`publish_outbox`, as its role) to librdkafka's mock cluster (or the broker at
`--bootstrap`), each timed, and the events counted on the topic. Prints a table and writes
JSON (bench/results/latest.json). docs/performance.md explains the figures.

With `--stale-statistics`, a cold cycle first runs at once on the data just loaded, with no
ANALYZE of any table (and autovacuum kept off person_documents meanwhile), as after a bulk
import; then the tables are analyzed and every phase runs as usual, so that the same run has
the stale cycle next to the analyzed one (issue 22).

With `--pairs N`, the floor and the cold cycle run N times, alternated (floor, cycle, floor,
cycle, ...), each pair on the same seeded ledger: each pair's ratio is read within its own
minutes of the machine, and the pairs show the spread (issue 33). With `--claim-connections
1,2` each pair runs a cold cycle per value of REMINDER_CLAIM_CONNECTIONS after its floor
(floor, one connection, two, floor, ...), each from the same seeded ledger.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from datetime import time as clock_time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from bench import dataset, worker
from core.queries import load
from core.roles import RELAY_ROLE, ROLES_SQL, WORKER_ROLE
from devtools.demo_data import PERSON_DOCUMENTS_SQL
from reminders import events, rules
from reminders.config import ReminderSettings

BENCH_SQL = Path(__file__).parent / "sql" / "bench.sql"
# The worker's named queries, read as a file: the benchmark runs the worker as a subprocess.
WORKER_SQL = Path(__file__).resolve().parent.parent / "reminders" / "sql" / "queries.sql"
SEED_RUN_ID = "00000000-0000-4000-8000-000000000000"  # the run id of seed_renewed_markers
RESULTS = Path(__file__).parent / "results"
CANDIDATE_INDEX = "ix_person_documents_expires_at"
PRUNE_AHEAD = timedelta(days=30)


def bench_query(name: str) -> str:
    return load(BENCH_SQL)[name]


CLAIM_DOCS = "with docs as materialized ("  # claim_batch's first CTE: the batch's documents
CLAIM_AFTER_DOCS = "\n),\nremaining as ("


def floor_statement() -> str:
    """The floor: the worker's own claim statement (`claim_batch` in reminders/sql/queries.sql)
    over the whole window at once, returning its totals only. Its `docs` (a batch's documents,
    by id) is the one part the floor replaces (`floor_documents`: the window in one pass), so
    the floor cannot drift from the claim it is the floor of."""
    claim = load(WORKER_SQL)["claim_batch"]
    docs_end = claim.find(CLAIM_AFTER_DOCS)
    final = claim.rfind("\nselect ")  # the statement's own select (its CTEs are indented)
    if not claim.startswith(CLAIM_DOCS) or docs_end < 0 or final < docs_end:
        raise RuntimeError("claim_batch no longer opens with its `docs` CTE and ends with one "
                           "select: bench_reminders.floor_statement must follow it")
    shared = claim[docs_end:final].splitlines()
    while shared[-1].startswith("--"):  # the comment of the select the floor replaces
        shared.pop()
    return (f"{CLAIM_DOCS}\n{bench_query('floor_documents')}" + "\n".join(shared)
            + "\nselect markers_won, events_written from totals")


def _yesterday() -> datetime:
    """Yesterday's UTC midnight: the next day's cycle is then never in the future."""
    today = datetime.now(UTC).date()
    return datetime.combine(today - timedelta(days=1), clock_time(0), tzinfo=UTC)


def _one(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any] | None = None
         ) -> tuple[Any, ...]:
    row = conn.execute(sql, params).fetchone()
    if row is None:
        raise RuntimeError(f"no row from {sql[:60]!r}")
    return tuple(row)


@dataclass(slots=True)
class BenchConfig:
    shape: str
    documents: int
    server_url: str = "postgres://postgres@127.0.0.1:5432"
    database: str = ""
    seed: int = 6
    as_of: datetime = field(default_factory=_yesterday)
    batch_size: int | None = None
    reuse: bool = False
    build_only: bool = False
    logs: Path | None = None
    worker_env: dict[str, str] = field(default_factory=dict)
    pipeline: bool = True
    bootstrap: str | None = None  # a running broker for the pipeline; None: a mock cluster
    documents_per_owner: int = dataset.DOCUMENTS_PER_OWNER
    stale_statistics: bool = False  # first a cold cycle on the data as loaded, never analyzed
    pairs: int = 1  # the floor and the cold cycle, alternated this many times
    # REMINDER_CLAIM_CONNECTIONS of each pair's cold cycles, one cycle each after the floor;
    # empty: one cold cycle a pair, with the worker's environment as given
    claim_connections: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self.database = self.database or f"pin_profile_bench_{self.shape}"

    def url(self, database: str | None = None, user: str | None = None) -> str:
        parts = urlsplit(self.server_url)
        netloc = parts.netloc
        if user is not None:
            netloc = f"{user}@{netloc.rsplit('@', 1)[-1]}"
        return urlunsplit((parts.scheme, netloc, f"/{database or self.database}", "", ""))


@dataclass(slots=True)
class Phase:
    """One timed phase: what the table and the JSON report."""

    name: str
    seconds: float
    window_documents: int | None = None
    due_documents: int | None = None
    markers: int | None = None
    markers_rearmed: int | None = None
    events: int | None = None
    due_per_second: float | None = None
    ratio_to_floor: float | None = None
    ratio_to_analyzed: float | None = None  # the stale cycle against the analyzed cold cycle
    peak_rss_mb: float | None = None
    worker_cpu_seconds: float | None = None
    wall_seconds: float | None = None
    candidate_index: bool | None = None
    full_scan: bool | None = None
    plan: str | None = None
    wal_mb: float | None = None
    checkpoints: int | None = None
    events_on_topic: int | None = None
    events_per_second: float | None = None
    status: str = "ok"
    load: tuple[float, float, float] = field(default_factory=os.getloadavg)


def connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True, options="-c search_path=profile,public")


def window_params(config: BenchConfig, as_of: datetime) -> dict[str, Any]:
    settings = ReminderSettings()
    as_of_date = rules.utc_date(as_of)
    window = rules.scan_window(as_of_date, settings.thresholds, settings.retention_days)
    return {"window_start": window.start, "window_end": window.end,
            "thresholds": list(settings.thresholds), "as_of_date": as_of_date}


# --- the data set -----------------------------------------------------------------------------

def _dataset_tag(config: BenchConfig) -> str:
    per_owner = ("" if config.documents_per_owner == dataset.DOCUMENTS_PER_OWNER
                 else f":{config.documents_per_owner}-per-owner")
    return (f"{config.shape}:{config.documents}:{config.seed}:{config.as_of.date().isoformat()}"
            f"{per_owner}")


def _existing_tag(config: BenchConfig) -> str | None:
    try:
        with connect(config.url()) as conn:
            row = conn.execute("select tag from public.bench_dataset").fetchone()
    except psycopg.Error:
        return None
    return None if row is None else str(row[0])


def build_database(config: BenchConfig) -> Phase:
    """A fresh database: migrations, the documents table, the roles, then the data by COPY."""
    started = time.perf_counter()
    with psycopg.connect(config.url("postgres"), autocommit=True) as admin:
        admin.execute(f'drop database if exists "{config.database}" with (force)')
        admin.execute(f'create database "{config.database}"')
    subprocess.run([sys.executable, str(worker.MANAGE_PY), "migrate", "--noinput", "-v", "0"],
                   check=True, cwd=worker.ROOT,
                   env={**os.environ, "DATABASE_URL": config.url()})
    with connect(config.url()) as conn:
        conn.execute(PERSON_DOCUMENTS_SQL.read_text(encoding="utf-8").encode())
        conn.execute(ROLES_SQL.read_text(encoding="utf-8").encode())
        rows = dataset.document_rows(dataset.shape_named(config.shape), config.documents,
                                     config.as_of.date(), config.seed, config.documents_per_owner)
        if config.stale_statistics:
            # no analyze of it until the stale cycle is over, by the bench or by autovacuum
            conn.execute("alter table person_documents set (autovacuum_enabled = off)")
        copied = dataset.copy_documents(conn, rows, analyze=not config.stale_statistics)
        conn.execute("create table public.bench_dataset (tag text not null)")
        conn.execute("insert into public.bench_dataset values (%s)", (_dataset_tag(config),))
    seconds = time.perf_counter() - started
    return Phase("build (COPY)", seconds, markers=None, events=None,
                 due_documents=None, window_documents=None, status=f"{copied} documents")


def drop_database(config: BenchConfig) -> None:
    with psycopg.connect(config.url("postgres"), autocommit=True) as admin:
        admin.execute(f'drop database if exists "{config.database}" with (force)')


# --- phases -----------------------------------------------------------------------------------

@dataclass(slots=True)
class _Activity:
    """WAL written and checkpoints taken while a phase ran (server-wide: other databases'
    checkpoints count too, as they cost this phase full-page writes)."""

    wal_lsn: str
    checkpoints: int

    @classmethod
    def now(cls, conn: psycopg.Connection[Any]) -> "_Activity":
        row = _one(conn, "select pg_current_wal_lsn()::text,"
                         " checkpoints_timed + checkpoints_req from pg_stat_bgwriter")
        return cls(str(row[0]), int(row[1]))

    def since(self, conn: psycopg.Connection[Any], phase: "Phase") -> "Phase":
        row = _one(conn, "select pg_wal_lsn_diff(pg_current_wal_lsn(), %(lsn)s::pg_lsn),"
                         " checkpoints_timed + checkpoints_req from pg_stat_bgwriter",
                   {"lsn": self.wal_lsn})
        phase.wal_mb = float(row[0]) / 2**20
        phase.checkpoints = int(row[1]) - self.checkpoints
        return phase


def _quiet(conn: psycopg.Connection[Any], *, analyze: bool = True) -> None:
    """Start each timed phase level: statistics fresh (unless not `analyze`: the stale phase),
    dirty pages flushed."""
    if analyze:
        conn.execute("vacuum analyze document_expiry_reminders, outbox_messages")
    conn.execute("checkpoint")


def explain_candidates(conn: psycopg.Connection[Any], params: dict[str, Any]) -> tuple[bool, bool, str]:
    """(uses the partial expiry index, scans person_documents whole, plan summary) of the
    cycle's candidate query: the due owners, with the window's census."""
    worker_queries = load(WORKER_SQL)
    nodes: list[str] = []
    for name in ("due_owners",):
        with conn.transaction(force_rollback=True):  # the worker's session, as store sets it
            conn.execute(worker_queries["tune_session"])
            conn.execute(worker_queries["due_owners_plan"])
            plan = _one(conn, f"explain (format json) {worker_queries[name]}", params)
        nodes += [f"{name}: {node}" for node in _scan_nodes(plan[0][0]["Plan"])]
    uses_index = any(CANDIDATE_INDEX in n for n in nodes)
    full_scan = any("Seq Scan on person_documents" in n for n in nodes)
    return uses_index, full_scan, "; ".join(nodes)


def _scan_nodes(plan: dict[str, Any]) -> Iterator[str]:
    if plan.get("Relation Name") == "person_documents" or plan.get("Index Name") == CANDIDATE_INDEX:
        index = f" using {plan['Index Name']}" if "Index Name" in plan else ""
        yield f"{plan['Node Type']} on {plan.get('Relation Name', 'person_documents')}{index}"
    for child in plan.get("Plans", []):
        yield from _scan_nodes(child)


def seed_renewed_markers(conn: psycopg.Connection[Any], config: BenchConfig,
                         as_of: datetime) -> int:
    """Empty the cycle's output, then leave stale markers as renewals do; how many."""
    conn.execute(bench_query("reset_cycle_output"))
    return conn.execute(bench_query("seed_renewed_markers"), window_params(config, as_of)).rowcount


def _stale_markers(conn: psycopg.Connection[Any]) -> int:
    row = _one(conn, "select count(*) from document_expiry_reminders where run_id = %(run)s",
               {"run": SEED_RUN_ID})
    return int(row[0])


def run_floor(conn: psycopg.Connection[Any], config: BenchConfig, as_of: datetime, *,
              name: str = "floor (1 SQL statement)") -> Phase:
    seeded = seed_renewed_markers(conn, config, as_of)
    _quiet(conn)
    params = {
        **window_params(config, as_of),
        "run_id": uuid.uuid4(),
        **events.envelope_params(as_of),
        "extra_headers": None,  # as the worker without tracing
    }
    activity = _Activity.now(conn)
    started = time.perf_counter()
    row = _one(conn, floor_statement(), params)
    seconds = time.perf_counter() - started
    wal = Phase("", 0.0)
    activity.since(conn, wal)
    window = _one(conn, bench_query("window_documents"), params)
    rearmed = seeded - _stale_markers(conn)
    conn.execute(bench_query("save_floor"))
    markers, events_written = int(row[0]), int(row[1])
    due = _one(conn, "select count(distinct document_id) from public.bench_floor_markers")
    return Phase(name, seconds, window_documents=int(window[0]),
                 due_documents=int(due[0]), markers=markers, markers_rearmed=rearmed,
                 events=events_written,
                 due_per_second=int(due[0]) / seconds if seconds else None, ratio_to_floor=1.0,
                 wal_mb=wal.wal_mb, checkpoints=wal.checkpoints)


def run_worker_phase(conn: psycopg.Connection[Any], config: BenchConfig, name: str, *,
                     as_of: datetime, logs: Path, floor: Phase | None,
                     analyze: bool = True, extra_env: dict[str, str] | None = None) -> Phase:
    _quiet(conn, analyze=analyze)
    uses_index, full_scan, plan = explain_candidates(conn, window_params(config, as_of))
    env = {**config.worker_env, **(extra_env or {})}
    if config.batch_size:
        env["REMINDER_BATCH_SIZE"] = str(config.batch_size)
    activity = _Activity.now(conn)
    run = worker.run_cycle(as_of, config.url(user=WORKER_ROLE),
                           logs / f"{name.replace(' ', '_')}.log", env)
    counters = run.counters
    seconds = counters.get("duration_ms", 0) / 1000
    due = counters.get("due_documents", 0)
    return activity.since(conn, Phase(
        name, seconds,
        window_documents=counters.get("window_documents"), due_documents=due,
        markers=counters.get("markers_written"), markers_rearmed=counters.get("markers_rearmed"),
        events=counters.get("owners_notified"),
        due_per_second=due / seconds if seconds and due else None,
        ratio_to_floor=seconds / floor.seconds if floor and floor.seconds else None,
        peak_rss_mb=run.peak_rss_mb, worker_cpu_seconds=run.cpu_seconds,
        wall_seconds=run.wall_seconds, candidate_index=uses_index, full_scan=full_scan, plan=plan,
        status=f"{run.status} (exit {run.returncode})" if run.returncode or run.status != "succeeded"
        else "succeeded",
    ))


def run_pairs(conn: psycopg.Connection[Any], config: BenchConfig, as_of: datetime, logs: Path,
              log: Any) -> tuple[list[Phase], dict[str, int], bool]:
    """The floor and the cold cycle, `config.pairs` times alternated, each pair on the same
    seeded ledger: their phases, the first pair's comparison (or the first differing pair's),
    and whether every pair's worker wrote the floor's markers and events."""
    phases: list[Phase] = []
    check: dict[str, int] = {}
    equal = True
    for pair in range(1, config.pairs + 1):
        # Alternated, so that the floor and the cycle meet the same hour of the machine:
        # each pair's ratio is the one to read, and the pairs show the spread.
        tag = "" if pair == 1 else f", pair {pair}"
        log(f"floor{tag} ...")
        floor = run_floor(conn, config, as_of, name=f"floor{tag} (1 SQL statement)")
        phases.append(floor)
        log(f"  {floor.seconds:.1f} s")
        for lanes in config.claim_connections or (None,):
            # each cold cycle of the pair from the same seeded ledger, compared with the floor
            what = "" if lanes is None else f", {lanes} connection{'s' if lanes > 1 else ''}"
            seeded = seed_renewed_markers(conn, config, as_of)
            log(f"cold cycle{tag}{what} ({seeded:,} markers of an earlier expiry date to "
                "re-arm) ...")
            phases.append(run_worker_phase(
                conn, config, f"cold cycle{tag}{what}", as_of=as_of, logs=logs, floor=floor,
                extra_env=None if lanes is None else {"REMINDER_CLAIM_CONNECTIONS": str(lanes)}))
            row = _one(conn, bench_query("compare_with_floor"))
            pair_check = {"markers_differing": int(row[0]), "events_differing": int(row[1]),
                          "floor_markers": int(row[2]), "floor_events": int(row[3])}
            pair_equal = not pair_check["markers_differing"] and not pair_check["events_differing"]
            if (pair == 1 and not check) or not pair_equal:
                check = pair_check if pair == 1 else {**pair_check, "pair": pair}
            equal = equal and pair_equal
            log(f"  {phases[-1].seconds:.1f} s ({_fmt(phases[-1].ratio_to_floor, '.2f')}x the "
                f"floor); worker equals floor: {pair_equal} {pair_check}")
    return phases, check, equal


def run_stale_phase(conn: psycopg.Connection[Any], config: BenchConfig, as_of: datetime,
                    logs: Path, log: Any) -> Phase:
    """The cold cycle at once on the data as loaded, no table ever analyzed (the ledger with
    its renewal markers, the outbox empty); its output kept for the comparison with the floor,
    then every table analyzed for the phases after it."""
    seeded = seed_renewed_markers(conn, config, as_of)
    log(f"stale statistics: cold cycle, no table analyzed ({seeded:,} markers to re-arm) ...")
    stale = run_worker_phase(conn, config, "stale statistics: cold", as_of=as_of, logs=logs,
                             floor=None, analyze=False)
    log(f"  {stale.seconds:.1f} s ({stale.status})")
    conn.execute(bench_query("save_stale"))
    conn.execute("alter table person_documents reset (autovacuum_enabled)")
    conn.execute("vacuum analyze person_documents")
    return stale


def run_prune_phase(conn: psycopg.Connection[Any], as_of: datetime, logs: Path,
                    config: BenchConfig) -> Phase:
    _quiet(conn)
    activity = _Activity.now(conn)
    run, seconds = worker.run_prune(as_of + PRUNE_AHEAD, config.url(user=WORKER_ROLE),
                                    logs / "prune.log")
    pruned = run.counters.get("pruned", 0)
    return activity.since(conn, Phase(
        f"prune (as-of + {PRUNE_AHEAD.days} d)", seconds, markers=pruned,
        peak_rss_mb=run.peak_rss_mb, wall_seconds=run.wall_seconds,
        status="succeeded" if run.returncode == 0 else f"exit {run.returncode}"))


# --- the pipeline: documents to events on the topic ----------------------------------------------

PIPELINE_PARTITIONS = 6


@contextmanager
def _kafka(bootstrap: str | None) -> Iterator[str]:
    """The brokers' bootstrap: `bootstrap` if given, else a fresh mock cluster of 3 brokers
    (in this process; the relay reaches it over loopback) with the topic created."""
    if bootstrap is not None:
        yield bootstrap
        return
    from devtools.mock_kafka import MockKafkaCluster

    with MockKafkaCluster(3) as cluster:
        cluster.create_topic(events.TOPIC, PIPELINE_PARTITIONS)
        yield cluster.bootstrap_servers


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


def run_pipeline(conn: psycopg.Connection[Any], config: BenchConfig, as_of: datetime,
                 logs: Path) -> list[Phase]:
    """The cold cycle from the cold cycle's ledger (outbox empty), then one relay pass of
    everything it wrote: each timed inside its process, and the events counted on the topic."""
    seed_renewed_markers(conn, config, as_of)
    cycle = run_worker_phase(conn, config, "pipeline: cycle", as_of=as_of, logs=logs,
                             floor=None)
    if cycle.seconds and cycle.events is not None:
        cycle.events_per_second = cycle.events / cycle.seconds
    with _kafka(config.bootstrap) as bootstrap:
        before = events_on_topic(bootstrap, events.TOPIC)
        _quiet(conn)
        activity = _Activity.now(conn)
        run, reported = worker.run_relay(config.url(user=RELAY_ROLE), bootstrap,
                                         logs / "relay.log")
        on_topic = events_on_topic(bootstrap, events.TOPIC) - before
    seconds = float(reported.get("seconds", 0.0))
    published = int(reported.get("published", 0))
    relay = activity.since(conn, Phase(
        "pipeline: relay", seconds, events=published, events_on_topic=on_topic,
        events_per_second=published / seconds if seconds else None,
        peak_rss_mb=run.peak_rss_mb, worker_cpu_seconds=run.cpu_seconds,
        wall_seconds=run.wall_seconds,
        status="succeeded" if run.returncode == 0 else f"exit {run.returncode}: "
                                                       f"{reported.get('error')}"))
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


@dataclass(slots=True)
class BenchResult:
    shape: str
    documents: int
    database: str
    as_of: str
    batch_size: int
    worker_env: dict[str, str]
    started_at: str
    host: dict[str, Any]
    phases: list[Phase]
    floor_check: dict[str, int]
    worker_equals_floor: bool
    documents_per_owner: int = dataset.DOCUMENTS_PER_OWNER
    stale_statistics: bool = False

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def run_benchmark(config: BenchConfig, log: Any = print) -> BenchResult | None:
    """Build (or reuse) the data set and run every phase; None with --build-only."""
    as_of = config.as_of
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    phases: list[Phase] = []
    # a stale run needs the data as loaded: never reused (an earlier run analyzed it)
    if config.reuse and not config.stale_statistics and _existing_tag(config) == _dataset_tag(config):
        log(f"reusing {config.database} ({_dataset_tag(config)})")
    else:
        log(f"building {config.database}: {config.shape}, {config.documents:,} documents ...")
        phases.append(build_database(config))
        log(f"  built in {phases[-1].seconds:.1f} s")
    if config.build_only:
        return None
    with connect(config.url()) as conn, _log_dir(config.logs) as logs:
        params = window_params(config, as_of)
        in_window = _one(conn, bench_query("window_documents"), params)
        log(f"{in_window[0]:,} documents in the window of {as_of.date()} "
            f"(of {config.documents:,})")
        stale = run_stale_phase(conn, config, as_of, logs, log) if config.stale_statistics \
            else None
        if stale is not None:
            phases.append(stale)
        pairs, check, equal = run_pairs(conn, config, as_of, logs, log)
        phases += pairs
        floor, cold = pairs[0], pairs[1]  # the first pair's
        if stale is not None:
            stale.ratio_to_floor = stale.seconds / floor.seconds if floor.seconds else None
            stale.ratio_to_analyzed = stale.seconds / cold.seconds if cold.seconds else None
            row = _one(conn, bench_query("compare_stale_with_floor"))
            check.update(stale_markers_differing=int(row[0]), stale_events_differing=int(row[1]))
            equal = equal and not row[0] and not row[1]
            log(f"  stale / analyzed: {_fmt(stale.ratio_to_analyzed, '.2f')}x; the stale cycle "
                f"equals the floor: {not row[0] and not row[1]} {check}")
        log("warm cycle ...")
        phases.append(run_worker_phase(conn, config, "warm cycle", as_of=as_of, logs=logs,
                                       floor=None))
        log("next day ...")
        phases.append(run_worker_phase(conn, config, "next day", as_of=as_of + timedelta(days=1),
                                       logs=logs, floor=None))
        log("prune ...")
        phases.append(run_prune_phase(conn, as_of + timedelta(days=1), logs, config))
        if config.pipeline:
            log("pipeline: cycle, then relay ...")
            phases += run_pipeline(conn, config, as_of, logs)
            log(f"  {phases[-1].seconds:.1f} s, {_fmt(phases[-1].events_per_second, ',.0f')}"
                f" events/s end to end ({phases[-1].status})")
    return BenchResult(
        shape=config.shape, documents=config.documents, database=config.database,
        as_of=as_of.isoformat(), batch_size=config.batch_size or ReminderSettings().batch_size,
        worker_env=config.worker_env,
        started_at=started_at,
        host={"cpus": os.cpu_count(), "python": platform.python_version(),
              "postgres": _server_version(config), "load_at_end": os.getloadavg()},
        phases=phases, floor_check=check, worker_equals_floor=equal,
        documents_per_owner=config.documents_per_owner, stale_statistics=config.stale_statistics,
    )


def _server_version(config: BenchConfig) -> str:
    with connect(config.url()) as conn:
        row = conn.execute("show server_version").fetchone()
    return str(row[0]) if row else "?"


@contextmanager
def _log_dir(keep: Path | None) -> Iterator[Path]:
    """Where the worker's logs go: `keep` if given, else a directory removed afterwards."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="bench-reminders-") as path:
        yield Path(path)


# --- report -----------------------------------------------------------------------------------

def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return format(value, spec)


def format_table(result: BenchResult) -> str:
    head = (f"{'phase':<24} {'seconds':>8} {'in window':>10} {'due':>9} {'markers':>9} "
            f"{'re-armed':>8} "
            f"{'events':>8} {'due/s':>8} {'x floor':>7} {'RSS MB':>7} {'cpu s':>6} {'index':>5} "
            f"{'full scan':>9} {'WAL MB':>7} {'ckpts':>5} {'load':>5}  status")
    lines = [f"{result.shape}: {result.documents:,} documents"
             f" ({result.documents_per_owner} per owner), as-of {result.as_of}, "
             f"batch size {result.batch_size}"
             + "".join(f", {k}={v}" for k, v in result.worker_env.items()), head, "-" * len(head)]
    for p in result.phases:
        lines.append(
            f"{p.name:<24} {p.seconds:>8.2f} {_fmt(p.window_documents, ','):>10} "
            f"{_fmt(p.due_documents, ','):>9} {_fmt(p.markers, ','):>9} "
            f"{_fmt(p.markers_rearmed, ','):>8} {_fmt(p.events, ','):>8} "
            f"{_fmt(p.due_per_second, ',.0f'):>8} {_fmt(p.ratio_to_floor, '.2f'):>7} "
            f"{_fmt(p.peak_rss_mb, '.0f'):>7} {_fmt(p.worker_cpu_seconds, '.1f'):>6} "
            f"{_fmt(p.candidate_index):>5} "
            f"{_fmt(p.full_scan):>9} {_fmt(p.wal_mb, ',.0f'):>7} {_fmt(p.checkpoints):>5} "
            f"{p.load[0]:>5.2f}  {p.status}"
        )
    lines.append(f"worker equals floor: {result.worker_equals_floor} {result.floor_check}")
    ratios = [p.ratio_to_floor for p in result.phases
              if p.name.startswith("cold cycle") and p.ratio_to_floor is not None]
    if len(ratios) > 1:
        lines.append("cold cycle / floor, pair by pair: "
                     + ", ".join(f"{r:.2f}x" for r in ratios) + f" (at most {max(ratios):.2f}x)")
    lines += [f"{p.name}: {_fmt(p.ratio_to_analyzed, '.2f')}x the analyzed cold cycle"
              for p in result.phases if p.ratio_to_analyzed is not None]
    pipeline = [p for p in result.phases if p.name.startswith("pipeline")]
    if pipeline:
        head = (f"{'pipeline':<24} {'seconds':>8} {'wall s':>7} {'due':>9} {'events':>8} "
                f"{'on topic':>8} {'events/s':>9} {'RSS MB':>7} {'cpu s':>6} {'load':>5}  status")
        lines += ["", head, "-" * len(head)]
        lines += [
            f"{p.name:<24} {p.seconds:>8.2f} {_fmt(p.wall_seconds, '.2f'):>7} "
            f"{_fmt(p.due_documents, ','):>9} {_fmt(p.events, ','):>8} "
            f"{_fmt(p.events_on_topic, ','):>8} {_fmt(p.events_per_second, ',.0f'):>9} "
            f"{_fmt(p.peak_rss_mb, '.0f'):>7} {_fmt(p.worker_cpu_seconds, '.1f'):>6} "
            f"{p.load[0]:>5.2f}  {p.status}" for p in pipeline]
    return "\n".join(lines)


def _positive(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {raw!r}")
    return value


def _claim_connections(raw: str) -> tuple[int, ...]:
    values = tuple(int(part) for part in raw.split(","))
    if not values or any(v not in (1, 2) for v in values):
        raise argparse.ArgumentTypeError(f"expected values of 1 or 2, like 1,2; got {raw!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--shape", choices=dataset.SHAPES, default="backlog")
    parser.add_argument("-n", "--documents", type=int,
                        help="documents in the data set (default: 1,000,000 backlog, "
                             "10,000,000 steady)")
    parser.add_argument("--server", default=os.environ.get(
        "BENCH_SERVER_URL", "postgres://postgres@127.0.0.1:5432"),
                        help="superuser URL of the server, without database")
    parser.add_argument("--database", default="",
                        help="benchmark database, dropped and created (default "
                             "pin_profile_bench_<shape>)")
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--as-of", type=date.fromisoformat,
                        help="the cold cycle's UTC date (default: yesterday)")
    parser.add_argument("--batch-size", type=int, help="REMINDER_BATCH_SIZE for the worker")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the database if it holds this very data set")
    parser.add_argument("--build-only", action="store_true", help="build the data set and stop")
    parser.add_argument("--json", type=Path, default=RESULTS / "latest.json")
    parser.add_argument("--logs", type=Path, help="keep the worker's logs in this directory")
    parser.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra environment for the worker's cycles, e.g. LOG_LEVEL=WARNING")
    parser.add_argument("--no-pipeline", dest="pipeline", action="store_false",
                        help="skip the pipeline phase (cycle, then relay to Kafka)")
    parser.add_argument("--documents-per-owner", type=int, default=dataset.DOCUMENTS_PER_OWNER,
                        help="documents an owner has on average (default 3; 1: one each)")
    parser.add_argument("--stale-statistics", action="store_true",
                        help="first a cold cycle at once on the data as loaded, no table "
                             "analyzed; then everything as usual, analyzed")
    parser.add_argument("--pairs", type=_positive, default=1, metavar="N",
                        help="run the floor and the cold cycle N times, alternated (each "
                             "pair's ratio, the spread); default 1")
    parser.add_argument("--claim-connections", type=_claim_connections, default=(),
                        metavar="N[,N]",
                        help="each pair's cold cycles, one per value of "
                             "REMINDER_CLAIM_CONNECTIONS after the floor (e.g. 1,2)")
    parser.add_argument("--bootstrap", metavar="HOST:PORT",
                        help="the pipeline's broker (e.g. Tansu); default: librdkafka's "
                             "mock cluster in this process")
    args = parser.parse_args(argv)
    config = BenchConfig(
        shape=args.shape, documents=args.documents or dataset.DEFAULT_SIZES[args.shape],
        server_url=args.server, database=args.database, seed=args.seed,
        as_of=datetime.combine(args.as_of, clock_time(0), tzinfo=UTC) if args.as_of
        else _yesterday(),
        batch_size=args.batch_size, reuse=args.reuse, build_only=args.build_only,
        documents_per_owner=args.documents_per_owner, stale_statistics=args.stale_statistics,
        logs=args.logs, worker_env=dict(item.split("=", 1) for item in args.worker_env),
        pipeline=args.pipeline, bootstrap=args.bootstrap, pairs=args.pairs,
        claim_connections=args.claim_connections,
    )
    result = run_benchmark(config)
    if result is None:
        return 0
    print(format_table(result))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result.as_json(), indent=2, default=str) + "\n")
    print(f"wrote {args.json}")
    return 0 if result.worker_equals_floor else 1


if __name__ == "__main__":
    sys.exit(main())
