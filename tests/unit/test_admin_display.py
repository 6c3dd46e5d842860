"""The admin's pure display pieces: the chart's y scale, shortened ids and clipped texts."""

from datetime import UTC, date, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.admin import clipped, compact_time, short_id
from reminders.overview import MAX_Y_INTERVALS, build_chart, nice_scale

ROUND_STEPS = {1, 2, 5} | {f * 10**n for f in (1, 2, 2.5, 5) for n in range(1, 9)}


@pytest.mark.parametrize(("value", "top", "step"), [
    (0, 1, 1), (1, 1, 1), (3, 3, 1), (7, 8, 2), (10, 10, 2), (11, 15, 5), (45, 50, 10),
    (101, 125, 25), (210, 250, 50), (260, 300, 100), (4321, 5000, 1000), (12_345, 12_500, 2500),
])
def test_nice_scale_fits_the_data(value: int, top: int, step: int) -> None:
    scale = nice_scale(value)

    assert (scale.top, scale.step) == (top, step)


@given(st.integers(min_value=1, max_value=10**9))
def test_nice_scale_is_round_and_tight(value: int) -> None:
    scale = nice_scale(value)

    assert scale.step in ROUND_STEPS
    assert scale.top >= value > scale.top - scale.step  # the top is the first step at or above
    assert len(scale.ticks) - 1 <= MAX_Y_INTERVALS
    assert scale.ticks[0] == 0 and scale.ticks[-1] == scale.top


def test_chart_of_about_210_a_day_tops_at_250_not_500() -> None:
    first = date(2026, 11, 1)
    counts = {(first, 7): 150, (first, 1): 60, (first + timedelta(days=1), 0): 90}

    chart = build_chart(counts, first, 2, thresholds=(30, 7, 1, 0))

    assert [t.label for t in chart.y_ticks] == ["0", "50", "100", "150", "200", "250"]
    tallest = sum(b.height for b in chart.bars if b.title.startswith("2026-11-01"))
    plot_height = chart.plot_bottom - chart.y_ticks[-1].position
    assert tallest == pytest.approx(plot_height * 210 / 250, abs=0.05)


def test_short_id_keeps_the_full_id_on_hover() -> None:
    full = "1b0c6a2e-9f3d-4c1e-8a57-0d9c2f6e4b11"

    html = short_id(full)

    assert html == f'<span class="short-id" title="{full}">1b0c6a2e\u2026</span>'
    assert short_id(None) == ""


def test_clipped_text_is_one_line_and_escaped() -> None:
    error = "KafkaException: <broker down>\n" + "x" * 200

    html = clipped(error, 40)

    assert 'title="KafkaException: &lt;broker down&gt;\nxxx' in html
    shown = html.split(">", 1)[1].rsplit("<", 1)[0]
    assert shown == "KafkaException: &lt;broker down&gt; " + "x" * 9 + "\u2026"
    assert clipped(None, 40) == clipped("", 40) == ""


def test_compact_time_is_utc() -> None:
    moscow = timezone(timedelta(hours=3))

    assert compact_time(datetime(2026, 12, 1, 6, 0, 5, tzinfo=moscow)) == "2026-12-01 03:00:05"
    assert compact_time(datetime(2026, 12, 1, 3, 0, tzinfo=UTC)) == "2026-12-01 03:00:00"
    assert compact_time(None) == ""
