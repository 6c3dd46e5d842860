"""The audit's cost: `manage.py audit_reminders`, as its role in a subprocess, timed
(wall seconds, peak RSS) on a benchmark data set after the worker's cycles.

    python -m bench.audit_bench --shape steady                     # 10M documents, steady
    python -m bench.audit_bench --shape backlog -n 300000 --topic  # ~1M markers, ~100k events

Builds (or with --reuse keeps) the data set as bench.bench_reminders does, runs the cold cycle
and the next day's cycle as the worker (the next day's recorded as a loop cycle, which the
left-behind check audits), then the audit twice (the first on a cold cache after the cycles,
the second warm). With --topic: one relay pass of the outbox to a Tansu broker process
(memory storage, no schema registry), then the audit with --against-topic, twice. Each audit
must be clean. Prints a table and writes JSON (bench/results/audit-latest.json).
"""

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import dataset, harness, worker
from bench.dataset import DatasetConfig
from bench.harness import RESULTS, Log, connect, one, quiet
from core.roles import AUDITOR_ROLE, RELAY_ROLE, ROLES_SQL, WORKER_ROLE


@dataclass(slots=True)
class AuditPhase:
    name: str
    wall_seconds: float
    peak_rss_mb: float
    cpu_seconds: float
    exit_code: int
    findings: int | None = None
    examined: dict[str, dict[str, int]] = field(default_factory=dict)
    load: tuple[float, float, float] = field(default_factory=os.getloadavg)


def _audit(name: str, config: DatasetConfig, logs: Path, *args: str,
           env: dict[str, str] | None = None) -> AuditPhase:
    run = worker.run_command(["audit_reminders", "--format", "json", *args],
                             config.url(user=AUDITOR_ROLE), logs / f"{name}.log", env)
    out = (logs / f"{name}.out").read_text()
    body: dict[str, Any] = json.loads(out) if out.strip().startswith("{") else {}
    return AuditPhase(name, run.wall_seconds, run.peak_rss_mb, run.cpu_seconds, run.returncode,
                      body.get("findings"),
                      {c["name"]: c["examined"] for c in body.get("checks", [])})


def _cycles(config: DatasetConfig, logs: Path, log: Log) -> dict[str, int]:
    """The cold cycle, then the next day's as a loop cycle; the ledger's and outbox's sizes."""
    with connect(config.url()) as conn:
        # the audit role of this version, on a data set built before it
        conn.execute(ROLES_SQL.read_text(encoding="utf-8").encode())
        markers = int(one(conn, "select count(*) from document_expiry_reminders")[0])
    if markers == 0:
        for as_of in (config.as_of, config.as_of + timedelta(days=1)):
            log(f"cycle as of {as_of.date()} ...")
            run = worker.run_cycle(as_of, config.url(user=WORKER_ROLE),
                                   logs / f"cycle-{as_of.date()}.log")
            log(f"  {run.wall_seconds:.1f} s, {run.counters}")
        with connect(config.url()) as conn:
            # a manual run stands in for the loop's tick (the audit checks the last loop cycle)
            conn.execute("update document_expiry_reminder_runs set trigger = 'loop', tick = as_of"
                         " where as_of = %s", (config.as_of + timedelta(days=1),))
    with connect(config.url()) as conn:
        conn.execute("vacuum analyze")
        quiet(conn)
        return {
            "documents": int(one(conn, "select count(*) from person_documents")[0]),
            "ledger_rows": int(one(conn, "select count(*) from document_expiry_reminders")[0]),
            "outbox_events": int(one(conn, "select count(*) from outbox_messages")[0]),
        }


def _log_audit(name: str, phase: AuditPhase, log: Log) -> AuditPhase:
    log(f"{name}: {phase.wall_seconds:.1f} s, {phase.peak_rss_mb:.0f} MB, "
        f"findings {phase.findings}")
    return phase


def _against_topic(config: DatasetConfig, logs: Path, log: Log
                   ) -> tuple[dict[str, Any], list[AuditPhase]]:
    """One relay pass of the outbox to a fresh Tansu broker, then the audit --against-topic
    twice: what the relay reported, the audits."""
    from tests.support.tansu_support import TansuBroker

    with connect(config.url()) as conn:
        # a fresh broker each run: the relay's stream starts over (a bench, not a fault)
        conn.execute("update outbox_relay_position set (txid, seq) = ('0'::xid8, 0)")
        conn.execute("delete from outbox_relay_batches")
    phases = []
    with TansuBroker(logs / "tansu", schema_registry=False).start() as broker:
        log("relay pass to Tansu ...")
        _relay_run, relay = worker.run_relay(config.url(user=RELAY_ROLE),
                                             broker.bootstrap_servers, logs / "relay.log")
        log(f"  {relay}")
        env = {"KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers}
        for name in ("audit --against-topic (1)", "audit --against-topic (2)"):
            phases.append(_log_audit(name, _audit(
                name.replace(" ", "_"), config, logs, "--against-topic", "--kafka-timeout", "30m",
                env=env), log))
    return relay, phases


def run(config: DatasetConfig, *, topic: bool, logs: Path, log: Log = print,
        database_audits: bool = True) -> dict[str, Any]:
    dataset.prepare(config, log)
    sizes = _cycles(config, logs, log)
    log(f"sizes: {sizes}")
    phases = [_log_audit(name, _audit(name.replace(" ", "_"), config, logs), log)
              for name in (("audit (cold)", "audit (warm)") if database_audits else ())]
    relay: dict[str, Any] = {}
    if topic:
        relay, against = _against_topic(config, logs, log)
        phases += against
    with connect(config.url()) as conn:
        server = str(one(conn, "show server_version")[0])
    return {
        "shape": config.shape, "documents": config.documents, "database": config.database,
        "as_of": config.as_of.isoformat(), "sizes": sizes, "relay": relay,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": harness.host(server), "phases": [asdict(p) for p in phases],
    }


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser_for(__doc__)
    dataset.add_arguments(parser, default_shape="steady")
    parser.add_argument("--topic", action="store_true",
                        help="also publish to Tansu and audit --against-topic")
    parser.add_argument("--topic-only", action="store_true",
                        help="with --topic: skip the audits without it")
    parser.add_argument("--logs", type=Path, default=RESULTS.parent / ".audit-logs",
                        help="the commands' logs and output (bench/.audit-logs)")
    parser.add_argument("--json", type=Path, default=RESULTS / "audit-latest.json")
    args = parser.parse_args(argv)
    config = DatasetConfig(**dataset.config_fields(args))
    args.logs.mkdir(parents=True, exist_ok=True)
    result = run(config, topic=args.topic, logs=args.logs, database_audits=not args.topic_only)
    for p in result["phases"]:
        print(f"{p['name']:<28} {p['wall_seconds']:>7.1f} s {p['peak_rss_mb']:>6.0f} MB "
              f"cpu {p['cpu_seconds']:>5.1f} s  exit {p['exit_code']}  findings {p['findings']}")
    harness.write_json(args.json, result)
    print(f"wrote {args.json}")
    return 0 if all(p["exit_code"] == 0 for p in result["phases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
