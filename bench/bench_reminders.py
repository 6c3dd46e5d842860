"""The reminder worker's benchmark against PostgreSQL's own limit.

    python -m bench.bench_reminders --shape backlog            # N = 1,000,000
    python -m bench.bench_reminders --shape steady             # N = 10,000,000
    python -m bench.bench_reminders --shape backlog -n 100000

Builds the shape's data set with COPY in a fresh database (bench/dataset.py), then times, on
the same data (bench/cycle_phases.py): the floor (the whole cold cycle as one SQL statement:
the worker's claim statement over the whole window, `floor_statement`), the worker's cold
cycle (checked to write exactly the floor's markers and events, headers included), the warm
cycle (same as-of again), the next day (as-of + 1 day) and a prune (a month of expiries at
once). Before the floor and before the cold cycle, about 1 window document in 20 gets markers
of an earlier expiry date (as a renewal leaves them), so both re-arm the same markers
(docs/design.md §3.2, renewal re-arms). The worker runs as production does: `manage.py
run_expiry_reminders` in a subprocess, as the least-privilege role. Then the whole pipeline,
documents to events on the topic (bench/pipeline.py): the cold cycle again from the same
ledger, then one pass of the relay (`publish_outbox`, as its role) to librdkafka's mock cluster
(or the broker at `--bootstrap`), each timed, and the events counted on the topic. Prints a
table and writes JSON (bench/results/latest.json). docs/performance.md explains the figures.

With `--stale-statistics`, a cold cycle first runs at once on the data just loaded, with no
ANALYZE of any table (and autovacuum kept off person_documents meanwhile), as after a bulk
import; then the tables are analyzed and every phase runs as usual, so that the same run has
the stale cycle next to the analyzed one.

With `--pairs N`, the floor and the cold cycle run N times, alternated (floor, cycle, floor,
cycle, ...), each pair on the same seeded ledger: each pair's ratio is read within its own
minutes of the machine, and the pairs show the spread. With `--claim-connections 1,2` each
pair runs a cold cycle per value of REMINDER_CLAIM_CONNECTIONS after its floor (floor, one
connection, two, floor, ...), each from the same seeded ledger.
"""

import argparse
import sys
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench import dataset, harness
from bench.cycle_phases import (
    BenchConfig,
    Phase,
    run_floor,
    run_prune_phase,
    run_worker_phase,
    seed_renewed_markers,
    window_params,
)
from bench.dataset import drop_database
from bench.harness import Log, bench_query, fmt, one
from bench.pipeline import run_pipeline
from reminders.config import ReminderSettings

__all__ = ["BenchConfig", "BenchResult", "drop_database", "format_table", "main",
           "run_benchmark"]


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


@dataclass(slots=True)
class _Comparison:
    """The worker's output against the floor's over the pairs: the first pair's comparison
    (or a differing pair's), and whether every cold cycle equals its floor."""

    check: dict[str, int] = field(default_factory=dict)
    equal: bool = True

    def add(self, conn: psycopg.Connection[Any], pair: int) -> dict[str, int]:
        row = one(conn, bench_query("compare_with_floor"))
        pair_check = {"markers_differing": int(row[0]), "events_differing": int(row[1]),
                      "floor_markers": int(row[2]), "floor_events": int(row[3])}
        pair_equal = not pair_check["markers_differing"] and not pair_check["events_differing"]
        if (pair == 1 and not self.check) or not pair_equal:
            self.check = pair_check if pair == 1 else {**pair_check, "pair": pair}
        self.equal = self.equal and pair_equal
        return pair_check


def _run_pair(conn: psycopg.Connection[Any], config: BenchConfig, pair: int, *, logs: Path,
              log: Log, comparison: _Comparison) -> list[Phase]:
    """The floor, then a cold cycle per claim-connections value, each from the same seeded
    ledger and compared with the floor."""
    as_of = config.as_of
    tag = "" if pair == 1 else f", pair {pair}"
    log(f"floor{tag} ...")
    floor = run_floor(conn, as_of, name=f"floor{tag} (1 SQL statement)")
    phases = [floor]
    log(f"  {floor.seconds:.1f} s")
    for lanes in config.claim_connections or (None,):
        what = "" if lanes is None else f", {lanes} connection{'s' if lanes > 1 else ''}"
        seeded = seed_renewed_markers(conn, as_of)
        log(f"cold cycle{tag}{what} ({seeded:,} markers of an earlier expiry date to "
            "re-arm) ...")
        phases.append(run_worker_phase(
            conn, config, f"cold cycle{tag}{what}", as_of=as_of, logs=logs, floor=floor,
            extra_env=None if lanes is None else {"REMINDER_CLAIM_CONNECTIONS": str(lanes)}))
        pair_check = comparison.add(conn, pair)
        pair_equal = not pair_check["markers_differing"] and not pair_check["events_differing"]
        log(f"  {phases[-1].seconds:.1f} s ({fmt(phases[-1].ratio_to_floor, '.2f')}x the "
            f"floor); worker equals floor: {pair_equal} {pair_check}")
    return phases


def run_pairs(conn: psycopg.Connection[Any], config: BenchConfig, logs: Path, log: Log
              ) -> tuple[list[Phase], _Comparison]:
    """The floor and the cold cycle, `config.pairs` times alternated, each pair on the same
    seeded ledger: their phases, and their comparison with the floor."""
    phases: list[Phase] = []
    comparison = _Comparison()
    for pair in range(1, config.pairs + 1):
        # Alternated, so that the floor and the cycle meet the same hour of the machine:
        # each pair's ratio is the one to read, and the pairs show the spread.
        phases += _run_pair(conn, config, pair, logs=logs, log=log, comparison=comparison)
    return phases, comparison


def run_stale_phase(conn: psycopg.Connection[Any], config: BenchConfig, logs: Path,
                    log: Log) -> Phase:
    """The cold cycle at once on the data as loaded, no table ever analyzed (the ledger with
    its renewal markers, the outbox empty); its output kept for the comparison with the floor,
    then every table analyzed for the phases after it."""
    seeded = seed_renewed_markers(conn, config.as_of)
    log(f"stale statistics: cold cycle, no table analyzed ({seeded:,} markers to re-arm) ...")
    stale = run_worker_phase(conn, config, "stale statistics: cold", as_of=config.as_of,
                             logs=logs, floor=None, analyze=False)
    log(f"  {stale.seconds:.1f} s ({stale.status})")
    conn.execute(bench_query("save_stale"))
    conn.execute("alter table person_documents reset (autovacuum_enabled)")
    conn.execute("vacuum analyze person_documents")
    return stale


def _compare_stale(conn: psycopg.Connection[Any], stale: Phase, floor: Phase, cold: Phase, *,
                   comparison: _Comparison, log: Log) -> None:
    """The stale cycle against the first pair's floor and cold cycle."""
    stale.ratio_to_floor = stale.seconds / floor.seconds if floor.seconds else None
    stale.ratio_to_analyzed = stale.seconds / cold.seconds if cold.seconds else None
    row = one(conn, bench_query("compare_stale_with_floor"))
    comparison.check.update(stale_markers_differing=int(row[0]),
                            stale_events_differing=int(row[1]))
    comparison.equal = comparison.equal and not row[0] and not row[1]
    log(f"  stale / analyzed: {fmt(stale.ratio_to_analyzed, '.2f')}x; the stale cycle "
        f"equals the floor: {not row[0] and not row[1]} {comparison.check}")


def _run_phases(conn: psycopg.Connection[Any], config: BenchConfig, logs: Path, log: Log
                ) -> tuple[list[Phase], _Comparison]:
    """Every phase on the built data set, in order."""
    as_of = config.as_of
    in_window = one(conn, bench_query("window_documents"), window_params(as_of))
    log(f"{in_window[0]:,} documents in the window of {as_of.date()} (of {config.documents:,})")
    stale = run_stale_phase(conn, config, logs, log) if config.stale_statistics else None
    pairs, comparison = run_pairs(conn, config, logs, log)
    if stale is not None:
        _compare_stale(conn, stale, pairs[0], pairs[1],  # the first pair's
                       comparison=comparison, log=log)
    phases = [*([stale] if stale is not None else []), *pairs]
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
        log(f"  {phases[-1].seconds:.1f} s, {fmt(phases[-1].events_per_second, ',.0f')}"
            f" events/s end to end ({phases[-1].status})")
    return phases, comparison


def run_benchmark(config: BenchConfig, log: Log = print) -> BenchResult | None:
    """Build (or reuse) the data set and run every phase; None with --build-only."""
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    phases: list[Phase] = []
    built = dataset.prepare(config, log)
    if built is not None:
        phases.append(Phase("build (COPY)", built[0], status=f"{built[1]} documents"))
    if config.build_only:
        return None
    with harness.connect(config.url()) as conn, harness.log_dir(config.logs,
                                                                 "bench-reminders-") as logs:
        measured, comparison = _run_phases(conn, config, logs, log)
        server = str(one(conn, "show server_version")[0])
    return BenchResult(
        shape=config.shape, documents=config.documents, database=config.database,
        as_of=config.as_of.isoformat(),
        batch_size=config.batch_size or ReminderSettings().batch_size,
        worker_env=config.worker_env, started_at=started_at, host=harness.host(server),
        phases=phases + measured, floor_check=comparison.check,
        worker_equals_floor=comparison.equal, documents_per_owner=config.documents_per_owner,
        stale_statistics=config.stale_statistics,
    )


# --- report -----------------------------------------------------------------------------------

_HEAD = (f"{'phase':<24} {'seconds':>8} {'in window':>10} {'due':>9} {'markers':>9} "
         f"{'re-armed':>8} {'events':>8} {'due/s':>8} {'x floor':>7} {'RSS MB':>7} {'cpu s':>6} "
         f"{'index':>5} {'full scan':>9} {'WAL MB':>7} {'ckpts':>5} {'load':>5}  status")
_PIPELINE_HEAD = (f"{'pipeline':<24} {'seconds':>8} {'wall s':>7} {'due':>9} {'events':>8} "
                  f"{'on topic':>8} {'events/s':>9} {'RSS MB':>7} {'cpu s':>6} {'load':>5}  "
                  "status")


def _phase_line(p: Phase) -> str:
    return (f"{p.name:<24} {p.seconds:>8.2f} {fmt(p.window_documents, ','):>10} "
            f"{fmt(p.due_documents, ','):>9} {fmt(p.markers, ','):>9} "
            f"{fmt(p.markers_rearmed, ','):>8} {fmt(p.events, ','):>8} "
            f"{fmt(p.due_per_second, ',.0f'):>8} {fmt(p.ratio_to_floor, '.2f'):>7} "
            f"{fmt(p.peak_rss_mb, '.0f'):>7} {fmt(p.worker_cpu_seconds, '.1f'):>6} "
            f"{fmt(p.candidate_index):>5} "
            f"{fmt(p.full_scan):>9} {fmt(p.wal_mb, ',.0f'):>7} {fmt(p.checkpoints):>5} "
            f"{p.load[0]:>5.2f}  {p.status}")


def _pipeline_line(p: Phase) -> str:
    return (f"{p.name:<24} {p.seconds:>8.2f} {fmt(p.wall_seconds, '.2f'):>7} "
            f"{fmt(p.due_documents, ','):>9} {fmt(p.events, ','):>8} "
            f"{fmt(p.events_on_topic, ','):>8} {fmt(p.events_per_second, ',.0f'):>9} "
            f"{fmt(p.peak_rss_mb, '.0f'):>7} {fmt(p.worker_cpu_seconds, '.1f'):>6} "
            f"{p.load[0]:>5.2f}  {p.status}")


def _ratio_lines(result: BenchResult) -> list[str]:
    """The pairs' ratios to their floor (with more than one), the stale cycle's to the
    analyzed one."""
    ratios = [p.ratio_to_floor for p in result.phases
              if p.name.startswith("cold cycle") and p.ratio_to_floor is not None]
    lines = []
    if len(ratios) > 1:
        lines.append("cold cycle / floor, pair by pair: "
                     + ", ".join(f"{r:.2f}x" for r in ratios) + f" (at most {max(ratios):.2f}x)")
    return lines + [f"{p.name}: {fmt(p.ratio_to_analyzed, '.2f')}x the analyzed cold cycle"
                    for p in result.phases if p.ratio_to_analyzed is not None]


def format_table(result: BenchResult) -> str:
    title = (f"{result.shape}: {result.documents:,} documents"
             f" ({result.documents_per_owner} per owner), as-of {result.as_of}, "
             f"batch size {result.batch_size}"
             + "".join(f", {k}={v}" for k, v in result.worker_env.items()))
    lines = [title, _HEAD, "-" * len(_HEAD), *map(_phase_line, result.phases),
             f"worker equals floor: {result.worker_equals_floor} {result.floor_check}",
             *_ratio_lines(result)]
    pipeline = [p for p in result.phases if p.name.startswith("pipeline")]
    if pipeline:
        lines += ["", _PIPELINE_HEAD, "-" * len(_PIPELINE_HEAD), *map(_pipeline_line, pipeline)]
    return "\n".join(lines)


# --- the command line -------------------------------------------------------------------------

def _claim_connections(raw: str) -> tuple[int, ...]:
    values = tuple(int(part) for part in raw.split(","))
    if not values or any(v not in (1, 2) for v in values):
        raise argparse.ArgumentTypeError(f"expected values of 1 or 2, like 1,2; got {raw!r}")
    return values


def _parser() -> argparse.ArgumentParser:
    parser = harness.parser_for(__doc__)
    dataset.add_arguments(parser, default_shape="backlog")
    parser.add_argument("--batch-size", type=int, help="REMINDER_BATCH_SIZE for the worker")
    parser.add_argument("--build-only", action="store_true", help="build the data set and stop")
    parser.add_argument("--json", type=Path, default=harness.RESULTS / "latest.json")
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
    parser.add_argument("--pairs", type=harness.positive, default=1, metavar="N",
                        help="run the floor and the cold cycle N times, alternated (each "
                             "pair's ratio, the spread); default 1")
    parser.add_argument("--claim-connections", type=_claim_connections, default=(),
                        metavar="N[,N]",
                        help="each pair's cold cycles, one per value of "
                             "REMINDER_CLAIM_CONNECTIONS after the floor (e.g. 1,2)")
    parser.add_argument("--bootstrap", metavar="HOST:PORT",
                        help="the pipeline's broker (e.g. Tansu); default: librdkafka's "
                             "mock cluster in this process")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    config = BenchConfig(
        **dataset.config_fields(args), batch_size=args.batch_size, build_only=args.build_only,
        documents_per_owner=args.documents_per_owner, stale_statistics=args.stale_statistics,
        logs=args.logs, worker_env=dict(item.split("=", 1) for item in args.worker_env),
        pipeline=args.pipeline, bootstrap=args.bootstrap, pairs=args.pairs,
        claim_connections=args.claim_connections,
    )
    result = run_benchmark(config)
    if result is None:
        return 0
    print(format_table(result))
    harness.write_json(args.json, result.as_json())
    print(f"wrote {args.json}")
    return 0 if result.worker_equals_floor else 1


if __name__ == "__main__":
    sys.exit(main())
