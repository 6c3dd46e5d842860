"""The admin overview: reminders per day per threshold (a bar chart drawn on the server),
the backlog now, the last cycle and the outbox, read cheaply through the indexes."""

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

from django.db import connection
from django.db.models import Count, Min, Q

from outbox.models import OutboxMessage
from reminders import rules, store
from reminders.config import ConfigError, load_settings
from reminders.models import ReminderRun
from reminders.queries import load

ADMIN_QUERIES = Path(__file__).parent / "sql" / "admin.sql"
CHART_DAYS = 30
# Most urgent threshold first: alarming red to calm blue.
PALETTE = ("#ba2121", "#e07b26", "#e0a526", "#417690", "#79aec8", "#a9c7d6")

# A cycle that did its work (DESIGN 3); the same set as the query last_loop_tick.
SUCCESSFUL_STATUSES = (
    ReminderRun.Status.SUCCEEDED, ReminderRun.Status.PARTIAL, ReminderRun.Status.TIMED_OUT,
)

# Chart geometry, in SVG user units.
WIDTH, HEIGHT = 760, 240
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 12, 28


def admin_query(name: str) -> str:
    return load(ADMIN_QUERIES)[name]


def _rows(name: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(admin_query(name), params or {})
        return list(cursor.fetchall())


def reminders_per_day(first_day: date) -> dict[tuple[date, int], int]:
    """{(UTC day, threshold): reminders sent} from `first_day` on."""
    since = datetime.combine(first_day, time(0), tzinfo=UTC)
    return {(day, threshold): count for day, threshold, count in _rows("reminders_per_day", {"since": since})}


def configured_thresholds() -> tuple[int, ...]:
    """The thresholds this process is configured with (REMINDER_THRESHOLDS_DAYS), or none."""
    try:
        return load_settings(os.environ).thresholds
    except ConfigError:
        return ()


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    colour: str
    title: str


@dataclass(frozen=True, slots=True)
class Tick:
    position: float
    label: str


@dataclass(frozen=True, slots=True)
class Chart:
    """A stacked bar chart ready for the SVG template: every number is already in place."""

    width: int
    height: int
    plot_left: int
    plot_bottom: int
    plot_right: int
    bars: tuple[Bar, ...]
    x_ticks: tuple[Tick, ...]
    y_ticks: tuple[Tick, ...]
    legend: tuple[tuple[str, str], ...]
    total: int


def nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5 x 10^n that is >= value (a round top for the y axis)."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if factor * step >= value:
                return factor * step
        step *= 10


def threshold_colours(thresholds: Iterable[int]) -> dict[int, str]:
    """A colour per threshold, the most urgent (fewest days) red."""
    ordered = sorted(set(thresholds))
    return {t: PALETTE[min(i, len(PALETTE) - 1)] for i, t in enumerate(ordered)}


def days_label(days: int) -> str:
    return f"{days} day" if days == 1 else f"{days} days"


def build_chart(counts: dict[tuple[date, int], int], first_day: date, days: int,
                thresholds: Sequence[int]) -> Chart:
    """Stack each day's reminders by threshold, most urgent at the bottom."""
    shown = sorted(set(thresholds) | {t for _, t in counts}, reverse=True)
    colours = threshold_colours(shown)
    day_list = [first_day + timedelta(days=i) for i in range(days)]
    totals = [sum(counts.get((d, t), 0) for t in shown) for d in day_list]
    top = nice_ceiling(max(totals, default=0) or 1)
    plot_width = WIDTH - LEFT - RIGHT
    plot_height = HEIGHT - TOP - BOTTOM
    slot = plot_width / days
    bars: list[Bar] = []
    for index, day in enumerate(day_list):
        base = float(HEIGHT - BOTTOM)
        for threshold in sorted(shown):
            count = counts.get((day, threshold), 0)
            if not count:
                continue
            height = count / top * plot_height
            base -= height
            bars.append(Bar(
                x=round(LEFT + index * slot + slot * 0.15, 2), y=round(base, 2),
                width=round(slot * 0.7, 2), height=round(height, 2), colour=colours[threshold],
                title=f"{day.isoformat()}: {count} at {days_label(threshold)}",
            ))
    x_ticks = tuple(
        Tick(round(LEFT + index * slot + slot / 2, 2), day.strftime("%d %b"))
        for index, day in enumerate(day_list) if index % 5 == 0 or index == days - 1
    )
    y_ticks = tuple(
        Tick(round(HEIGHT - BOTTOM - fraction * plot_height, 2), f"{round(top * fraction):,}")
        for fraction in (0, 0.5, 1)
    )
    legend = tuple((days_label(t), colours[t]) for t in shown)
    return Chart(width=WIDTH, height=HEIGHT, plot_left=LEFT, plot_bottom=HEIGHT - BOTTOM,
                 plot_right=WIDTH - RIGHT, bars=tuple(bars), x_ticks=x_ticks, y_ticks=y_ticks,
                 legend=legend, total=sum(totals))


@dataclass(frozen=True, slots=True)
class Backlog:
    """Documents in the window now, and how many of them wait for a reminder."""

    window_documents: int | None
    due_documents: int | None
    problem: str | None = None


def backlog_now(now: datetime) -> Backlog:
    """The worker's own census (DESIGN 4's backlog), for the settings this process sees."""
    try:
        settings = load_settings(os.environ)
    except ConfigError as error:
        return Backlog(None, None, problem=str(error))
    today = rules.utc_date(now)
    window = rules.scan_window(today, settings.thresholds, settings.retention_days)
    window_documents, due = store.window_census("default", window, settings.thresholds, today)
    return Backlog(window_documents, due)


def outbox_backlog() -> dict[str, Any]:
    """Unpublished and parked messages and the oldest unpublished one (the partial index)."""
    return OutboxMessage.objects.filter(published_at__isnull=True).aggregate(
        unpublished=Count("pk"),
        parked=Count("pk", filter=Q(parked_at__isnull=False)),
        oldest_created_at=Min("created_at"),
    )


def overview_context(now: datetime) -> dict[str, Any]:
    """Everything the overview page shows."""
    first_day = rules.utc_date(now) - timedelta(days=CHART_DAYS - 1)
    counts = reminders_per_day(first_day)
    runs = ReminderRun.objects.order_by("-started_at")
    return {
        "chart": build_chart(counts, first_day, CHART_DAYS, configured_thresholds()),
        "first_day": first_day,
        "last_day": rules.utc_date(now),
        "backlog": backlog_now(now),
        "last_run": runs.first(),
        "last_success": runs.filter(status__in=SUCCESSFUL_STATUSES).first(),
        "outbox": outbox_backlog(),
        "now": now,
    }
