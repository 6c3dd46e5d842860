"""Prometheus metrics of the reminder worker (docs/design.md §5), with the seed's names.

`observe_cycle` turns a finished cycle's result into counter, histogram and gauge updates;
they are in no registry until a process that runs cycles installs them (`REMINDER_METRICS`,
core.metrics). The backlog gauge is read from the database at scrape time
(`register_backlog_gauge`).
"""

from datetime import UTC, datetime, timedelta

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from core.gauges import DatabaseGauges
from core.metrics import MetricSet
from reminders.census import census_now
from reminders.config import ReminderSettings
from reminders.models import SUCCESSFUL_STATUSES, ReminderRun
from reminders.result import CycleResult

BACKLOG = "profile_document_expiry_reminder_backlog"
BACKLOG_REFRESH_S = 300.0

REMINDERS_TOTAL = Counter(
    "profile_document_expiry_reminders_total",
    "Reminders queued in the outbox (one per notified document), by threshold.",
    ["threshold_days"], registry=None,
)
CYCLE_DURATION = Histogram(
    "profile_document_expiry_reminder_cycle_duration_seconds",
    "Wall time of a reminder cycle.",
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 900, 1800), registry=None,
)
MARKERS_REARMED_TOTAL = Counter(
    "profile_document_expiry_reminder_markers_rearmed_total",
    "Markers replaced in place because the document's expiry date changed (renewed or "
    "corrected): its thresholds are reminded again for the new date.", registry=None,
)
ALREADY_QUEUED_TOTAL = Counter(
    "profile_document_expiry_reminder_owners_already_queued_total",
    "Owners whose reminder the outbox already held under its message id (a ledger restored "
    "or rolled back without its outbox): markers written again, no second event.",
    registry=None,
)
ERRORS_TOTAL = Counter(
    "profile_document_expiry_reminder_errors_total",
    "Owners that failed in a cycle (retried next cycle), plus cycles that failed outright.",
    registry=None,
)
CYCLES_TOTAL = Counter(
    "profile_document_expiry_reminder_cycles_total",
    "Finished reminder cycles, by status.",
    ["status"], registry=None,
)
LAST_SUCCESS = Gauge(
    "profile_document_expiry_reminder_last_success_timestamp_seconds",
    "Unix time at which the latest successful cycle (of any instance, as far as this one "
    "knows) ended.", registry=None,
)
REMINDER_METRICS = MetricSet(REMINDERS_TOTAL, CYCLE_DURATION, MARKERS_REARMED_TOTAL,
                             ALREADY_QUEUED_TOTAL, ERRORS_TOTAL, CYCLES_TOTAL, LAST_SUCCESS)


def declare_thresholds(thresholds: tuple[int, ...]) -> None:
    """Export every threshold's counter at 0 from the start, so rate() sees its first step."""
    for threshold in thresholds:
        REMINDERS_TOTAL.labels(threshold_days=str(threshold))


def observe_cycle(result: CycleResult, *, finished_at: datetime | None = None) -> None:
    """Count a finished cycle. A dry run changes nothing and is not counted."""
    if result.dry_run:
        return
    for threshold, count in result.reminders_by_threshold.items():
        REMINDERS_TOTAL.labels(threshold_days=str(threshold)).inc(count)
    if result.markers_rearmed:
        MARKERS_REARMED_TOTAL.inc(result.markers_rearmed)
    if result.owners_already_queued:
        ALREADY_QUEUED_TOTAL.inc(result.owners_already_queued)
    CYCLE_DURATION.observe(result.duration_ms / 1000)
    CYCLES_TOTAL.labels(status=str(result.status)).inc()
    errors = result.failed_owners + (1 if result.status == ReminderRun.Status.FAILED else 0)
    if errors:
        ERRORS_TOTAL.inc(errors)
    if result.status in SUCCESSFUL_STATUSES:
        LAST_SUCCESS.set((finished_at or datetime.now(UTC)).timestamp())


def restore_last_success(since_success: timedelta | None, now: datetime | None = None) -> None:
    """Seed the last-success gauge from the run history, so a restart does not reset it. The
    gauge carries the worker's clock (observe_cycle sets it at a cycle's end): the success is
    placed `since_success` (its age on the database's clock) before the worker's now."""
    if since_success is not None:
        LAST_SUCCESS.set(((now or datetime.now(UTC)) - since_success).timestamp())


def read_backlog(settings: ReminderSettings, using: str = "default",
                 now: datetime | None = None) -> dict[str, float]:
    """Due documents now: active documents in the window whose current t* has no marker."""
    return {BACKLOG: float(census_now(settings, now or datetime.now(UTC), using).due_documents)}


def register_backlog_gauge(
    settings: ReminderSettings,
    registry: CollectorRegistry = REGISTRY,
    using: str = "default",
    refresh_s: float = BACKLOG_REFRESH_S,
) -> DatabaseGauges:
    """Serve the backlog gauge, computed by the census query at most every `refresh_s` seconds."""
    collector = DatabaseGauges(
        {BACKLOG: "Due documents: active documents in the scan window with a crossed "
                  "threshold that has no marker yet."},
        lambda: read_backlog(settings, using), refresh_s=refresh_s, using=using,
        background=True,  # the census takes seconds on a large window: never block a scrape
    )
    registry.register(collector)
    return collector
