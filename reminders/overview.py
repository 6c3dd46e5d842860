"""The admin overview: reminders per day per threshold (a bar chart drawn on the server),
the backlog now, the last cycle, and the cards other apps offer (the outbox's backlog),
read cheaply through the indexes."""

import os
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

from django.db import connection

from core.admin import offered_cards
from core.config import ConfigError
from core.queries import QueryFile
from reminders import rules
from reminders.census import census_now
from reminders.config import load_settings
from reminders.models import SUCCESSFUL_STATUSES, ReminderRun

ADMIN_QUERIES = QueryFile(Path(__file__).parent / "sql" / "admin.sql")
CHART_DAYS = 30
# Most urgent threshold first: alarming red to calm blue.
PALETTE = ("#ba2121", "#e07b26", "#e0a526", "#417690", "#79aec8", "#a9c7d6")

# Chart geometry, in SVG user units.
WIDTH, HEIGHT = 760, 240
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 12, 28


def _rows(name: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(ADMIN_QUERIES[name], params or {})
        return list(cursor.fetchall())


def reminders_per_day(first_day: date) -> dict[tuple[date, int], int]:
    """{(UTC day, threshold): reminders sent} from `first_day` on."""
    since = datetime.combine(first_day, time(0), tzinfo=UTC)
    return {(day, threshold): count for day, threshold, count in _rows("reminders_per_day", {"since": since})}


@dataclass(frozen=True, slots=True)
class RunSummary:
    """A cycle as the overview's "last cycle" card shows it."""

    run_id: uuid.UUID
    status: str
    started_at: datetime
    duration_ms: int | None
    reminders_sent: int
    owners_notified: int
    failed_owners: int

    @property
    def status_label(self) -> str:
        return str(ReminderRun.Status(self.status).label)


def _run(name: str, params: dict[str, Any] | None = None) -> RunSummary | None:
    rows = _rows(name, params)
    return RunSummary(*rows[0]) if rows else None


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


# Steps of the y axis: 1, 2, 2.5 and 5 x 10^n (whole numbers only: counts are whole).
NICE_STEP_FACTORS = (10, 20, 25, 50)
MAX_Y_INTERVALS = 5


@dataclass(frozen=True, slots=True)
class Scale:
    """A y axis from 0 to `top` in equal round steps of `step`."""

    top: int
    step: int

    @property
    def ticks(self) -> tuple[int, ...]:
        return tuple(range(0, self.top + 1, self.step))


def nice_scale(value: int) -> Scale:
    """The axis that fits `value` most closely: the smallest round step (1, 2, 2.5, 5 x 10^n)
    that reaches `value` in at most MAX_Y_INTERVALS steps, topped at the first step at or
    above it (210 -> 0..250 by 50; 260 -> 0..300 by 100). An empty chart gets 0..1."""
    value = max(value, 1)
    power = 1
    while True:
        for factor in NICE_STEP_FACTORS:
            step_tenths = factor * power
            if step_tenths % 10:
                continue  # 2.5 is not a step of whole counts
            step = step_tenths // 10
            intervals = -(-value // step)
            if intervals <= MAX_Y_INTERVALS:
                return Scale(top=intervals * step, step=step)
        power *= 10


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
    scale = nice_scale(max(totals, default=0))
    top = scale.top
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
        Tick(round(HEIGHT - BOTTOM - value / top * plot_height, 2), f"{value:,}")
        for value in scale.ticks
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
    """The worker's own census (the backlog of docs/design.md §5), for this process's settings."""
    try:
        settings = load_settings(os.environ)
    except ConfigError as error:
        return Backlog(None, None, problem=str(error))
    return Backlog(*census_now(settings, now))


def overview_context(now: datetime) -> dict[str, Any]:
    """Everything the overview page shows."""
    first_day = rules.utc_date(now) - timedelta(days=CHART_DAYS - 1)
    counts = reminders_per_day(first_day)
    return {
        "chart": build_chart(counts, first_day, CHART_DAYS, configured_thresholds()),
        "first_day": first_day,
        "last_day": rules.utc_date(now),
        "backlog": backlog_now(now),
        "last_run": _run("last_run"),
        "last_success": _run("last_successful_run",
                             {"successful": sorted(str(s) for s in SUCCESSFUL_STATUSES)}),
        "cards": offered_cards(),
        "now": now,
    }
