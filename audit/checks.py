"""The audit (docs/operations.md, "Auditing the reminders"): the promises the tests hold,
checked read-only on the live ledger, outbox and relay state, in one database snapshot, and,
with a Kafka reader, against the topic.

1. the ledger and the outbox agree over the window (`ledger_outbox`);
2. nothing due was left behind by the last succeeded loop cycle (`left_behind`);
3. the relay's state: its position (`relay_position`), waits (`relay_waits`), parked rows
   (`parked`);
4. the outbox against the topic (`topic`, audit.topic).
"""

import dataclasses
import time as time_module
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

from django.db import transaction

from audit.report import AuditReport, CheckResult, Finding, Status
from audit.topic import TopicEvent, TopicReader, reconcile
from core.db import one, server_cursor
from core.queries import QueryFile
from outbox import store as outbox_store
from reminders import events, rules
from reminders.config import parse_thresholds
from reminders.models import SUCCESSFUL_STATUSES

QUERIES = QueryFile(Path(__file__).parent / "sql" / "queries.sql")
UUID_PATTERN = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
DEFAULT_SINCE = timedelta(days=7)
# the checks' names, in the order they run and print, and the findings each may report
FINDINGS: dict[str, tuple[str, ...]] = {
    "ledger_outbox": ("marker_without_event", "event_without_marker", "notified_twice"),
    "left_behind": ("left_behind",),
    "relay_position": ("position_of_another_cluster", "position_ahead"),
    "relay_waits": ("waited_too_long",),
    "parked": ("parked",),
    "topic": ("missing_from_topic", "unknown_on_topic", "duplicated_on_topic", "out_of_order"),
}


@dataclass(frozen=True, slots=True)
class AuditOptions:
    """What to audit: the window (`since` before `as_of`), the bounds, how many ids to list."""

    as_of: datetime
    since: timedelta = DEFAULT_SINCE
    retention_days: int = 90  # REMINDER_RETENTION_DAYS: markers older are pruned
    outbox_retention: timedelta = timedelta(days=7)  # OUTBOX_RETENTION: events older are pruned
    max_wait: timedelta = timedelta(hours=26)  # no event waits longer for the relay
    limit: int = 20  # ids listed per finding (the counts are whole)
    # an owner whose event is this full had the rest of its due documents left for the next cycle
    max_documents_per_event: int = events.MAX_DOCUMENTS_PER_EVENT
    topic_reader: TopicReader | None = None  # --against-topic


def run_audit(options: AuditOptions, using: str = "default") -> AuditReport:
    """Every check; the database ones in one read-only snapshot, then the topic's."""
    with transaction.atomic(using=using):
        with server_cursor(using) as cur:
            cur.execute(QUERIES["audit_snapshot"])
            cur.execute(QUERIES["audit_session"])
            cur.execute(QUERIES["snapshot_clock"])
            now: datetime = one(cur)[0]
        since, notes = _window_start(options, now)
        pruned_as_of = _pruned_as_of(using)
        pruned_before = (rules.prune_cutoff(rules.utc_date(pruned_as_of), options.retention_days)
                         if pruned_as_of else None)
        checks = [
            _timed(check_ledger_outbox, using, options, since, pruned_before),
            _timed(check_left_behind, using, options),
            _timed(check_relay_position, using),
            _timed(check_relay_waits, using, options, since, now),
            _timed(check_parked, using, options),
        ]
        started = time_module.perf_counter()
        table = _window_events(using, since, options.as_of) if options.topic_reader else None
        table_seconds = time_module.perf_counter() - started
    if options.topic_reader is not None and table is not None:
        topic = _timed(check_topic, options, since, table, using)
        checks.append(dataclasses.replace(topic, seconds=topic.seconds + table_seconds))
    else:
        checks.append(CheckResult("topic", "outbox against the topic", Status.NOT_CHECKED,
                                  note="not asked (--against-topic)"))
    return AuditReport(as_of=options.as_of, since=since, database_now=now, checks=checks,
                       notes=notes)


def _timed(check: Callable[..., CheckResult], *args: Any) -> CheckResult:
    started = time_module.perf_counter()
    result = check(*args)
    return dataclasses.replace(result, seconds=time_module.perf_counter() - started)


def _window_start(options: AuditOptions, now: datetime) -> tuple[datetime, list[str]]:
    """`as_of - since`, no earlier than the outbox's retention allows (older events may be
    pruned, and their markers would look unmatched)."""
    wanted = options.as_of - options.since
    floor = now - options.outbox_retention
    if wanted < floor:
        return floor, [f"window starts at {floor.isoformat()}, not {wanted.isoformat()}: "
                       f"events older than OUTBOX_RETENTION ({options.outbox_retention}) may "
                       "have been pruned"]
    return wanted, []


def _rows(using: str, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    with server_cursor(using) as cur:
        cur.execute(QUERIES[name], params)
        return [tuple(r) for r in cur.fetchall()]


def _pruned_as_of(using: str) -> datetime | None:
    """The as-of of the newest cycle that pruned: markers before its cutoff may be gone."""
    [(latest,)] = _rows(using, "latest_pruning_run",
                        {"pruning_statuses": sorted(SUCCESSFUL_STATUSES)})
    return latest  # type: ignore[no-any-return]


# --- 1. the ledger and the outbox ----------------------------------------------------------

def check_ledger_outbox(using: str, options: AuditOptions, since: datetime,
                        pruned_before: date | None) -> CheckResult:
    rows = _rows(using, "ledger_outbox_findings", {
        "since": since, "until": options.as_of, "event_type": events.EVENT_TYPE,
        "pruned_before": (pruned_before or date.min).isoformat(),
        "uuid_pattern": UUID_PATTERN,
    })
    found: dict[str, list[dict[str, Any]]] = {"marker_without_event": [],
                                              "event_without_marker": [], "notified_twice": []}
    examined: dict[str, int] = {}
    for kind, document, threshold, expires, run, message in rows:
        if kind == "counted":
            examined = {"runs": int(run), "events": int(expires), "event_items": int(threshold),
                        "notified_markers": int(document)}
            continue
        item = {"document": document, "threshold": threshold, "expires": expires}
        if kind == "notified_twice":
            item |= {"runs": run, "events": message}
        else:
            item |= {"run": run} | ({"event": message} if message else {})
        found[kind].append(item)
    limit = options.limit
    return CheckResult.of("ledger_outbox", "ledger and outbox agree", examined, [
        Finding("marker_without_event", len(found["marker_without_event"]),
                "a notified marker that no event of its run lists at its threshold and expiry: "
                "the ledger says told, the outbox never had it",
                "delete the listed markers after checking the investors were not told "
                "(run_expiry_reminders re-reminds them)", found["marker_without_event"][:limit]),
        Finding("event_without_marker", len(found["event_without_marker"]),
                "an event lists a document whose marker of that run is missing: the next cycle "
                "may tell the investor again",
                "find what deleted the markers (a restore, a manual delete); the events were "
                "sent, so consumers deduplicate a repeat", found["event_without_marker"][:limit]),
        Finding("notified_twice", len(found["notified_twice"]),
                "the same (document, threshold, expiry) in more than one event",
                "consumers deduplicate by that key; find the run that repeated it (two "
                "databases, a restore of the ledger without the outbox)",
                found["notified_twice"][:limit]),
    ])


# --- 2. nothing due left behind --------------------------------------------------------------

def check_left_behind(using: str, options: AuditOptions) -> CheckResult:
    title = "nothing due left behind by the last cycle"
    cycles = _rows(using, "last_loop_cycle", {"pruning_statuses": sorted(SUCCESSFUL_STATUSES)})
    if not cycles:
        return CheckResult("left_behind", title, Status.NOT_CHECKED,
                           note="no succeeded loop cycle in the run history")
    run_id, as_of, started_at, thresholds_text, pruned_as_of = cycles[0]
    thresholds = parse_thresholds("thresholds", thresholds_text)
    as_of_date = rules.utc_date(as_of)
    window = rules.scan_window(as_of_date, thresholds, options.retention_days)
    # markers a later cycle pruned (their expiry left its retention) are not a lost reminder
    prune_floor = datetime.combine(
        rules.prune_cutoff(rules.utc_date(pruned_as_of or as_of), options.retention_days),
        time(0), tzinfo=UTC)
    rows = _rows(using, "left_behind", {
        "window_start": max(window.start, prune_floor), "window_end": window.end,
        "thresholds": list(thresholds), "as_of_date": as_of_date, "started_at": started_at,
        "run_id": str(run_id), "event_type": events.EVENT_TYPE,
        "max_documents": options.max_documents_per_event,
    })
    left = [r for r in rows if not r[3]]
    changed = len(rows) - len(left)
    note = (f"cycle {run_id} as of {as_of.isoformat()}, started {started_at.isoformat()}; "
            f"{changed} due document(s) changed since it started are excepted")
    return CheckResult.of("left_behind", title, {"due_unmarked": len(left),
                                                 "changed_since": changed}, [
        Finding("left_behind", len(left),
                "a document due at the cycle's as-of, unchanged since, without its marker: "
                "its investor was not reminded",
                "run manage.py run_expiry_reminders (the manual re-trigger) and audit again; "
                "if it stays, the cycle misses it: report it with the ids",
                [{"document": str(d), "owner": str(o), "expires": str(e)}
                 for d, o, e, _ in left[:options.limit]]),
    ], note)


# --- 3. the relay --------------------------------------------------------------------------

def check_relay_position(using: str) -> CheckResult:
    """The stream position belongs to this cluster and is not ahead of its transaction ids
    (outbox.store.stream_cluster, read only: nothing is re-based)."""
    cluster = outbox_store.stream_cluster(using)
    ids = [{"recorded_system": cluster.recorded_system, "this_system": cluster.this_system,
            "newest_txid": cluster.newest_txid, "next_txid": cluster.next_txid}]
    moved = cluster.recorded_system != cluster.this_system
    note = (f"moved from cluster {cluster.previous_system} at {cluster.changed_at.isoformat()}"
            if cluster.changed_at is not None and cluster.previous_system is not None else "")
    return CheckResult.of("relay_position", "relay position belongs to this cluster",
                          {"positions": 1}, [
        Finding("position_of_another_cluster", int(moved),
                "the stream's ids were stamped on another cluster (a dump restored here, a "
                "logical-replication cut-over, pg_upgrade) and nothing was written or relayed "
                "here since: the first insert or relay pass records the move, re-basing the "
                "stream if this cluster's ids are behind",
                "let one relay pass run (docs/outbox-relay.md, 'The stream on a new cluster'), "
                "then audit again with --against-topic",
                ids if moved else []),
        Finding("position_ahead", int(not moved and cluster.ahead),
                "stored stream ids are at or past this cluster's next transaction id: rows "
                "written now would sort behind the position and never be sent",
                "follow docs/runbooks/outbox-backlog.md, 'The stream is ahead of its "
                "cluster'",
                ids if not moved and cluster.ahead else []),
    ], note)


def check_relay_waits(using: str, options: AuditOptions, since: datetime,
                      now: datetime) -> CheckResult:
    rows = _rows(using, "waited_too_long", {
        "since": since, "until": options.as_of, "now": now, "bound": options.max_wait})
    examined = int(rows[0][5]) if rows else int(
        one_row(using, "count_window_events", {"since": since, "until": options.as_of})[0])
    return CheckResult.of("relay_waits", f"no event waited longer than {options.max_wait}",
                          {"events": examined}, [
        Finding("waited_too_long", len(rows),
                "an event waited longer than the bound for the relay (until published, or "
                "until now if still waiting)",
                "check the relay is running and leading (check_reminders_health, its metrics); "
                "the outbox lag alert says since when",
                [{"event": str(i), "key": k, "created": c.isoformat(),
                  "published": p.isoformat() if p else None, "waited_s": round(w)}
                 for i, k, c, p, w, _ in rows[:options.limit]]),
    ])


def one_row(using: str, name: str, params: Mapping[str, Any]) -> tuple[Any, ...]:
    with server_cursor(using) as cur:
        cur.execute(QUERIES[name], params)
        return one(cur)


def check_parked(using: str, options: AuditOptions) -> CheckResult:
    rows = _rows(using, "parked_events", {"limit": options.limit})
    total = int(rows[0][6]) if rows else 0
    return CheckResult.of("parked", "no parked event", {"parked": total}, [
        Finding("parked", total,
                "the relay gave up on an event after its attempts: it and its key's later "
                "events wait",
                "fix the cause in last_error, then manage.py requeue_outbox",
                [{"event": str(i), "key": k, "attempts": a, "parked": p.isoformat(),
                  "error": e, "held_behind": b} for i, k, a, p, e, b, _ in rows]),
    ])


# --- 4. the topic ----------------------------------------------------------------------------

def _window_events(using: str, since: datetime, until: datetime) -> list[TopicEvent]:
    return [TopicEvent(*r) for r in
            _rows(using, "window_events_for_topic", {"since": since, "until": until})]


def check_topic(options: AuditOptions, since: datetime, table: list[TopicEvent],
                using: str) -> CheckResult:
    reader = options.topic_reader
    assert reader is not None  # noqa: S101 - run_audit calls it only with one
    topics = sorted({e.topic for e in table} | {events.TOPIC})
    records = reader.read(topics, since, options.as_of)

    def in_table(ids: list[str]) -> set[str]:
        valid = [i for i in ids if _is_uuid(i)]
        return {r[0] for r in _rows(using, "events_by_id", {"ids": valid})} if valid else set()

    result = reconcile(table, records, in_table)
    limit = options.limit
    return CheckResult.of("topic", "outbox against the topic", {
        "published_events": sum(e.published for e in table), "records": len(records),
        "partitions": reader.partitions_read}, [
        Finding("missing_from_topic", len(result.missing),
                "the table says published, the topic has no record with that message_id",
                "the investors were not told: after a database move or restore stop the relay "
                "(its position may be another cluster's); the rows are intact, re-send them "
                "once the cause is fixed, and report it",
                [{"event": i} for i in result.missing[:limit]]),
        Finding("unknown_on_topic", len(result.unknown),
                "a record in the window whose message_id the outbox does not hold",
                "find the producer (another database, a restore, a tool); consumers cannot "
                "tell it from a reminder", [{"event": i} for i in result.unknown[:limit]]),
        Finding("duplicated_on_topic", len(result.duplicated),
                "a message_id on the topic more than once",
                "at-least-once allows it after a relay crash; consumers deduplicate. Many of "
                "them: look for a position moved back",
                [{"event": i, "copies": n} for i, n in result.duplicated[:limit]]),
        Finding("out_of_order", len(result.out_of_order),
                "a key whose first copies on the topic are not in the outbox's order",
                "a consumer may have applied an older reminder last; report the keys",
                [{"key": k} for k in result.out_of_order[:limit]]),
    ])


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
