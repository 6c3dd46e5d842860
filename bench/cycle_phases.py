"""The cycle benchmark's timed phases (bench/bench_reminders.py runs them): the floor (the
whole cold cycle as one SQL statement), a cycle of the worker as a subprocess, and a prune.

The floor is the worker's own claim statement (`claim_batch` in reminders/sql/queries.sql)
over the whole window at once: `floor_statement` splices it, so it cannot drift from the claim
it is the floor of. Before each, `seed_renewed_markers` leaves the markers a renewal leaves
(docs/design.md §3.2, renewal re-arms), so both re-arm the same markers.
"""

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench import worker
from bench.dataset import DatasetConfig
from bench.harness import Activity, bench_query, one, quiet
from core.queries import load
from core.roles import WORKER_ROLE
from reminders import events, rules
from reminders.config import ReminderSettings

# The worker's named queries, read as a file: the benchmark runs the worker as a subprocess.
WORKER_SQL = Path(__file__).resolve().parent.parent / "reminders" / "sql" / "queries.sql"
SEED_RUN_ID = "00000000-0000-4000-8000-000000000000"  # the run id of seed_renewed_markers
CANDIDATE_INDEX = "ix_person_documents_expires_at"
PRUNE_AHEAD = timedelta(days=30)
CLAIM_DOCS = "with docs as materialized ("  # claim_batch's first CTE: the batch's documents
CLAIM_AFTER_DOCS = "\n),\nremaining as ("


@dataclass(slots=True)
class BenchConfig(DatasetConfig):
    """The data set, and how the cycle benchmark runs on it."""

    batch_size: int | None = None
    build_only: bool = False
    logs: Path | None = None
    worker_env: dict[str, str] = field(default_factory=dict)
    pipeline: bool = True
    bootstrap: str | None = None  # a running broker for the pipeline; None: a mock cluster
    pairs: int = 1  # the floor and the cold cycle, alternated this many times
    # REMINDER_CLAIM_CONNECTIONS of each pair's cold cycles, one cycle each after the floor;
    # empty: one cold cycle a pair, with the worker's environment as given
    claim_connections: tuple[int, ...] = ()


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

    def wrote(self, conn: psycopg.Connection[Any], activity: Activity) -> "Phase":
        """This phase with the WAL and checkpoints since `activity`."""
        self.wal_mb, self.checkpoints = activity.since(conn)
        return self


def window_params(as_of: datetime) -> dict[str, Any]:
    """The scan window of `as_of` with the worker's default settings, as query parameters."""
    settings = ReminderSettings()
    as_of_date = rules.utc_date(as_of)
    window = rules.scan_window(as_of_date, settings.thresholds, settings.retention_days)
    return {"window_start": window.start, "window_end": window.end,
            "thresholds": list(settings.thresholds), "as_of_date": as_of_date}


# --- the floor --------------------------------------------------------------------------------

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
                           "select: bench.cycle_phases.floor_statement must follow it")
    shared = claim[docs_end:final].splitlines()
    while shared[-1].startswith("--"):  # the comment of the select the floor replaces
        shared.pop()
    return (f"{CLAIM_DOCS}\n{bench_query('floor_documents')}" + "\n".join(shared)
            + "\nselect markers_won, events_written from totals")


def seed_renewed_markers(conn: psycopg.Connection[Any], as_of: datetime) -> int:
    """Empty the cycle's output, then leave stale markers as renewals do; how many."""
    conn.execute(bench_query("reset_cycle_output"))
    return conn.execute(bench_query("seed_renewed_markers"), window_params(as_of)).rowcount


def _stale_markers(conn: psycopg.Connection[Any]) -> int:
    row = one(conn, "select count(*) from document_expiry_reminders where run_id = %(run)s",
              {"run": SEED_RUN_ID})
    return int(row[0])


def run_floor(conn: psycopg.Connection[Any], as_of: datetime, *,
              name: str = "floor (1 SQL statement)") -> Phase:
    seeded = seed_renewed_markers(conn, as_of)
    quiet(conn)
    params = {
        **window_params(as_of),
        "run_id": uuid.uuid4(),
        **events.envelope_params(as_of),
        "extra_headers": None,  # as the worker without tracing
    }
    activity = Activity.now(conn)
    started = time.perf_counter()
    row = one(conn, floor_statement(), params)
    seconds = time.perf_counter() - started
    wal_mb, checkpoints = activity.since(conn)
    window = one(conn, bench_query("window_documents"), params)
    rearmed = seeded - _stale_markers(conn)
    conn.execute(bench_query("save_floor"))
    due = int(one(conn, "select count(distinct document_id) from public.bench_floor_markers")[0])
    return Phase(name, seconds, window_documents=int(window[0]), due_documents=due,
                 markers=int(row[0]), markers_rearmed=rearmed, events=int(row[1]),
                 due_per_second=due / seconds if seconds else None, ratio_to_floor=1.0,
                 wal_mb=wal_mb, checkpoints=checkpoints)


# --- the worker's commands --------------------------------------------------------------------

def explain_candidates(conn: psycopg.Connection[Any], params: dict[str, Any]) -> tuple[bool, bool, str]:
    """(uses the partial expiry index, scans person_documents whole, plan summary) of the
    cycle's candidate query: the due owners, with the window's census."""
    worker_queries = load(WORKER_SQL)
    nodes: list[str] = []
    for name in ("due_owners",):
        with conn.transaction(force_rollback=True):  # the worker's session, as store sets it
            conn.execute(worker_queries["tune_session"])
            conn.execute(worker_queries["due_owners_plan"])
            plan = one(conn, f"explain (format json) {worker_queries[name]}", params)
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


def run_worker_phase(conn: psycopg.Connection[Any], config: BenchConfig, name: str, *,
                     as_of: datetime, logs: Path, floor: Phase | None,
                     analyze: bool = True, extra_env: dict[str, str] | None = None) -> Phase:
    """One cycle of the worker at `as_of`, as its role in a subprocess; against `floor`'s
    seconds if given."""
    quiet(conn, analyze=analyze)
    uses_index, full_scan, plan = explain_candidates(conn, window_params(as_of))
    env = {**config.worker_env, **(extra_env or {})}
    if config.batch_size:
        env["REMINDER_BATCH_SIZE"] = str(config.batch_size)
    activity = Activity.now(conn)
    run = worker.run_cycle(as_of, config.url(user=WORKER_ROLE),
                           logs / f"{name.replace(' ', '_')}.log", env)
    counters = run.counters
    seconds = counters.get("duration_ms", 0) / 1000
    due = counters.get("due_documents", 0)
    return Phase(
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
    ).wrote(conn, activity)


def run_prune_phase(conn: psycopg.Connection[Any], as_of: datetime, logs: Path,
                    config: BenchConfig) -> Phase:
    """The worker's prune at `as_of` + PRUNE_AHEAD: a month of expiries at once."""
    quiet(conn)
    activity = Activity.now(conn)
    run, seconds = worker.run_prune(as_of + PRUNE_AHEAD, config.url(user=WORKER_ROLE),
                                    logs / "prune.log")
    pruned = run.counters.get("pruned", 0)
    return Phase(
        f"prune (as-of + {PRUNE_AHEAD.days} d)", seconds, markers=pruned,
        peak_rss_mb=run.peak_rss_mb, wall_seconds=run.wall_seconds,
        status="succeeded" if run.returncode == 0 else f"exit {run.returncode}",
    ).wrote(conn, activity)
