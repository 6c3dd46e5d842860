"""The stream's read size (outbox.lanes), without a database: it starts at the floor, doubles
after full reads up to the ceiling, shrinks after short ones down to the floor, and a read's
bytes bound it whatever the rows say."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox.config import MIN_READ_ROWS
from outbox.lanes import MAX_READ_BYTES, ReadSize, next_read_rows

ROW_BYTES = 1_000


def drain(size: ReadSize, backlog: int, row_bytes: int = ROW_BYTES) -> list[int]:
    """The sizes of the reads that drain `backlog` rows of `row_bytes`, the empty one included."""
    asked: list[int] = []
    while True:
        rows = size.rows
        asked.append(rows)
        got = min(rows, backlog)
        backlog -= got
        size.observe(rows, got, got * row_bytes)
        if got == 0:
            return asked


def test_it_starts_at_the_floor_and_a_ceiling_below_it_is_the_only_size() -> None:
    assert ReadSize.up_to(5000).rows == MIN_READ_ROWS
    fixed = ReadSize.up_to(7)
    assert (fixed.rows, fixed.floor) == (7, 7)
    assert drain(fixed, 30) == [7, 7, 7, 7, 7, 7]


def test_a_backlog_drains_in_doubling_reads_up_to_the_ceiling_then_it_reads_small_again() -> None:
    size = ReadSize.up_to(5000)
    assert drain(size, 30_000) == [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000, 5000,
                                   5000, 2500]
    assert size.rows == MIN_READ_ROWS  # caught up: an empty read goes back to the floor


def test_a_short_read_shrinks_to_twice_what_came_but_at_most_by_half() -> None:
    assert next_read_rows(5000, 4000, 4000 * ROW_BYTES, floor=100, ceiling=5000) == 2500
    assert next_read_rows(5000, 600, 600 * ROW_BYTES, floor=100, ceiling=5000) == 1200
    assert next_read_rows(5000, 10, 10 * ROW_BYTES, floor=100, ceiling=5000) == 100
    assert next_read_rows(100, 99, 99 * ROW_BYTES, floor=100, ceiling=5000) == 100


def test_a_steady_trickle_keeps_reading_small() -> None:
    size = ReadSize.up_to(5000)
    for _ in range(50):
        size.observe(size.rows, 3, 3 * ROW_BYTES)
        assert size.rows == MIN_READ_ROWS


def test_large_rows_bound_the_read_by_its_bytes_below_the_ceiling_and_the_floor() -> None:
    # 10 KB rows: MAX_READ_BYTES holds 838 of them, whatever the ceiling.
    size = ReadSize.up_to(5000)
    sizes = drain(size, 100_000, row_bytes=10_000)
    assert max(sizes) == MAX_READ_BYTES // 10_000
    # A row of 1 MB: eight a read, below the floor.
    assert next_read_rows(100, 100, 100 * 1_048_576, floor=100, ceiling=5000) == 8
    # A single row larger than the bound still goes out, one a read.
    assert next_read_rows(8, 8, 8 * 2 * MAX_READ_BYTES, floor=100, ceiling=5000) == 1


@pytest.mark.parametrize(("ceiling", "floor", "max_bytes"), [(0, 100, 1), (10, 0, 1), (10, 1, 0)])
def test_sizes_are_positive(ceiling: int, floor: int, max_bytes: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        ReadSize.up_to(ceiling, floor=floor, max_bytes=max_bytes)


@given(ceiling=st.integers(1, 100_000), floor=st.integers(1, 1_000),
       reads=st.lists(st.tuples(st.floats(0, 1), st.integers(1, 100_000)), max_size=60))
def test_every_size_stays_within_the_floor_the_ceiling_and_the_bytes(
    ceiling: int, floor: int, reads: list[tuple[float, int]]
) -> None:
    size = ReadSize.up_to(ceiling, floor=floor)
    for share, row_bytes in reads:
        asked = size.rows
        got = int(asked * share)
        rows = size.observe(asked, got, got * row_bytes)
        assert 1 <= rows <= ceiling
        by_bytes = MAX_READ_BYTES // row_bytes if got else None
        assert rows >= min(floor, ceiling) or (by_bytes is not None and rows <= max(1, by_bytes))
        if by_bytes is not None:
            assert rows <= max(1, by_bytes)
        if got == asked:
            assert rows >= min(2 * asked, ceiling) or (by_bytes is not None
                                                       and rows == max(1, by_bytes))
        else:
            assert rows <= max(asked // 2, min(floor, ceiling))
