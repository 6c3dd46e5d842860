"""The pure rules (docs/design.md §3.2), exhaustively and by property."""

from datetime import UTC, date, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reminders import rules

TODAY = date(2026, 11, 29)
DEFAULT = (30, 7, 1, 0)


@pytest.mark.parametrize(
    ("left", "crossed"),
    [(31, set()), (30, {30}), (8, {30}), (7, {30, 7}), (2, {30, 7}), (1, {30, 7, 1}),
     (0, {30, 7, 1, 0}), (-400, {30, 7, 1, 0})],
)
def test_crossed_thresholds(left: int, crossed: set[int]) -> None:
    assert rules.crossed_thresholds(left, DEFAULT) == crossed


@pytest.mark.parametrize(
    ("left", "marked", "expected"),
    [
        (31, (), None),
        (30, (), rules.Decision(markers=(30,), notify=30, days_left=30)),
        (5, (), rules.Decision(markers=(7, 30), notify=7, days_left=5)),
        (5, (30,), rules.Decision(markers=(7,), notify=7, days_left=5)),
        (5, (30, 7), None),
        (-3, (), rules.Decision(markers=(0, 1, 7, 30), notify=0, days_left=-3)),
        (1, (30, 7), rules.Decision(markers=(1,), notify=1, days_left=1)),
    ],
)
def test_decide(left: int, marked: tuple[int, ...], expected: rules.Decision | None) -> None:
    assert rules.decide(TODAY + timedelta(days=left), TODAY, DEFAULT, marked) == expected


def test_stale_threshold_is_marked_without_notifying() -> None:
    # 14 added to the config after 7 was already sent: 14 is marked, nobody is told
    decision = rules.decide(TODAY + timedelta(days=5), TODAY, (30, 14, 7, 1, 0), (30, 7))
    assert decision == rules.Decision(markers=(14,), notify=None, days_left=5)


def test_marker_of_a_removed_threshold_still_counts_as_more_urgent() -> None:
    decision = rules.decide(TODAY + timedelta(days=5), TODAY, (30, 14), (1,))
    assert decision == rules.Decision(markers=(14, 30), notify=None, days_left=5)


def test_utc_date_of_an_instant_in_another_offset() -> None:
    moscow = timezone(timedelta(hours=3))
    assert rules.utc_date(datetime(2027, 3, 15, 0, 0, tzinfo=moscow)) == date(2027, 3, 14)
    with pytest.raises(ValueError, match="naive"):
        rules.utc_date(datetime(2027, 3, 15))  # noqa: DTZ001 - the point of the test


def test_scan_window_and_its_instants() -> None:
    window = rules.scan_window(TODAY, DEFAULT, 90)
    assert (window.first_day, window.last_day) == (date(2026, 8, 31), date(2026, 12, 29))
    assert window.start == datetime(2026, 8, 31, tzinfo=UTC)
    assert window.end == datetime(2026, 12, 30, tzinfo=UTC)
    assert rules.prune_cutoff(TODAY, 90) == window.first_day


thresholds_st = st.lists(st.integers(0, 60), min_size=1, max_size=6, unique=True).map(
    lambda ts: tuple(sorted(ts, reverse=True))
)


@given(left=st.integers(-200, 200), thresholds=thresholds_st,
       marked=st.sets(st.integers(0, 60), max_size=6))
def test_decision_properties(left: int, thresholds: tuple[int, ...], marked: set[int]) -> None:
    decision = rules.decide(TODAY + timedelta(days=left), TODAY, thresholds, marked)
    crossed = {t for t in thresholds if left <= t}
    remaining = crossed - marked
    if not remaining:
        assert decision is None
        return
    assert decision is not None
    assert set(decision.markers) == remaining  # every remaining threshold, nothing else
    assert list(decision.markers) == sorted(decision.markers)
    if decision.notify is None:
        assert any(m < min(remaining) for m in marked)  # silent only for the stale rule
    else:
        assert decision.notify == min(remaining)  # the most urgent, once
        assert all(m > decision.notify for m in marked)


@given(thresholds=thresholds_st, start=st.integers(-50, 80))
def test_daily_runs_notify_each_threshold_at_most_once(thresholds: tuple[int, ...],
                                                       start: int) -> None:
    """Walking a document from `start` days out to 100 days past: every threshold is marked
    exactly once, and every notification is more urgent than the one before."""
    expires = TODAY + timedelta(days=start)
    marked: set[int] = set()
    notified: list[int] = []
    for offset in range(0, start + 101):
        decision = rules.decide(expires, TODAY + timedelta(days=offset), thresholds, marked)
        if decision:
            assert not marked & set(decision.markers)
            marked |= set(decision.markers)
            if decision.notify is not None:
                notified.append(decision.notify)
    assert marked == set(thresholds)  # by 100 days past expiry every threshold has passed
    assert notified == sorted(notified, reverse=True) and len(set(notified)) == len(notified)
    assert notified and notified[-1] == min(thresholds)
