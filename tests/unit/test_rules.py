"""The pure rules (docs/design.md §3.2), exhaustively and by property."""

from collections.abc import Callable, Iterable
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
    expires = TODAY + timedelta(days=left)
    assert rules.decide(expires, TODAY, DEFAULT, for_date(marked, expires)) == expected


def for_date(thresholds: Iterable[int], expires: date) -> dict[int, date]:
    """Markers of `thresholds`, all written for the expiry date `expires`."""
    return dict.fromkeys(thresholds, expires)


def test_stale_threshold_is_marked_without_notifying() -> None:
    # 14 added to the config after 7 was already sent: 14 is marked, nobody is told
    expires = TODAY + timedelta(days=5)
    decision = rules.decide(expires, TODAY, (30, 14, 7, 1, 0), for_date((30, 7), expires))
    assert decision == rules.Decision(markers=(14,), notify=None, days_left=5)


def test_marker_of_a_removed_threshold_still_counts_as_more_urgent() -> None:
    expires = TODAY + timedelta(days=5)
    decision = rules.decide(expires, TODAY, (30, 14), for_date((1,), expires))
    assert decision == rules.Decision(markers=(14, 30), notify=None, days_left=5)


@pytest.mark.parametrize(
    ("left", "shifts", "expected"),
    [
        # renewed: every marker is of the old date, so the new date starts afresh
        (30, {30: -60, 7: -60, 1: -60, 0: -60},
         rules.Decision(markers=(30,), notify=30, days_left=30, rearmed=(30,))),
        # the stale rule reads current markers only: an old 0 does not silence the new 7
        (5, {30: 0, 0: -60}, rules.Decision(markers=(7,), notify=7, days_left=5)),
        (5, {30: 0, 7: -60, 0: -60},
         rules.Decision(markers=(7,), notify=7, days_left=5, rearmed=(7,))),
        # corrected to an earlier date after the 30-day reminder: 30 re-armed, 7 told
        (4, {30: 26}, rules.Decision(markers=(7, 30), notify=7, days_left=4, rearmed=(30,))),
        # a current marker of a more urgent threshold still silences (the stale rule)
        (5, {1: 0, 30: -60},
         rules.Decision(markers=(7, 30), notify=None, days_left=5, rearmed=(30,))),
        (5, {30: 0, 7: 0, 1: -60}, None),
    ],
)
def test_only_markers_of_the_current_expiry_date_count(
    left: int, shifts: dict[int, int], expected: rules.Decision | None
) -> None:
    """`shifts`: threshold -> its marker's expiry date minus the current one (0: current)."""
    expires = TODAY + timedelta(days=left)
    markers = {t: expires + timedelta(days=shift) for t, shift in shifts.items()}
    assert rules.decide(expires, TODAY, DEFAULT, markers) == expected


def test_current_markers() -> None:
    new, old = TODAY, TODAY - timedelta(days=1)
    assert rules.current_markers({30: new, 7: old, 1: new}, new) == {30, 1}
    assert rules.current_markers({}, new) == frozenset()


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
       shifts=st.dictionaries(st.integers(0, 60), st.sampled_from([0, 0, -90, -1, 1, 45]),
                              max_size=6))
def test_decision_properties(left: int, thresholds: tuple[int, ...],
                             shifts: dict[int, int]) -> None:
    expires = TODAY + timedelta(days=left)
    markers = {t: expires + timedelta(days=shift) for t, shift in shifts.items()}
    decision = rules.decide(expires, TODAY, thresholds, markers)
    marked = {t for t, shift in shifts.items() if shift == 0}  # of the current date only
    crossed = {t for t in thresholds if left <= t}
    remaining = crossed - marked
    if not remaining:
        assert decision is None
        return
    assert decision is not None
    assert set(decision.markers) == remaining  # every remaining threshold, nothing else
    assert list(decision.markers) == sorted(decision.markers)
    assert set(decision.rearmed) == remaining & (set(shifts) - marked)  # replaced in place
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
    markers: dict[int, date] = {}
    notified: list[int] = []
    for offset in range(0, start + 101):
        decision = rules.decide(expires, TODAY + timedelta(days=offset), thresholds, markers)
        if decision:
            assert not markers.keys() & set(decision.markers) and not decision.rearmed
            markers |= dict.fromkeys(decision.markers, expires)
            if decision.notify is not None:
                notified.append(decision.notify)
    assert set(markers) == set(thresholds)  # by 100 days past expiry every threshold has passed
    assert notified == sorted(notified, reverse=True) and len(set(notified)) == len(notified)
    assert notified and notified[-1] == min(thresholds)


def _walk(thresholds: tuple[int, ...], expiry_on: Callable[[int], date], days: range,
          markers: dict[int, date]) -> list[tuple[int, int | None, tuple[int, ...]]]:
    """Daily decisions from day `days.start`: (day, notified, marked), markers kept as the
    claim keeps them (a new date replaces the old one in place)."""
    walked = []
    for offset in days:
        expires = expiry_on(offset)
        decision = rules.decide(expires, TODAY + timedelta(days=offset), thresholds, markers)
        if decision:
            markers |= dict.fromkeys(decision.markers, expires)
            walked.append((offset, decision.notify, decision.markers))
    return walked


@given(thresholds=thresholds_st, start=st.integers(-50, 80), change_on=st.integers(0, 150),
       shift=st.integers(-120, 400).filter(lambda s: s != 0))
def test_after_an_expiry_change_a_document_is_reminded_as_a_fresh_one(
    thresholds: tuple[int, ...], start: int, change_on: int, shift: int
) -> None:
    """Renewed (or corrected) on day `change_on` by `shift` days: from that day on, its
    reminders are exactly those of a document that never had a marker."""
    first, second = TODAY + timedelta(days=start), TODAY + timedelta(days=start + shift)
    markers: dict[int, date] = {}
    _walk(thresholds, lambda _d: first, range(change_on), markers)
    days = range(change_on, max(change_on, start + shift) + 101)
    after = _walk(thresholds, lambda _d: second, days, markers)
    assert after == _walk(thresholds, lambda _d: second, days, {})
    assert set(markers.values()) == {second}  # every marker now answers for the new date
