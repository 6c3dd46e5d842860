"""The audit (docs/operations.md, "Auditing the reminders"): the promises the tests hold,
checked read-only on the live ledger, outbox and relay state, in one database snapshot, and,
with a Kafka reader, against the topic.

1. the ledger and the outbox agree over the window (`ledger_outbox`);
2. nothing due was left behind by the last succeeded loop cycle (`left_behind`);
3. the relay's state: its position (`relay_position`), waits (`relay_waits`), parked rows
   (`parked`);
4. the outbox against the topic (`topic`, audit.against_topic).
"""

import dataclasses
import time as time_module
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.db import transaction

from audit import findings, store
from audit.against_topic import TopicEvent, TopicReader, reconcile
from audit.report import AuditReport, CheckResult, Finding, Status
from audit.window import audit_window
from outbox import store as outbox_store
from reminders import events, rules
from reminders.config import parse_thresholds

DEFAULT_SINCE = timedelta(days=7)


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
    # OUTBOX_TOPICS, the relay's allowlist: a parked event off it is a finding of its own, and
    # --against-topic reads no other topic (but the contract's)
    topics: frozenset[str] = frozenset({events.TOPIC})


def run_audit(options: AuditOptions, using: str = "default") -> AuditReport:
    """Every check; the database ones in one read-only snapshot, then the topic's."""
    with transaction.atomic(using=using):
        now = store.begin_snapshot(using)
        window = audit_window(options.as_of, options.since, now=now,
                              outbox_retention=options.outbox_retention)
        since = window.start
        pruned_as_of = store.latest_pruning_as_of(using)
        pruned_before = (rules.prune_cutoff(rules.utc_date(pruned_as_of), options.retention_days)
                         if pruned_as_of else None)
        checks = [
            _timed(check_ledger_outbox, using, options, since, pruned_before),
            _timed(check_left_behind, using, options, pruned_as_of),
            _timed(check_relay_position, using),
            _timed(check_relay_waits, using, options, since, now),
            _timed(check_parked, using, options),
        ]
        started = time_module.perf_counter()
        table = (store.window_events(using, since=since, until=options.as_of)
                 if options.topic_reader else None)
        table_seconds = time_module.perf_counter() - started
    if options.topic_reader is not None and table is not None:
        topic = _timed(check_topic, options, since, table, using)
        checks.append(dataclasses.replace(topic, seconds=topic.seconds + table_seconds))
    else:
        checks.append(CheckResult("topic", "outbox against the topic", Status.NOT_CHECKED,
                                  note="not asked (--against-topic)"))
    return AuditReport(as_of=options.as_of, since=since, database_now=now, checks=checks,
                       notes=window.notes)


def _timed(check: Callable[..., CheckResult], *args: Any) -> CheckResult:
    started = time_module.perf_counter()
    result = check(*args)
    return dataclasses.replace(result, seconds=time_module.perf_counter() - started)


# --- 1. the ledger and the outbox ----------------------------------------------------------

def check_ledger_outbox(using: str, options: AuditOptions, since: datetime,
                        pruned_before: date | None) -> CheckResult:
    row = store.ledger_outbox(using, since=since, until=options.as_of,
                              pruned_before=(pruned_before or date.min).isoformat())
    examined = {"runs": row.runs, "events": row.events, "event_items": row.event_items,
                "notified_markers": row.notified_markers}
    title = "ledger and outbox agree"
    if not row.runs:
        return CheckResult.not_checked("ledger_outbox", title, examined,
                                       "no run notified a marker or wrote an event in the window")
    limit = options.limit
    return CheckResult.of("ledger_outbox", title, examined, [
        Finding.listed(findings.MARKER_WITHOUT_EVENT, row.marker_without_event, limit),
        Finding.listed(findings.EVENT_WITHOUT_MARKER, row.event_without_marker, limit),
        Finding.listed(findings.NOTIFIED_TWICE, row.notified_twice, limit),
        Finding.listed(findings.ALREADY_QUEUED, row.already_queued, limit),
    ])


# --- 2. nothing due left behind --------------------------------------------------------------

def check_left_behind(using: str, options: AuditOptions,
                      pruned_as_of: datetime | None) -> CheckResult:
    title = "nothing due left behind by the last cycle"
    cycle = store.last_loop_cycle(using)
    if cycle is None:
        return CheckResult("left_behind", title, Status.NOT_CHECKED,
                           note="no succeeded loop cycle in the run history")
    thresholds = parse_thresholds("thresholds", cycle.thresholds)
    as_of_date = rules.utc_date(cycle.as_of)
    window = rules.scan_window(as_of_date, thresholds, options.retention_days)
    # markers a later cycle pruned (their expiry left its retention) are not a lost reminder
    prune_floor = datetime.combine(
        rules.prune_cutoff(rules.utc_date(pruned_as_of or cycle.as_of), options.retention_days),
        time(0), tzinfo=UTC)
    row = store.left_behind(
        using, cycle, as_of_date=as_of_date, window_start=max(window.start, prune_floor),
        window_end=window.end, thresholds=thresholds,
        max_documents=options.max_documents_per_event)
    note = (f"cycle {cycle.run_id} as of {cycle.as_of.isoformat()}, started "
            f"{cycle.started_at.isoformat()}; {row.changed_since} due document(s) changed "
            "since it started are excepted")
    return CheckResult.of("left_behind", title, {"due_unmarked": len(row.left_behind),
                                                 "changed_since": row.changed_since}, [
        Finding.listed(findings.LEFT_BEHIND, row.left_behind, options.limit),
    ], note)


# --- 3. the relay --------------------------------------------------------------------------

def check_relay_position(using: str) -> CheckResult:
    """The stream position belongs to this cluster and is not ahead of its transaction ids
    (outbox.store.stream_cluster, read only: nothing is re-based)."""
    cluster = outbox_store.stream_cluster(using)
    ids = [{"recorded_system": cluster.recorded_system, "this_system": cluster.this_system,
            "newest_txid": cluster.newest_txid, "next_txid": cluster.next_txid}]
    moved = cluster.recorded_system != cluster.this_system
    ahead = not moved and cluster.ahead
    note = (f"moved from cluster {cluster.previous_system} at {cluster.changed_at.isoformat()}"
            if cluster.changed_at is not None and cluster.previous_system is not None else "")
    return CheckResult.of("relay_position", "relay position belongs to this cluster",
                          {"positions": 1}, [
        Finding(findings.POSITION_OF_ANOTHER_CLUSTER, int(moved), ids if moved else []),
        Finding(findings.POSITION_AHEAD, int(ahead), ids if ahead else []),
    ], note)


def check_relay_waits(using: str, options: AuditOptions, since: datetime,
                      now: datetime) -> CheckResult:
    row = store.relay_waits(using, since=since, until=options.as_of, now=now,
                            bound=options.max_wait)
    title = f"no event waited longer than {options.max_wait}"
    if not row.events:
        return CheckResult.not_checked("relay_waits", title, {"events": 0},
                                       "no event in the window and none waiting for the relay")
    return CheckResult.of("relay_waits", title, {"events": row.events}, [
        Finding.listed(findings.WAITED_TOO_LONG, row.waited_too_long, options.limit),
    ])


def check_parked(using: str, options: AuditOptions) -> CheckResult:
    row = store.parked(using, options.topics)
    examined = {"parked": len(row.parked) + len(row.parked_off_allowlist)}
    return CheckResult.of("parked", "no parked event", examined, [
        Finding.listed(findings.PARKED, row.parked, options.limit),
        Finding.listed(findings.PARKED_OFF_ALLOWLIST, row.parked_off_allowlist, options.limit),
    ])


# --- 4. the topic ----------------------------------------------------------------------------

def check_topic(options: AuditOptions, since: datetime, table: list[TopicEvent],
                using: str) -> CheckResult:
    reader = options.topic_reader
    assert reader is not None  # noqa: S101 - run_audit calls it only with one
    # Only the relay's topics: a row may name any topic (it is then parked, never sent), and the
    # audit must not follow it there (its ACLs would refuse it, or strangers' records show).
    topics = sorted(({e.topic for e in table} & options.topics) | {events.TOPIC})
    table = [e for e in table if e.topic in topics]
    records = reader.read(topics, since, options.as_of)

    def in_table(ids: list[str]) -> set[str]:
        return store.events_held(using, [i for i in ids if _is_uuid(i)])

    result = reconcile(table, records, in_table)
    examined = {"published_events": sum(e.published for e in table), "records": len(records),
                "partitions": reader.partitions_read}
    title = "outbox against the topic"
    if not examined["published_events"] and not records:
        return CheckResult.not_checked("topic", title, examined,
                                       "no event published in the window and no record in it "
                                       "on the topic")
    limit = options.limit
    return CheckResult.of("topic", title, examined, [
        Finding.listed(findings.MISSING_FROM_TOPIC, [{"event": i} for i in result.missing],
                       limit),
        Finding.listed(findings.UNKNOWN_ON_TOPIC, [{"event": i} for i in result.unknown], limit),
        Finding.listed(findings.DUPLICATED_ON_TOPIC,
                       [{"event": i, "copies": n} for i, n in result.duplicated], limit),
        Finding.listed(findings.OUT_OF_ORDER, [{"key": k} for k in result.out_of_order], limit),
    ])


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
