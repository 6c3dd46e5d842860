"""The stream's pure batch rules, without a database: `cut` (one row per key in flight at a
time) and `position_after` (where the position stands after a recorded batch)."""

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox.lanes import BatchOutcome, cut, position_after
from outbox.producer import Batch
from outbox.store import ReadMessage


def row(seq: int, key: str, *, held: bool = False, txid: str = "100") -> ReadMessage:
    return ReadMessage(txid=txid, seq=seq, id=f"id-{seq}", topic="t", key=key, payload="{}",
                       headers="{}", timestamp_ms=0, clock_s=0.0, held=held, attempts=0)


def batch(read: list[ReadMessage]) -> Batch:
    producer: Any = object()  # never called: position_after reads only the rows
    return Batch(read=read, read_at=0.0, sent=len(read), errors={}, deadline=0.0,
                 producer=producer)


def keys(read: list[ReadMessage]) -> list[str]:
    return [m.key for m in read]


def test_cut_keeps_a_read_of_distinct_keys_whole() -> None:
    read = [row(1, "a"), row(2, "b"), row(3, "c")]
    assert cut(read, busy=()) == read


def test_cut_ends_the_batch_before_a_key_it_already_has() -> None:
    read = [row(1, "a"), row(2, "b"), row(3, "a"), row(4, "c")]
    assert keys(cut(read, busy=())) == ["a", "b"]


def test_cut_ends_the_batch_before_a_key_still_in_flight() -> None:
    read = [row(1, "a"), row(2, "b"), row(3, "c")]
    assert keys(cut(read, busy={"b"})) == ["a"]
    assert cut(read, busy={"a"}) == []


def test_cut_marks_the_rows_of_a_held_key_held_and_keeps_their_place() -> None:
    read = [row(1, "a"), row(2, "b"), row(3, "c")]
    out = cut(read, busy=(), held={"b"})
    assert keys(out) == ["a", "b", "c"]
    assert [m.held for m in out] == [False, True, False]
    assert read[1].held is False  # the read itself is not changed


def test_cut_leaves_a_row_already_held_as_it_is() -> None:
    already = row(1, "a", held=True)
    assert cut([already], busy=(), held={"a"})[0] is already


def test_a_probe_goes_on_past_the_keys_that_got_no_answer_holding_their_later_rows() -> None:
    """After [a] delivered nothing (a's partition unreachable, a's next row right behind it),
    the probe carries the other keys' rows; it still ends before another key's second row."""
    read = [row(1, "a"), row(2, "a"), row(3, "b"), row(4, "a"), row(5, "c"), row(6, "b")]
    out = cut(read, busy=(), probe={"a"})
    assert keys(out) == ["a", "a", "b", "a", "c"]
    assert [m.held for m in out] == [False, True, False, True, False]
    assert keys(cut(read, busy={"c"}, probe={"a"})) == ["a", "a", "b", "a"]


@given(st.lists(st.sampled_from("abcdef"), max_size=30), st.sets(st.sampled_from("abcdef")),
       st.sets(st.sampled_from("abcdef")))
def test_a_probe_sends_one_row_per_key_and_holds_the_rest_in_order(
        read_keys: list[str], busy: set[str], probe: set[str]) -> None:
    read = [row(i, k) for i, k in enumerate(read_keys)]
    out = cut(read, busy=busy, probe=probe)
    assert [m.id for m in out] == [m.id for m in read[:len(out)]]
    sent = [m.key for m in out if not m.held]
    assert len(set(sent)) == len(sent) and not set(sent) & busy
    held = [m for m in out if m.held]
    assert all(m.key in probe and m.key in sent[:sent.index(m.key) + 1] for m in held)


@given(st.lists(st.sampled_from("abcdef"), max_size=30), st.sets(st.sampled_from("abcdef")))
def test_cut_is_the_longest_prefix_with_one_row_per_key_and_none_busy(
        read_keys: list[str], busy: set[str]) -> None:
    read = [row(i, k) for i, k in enumerate(read_keys)]
    out = cut(read, busy=busy)
    assert out == read[:len(out)]
    assert len(set(keys(out))) == len(out) and not set(keys(out)) & busy
    if len(out) < len(read):  # the next row would break the rule
        assert read[len(out)].key in busy or read[len(out)].key in keys(out)


def test_position_after_a_batch_all_recorded_is_its_last_row() -> None:
    read = [row(1, "a"), row(2, "b"), row(3, "c")]
    assert position_after(batch(read), BatchOutcome(read=3, published=3)) == ("100", 3)


@pytest.mark.parametrize(("released", "expected"), [(1, ("100", 2)), (2, ("100", 1))])
def test_position_after_stops_just_before_the_rows_released(
        released: int, expected: tuple[str, int]) -> None:
    read = [row(1, "a"), row(2, "b"), row(3, "c")]
    outcome = BatchOutcome(read=3, published=3 - released, released=released)
    assert position_after(batch(read), outcome) == expected


@pytest.mark.parametrize("read", [[], [row(1, "a"), row(2, "b")]])
def test_position_after_does_not_move_when_every_row_was_released(read: list[ReadMessage]) -> None:
    assert position_after(batch(read), BatchOutcome(read=len(read), released=len(read))) is None
