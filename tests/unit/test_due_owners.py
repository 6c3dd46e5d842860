"""store.DueOwners: the census from the first row, then due owners only, in cursor order."""

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from reminders.cycle import owner_batches
from reminders.store import DueOwners

FIRST = datetime(2026, 12, 1, tzinfo=UTC)


class FakeCursor:
    """The due_owners rows: (owner, first due expiry, due documents, window, window due,
    due document ids)."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows
        self.fetched = 0

    def fetchmany(self, size: int) -> list[tuple[Any, ...]]:
        chunk = self.rows[self.fetched:self.fetched + size]
        self.fetched += len(chunk)
        return chunk


def _rows(due: list[int], not_due: int) -> list[tuple[Any, ...]]:
    window, total = sum(due) + not_due * 2, sum(due)
    return ([(uuid.uuid4(), FIRST, n, window, total, [str(uuid.uuid4()) for _ in range(n)])
             for n in due]
            + [(uuid.uuid4(), None, 0, window, total, None) for _ in range(not_due)])


@pytest.mark.parametrize("batch_size", [1, 2, 3, 10])
def test_due_owners_stop_at_the_first_owner_with_nothing_due(batch_size: int) -> None:
    rows = _rows([1, 2, 1, 3, 1], not_due=4)
    due = DueOwners(FakeCursor(rows))  # type: ignore[arg-type]

    batches = list(owner_batches(due.fetch, batch_size))

    assert (due.window_documents, due.due_documents) == (16, 8)
    assert [owner.owner_user_id for batch in batches for owner in batch.owners] == [
        r[0] for r in rows[:5]]
    assert [owner.document_ids for batch in batches for owner in batch.owners] == [
        r[5] for r in rows[:5]]
    assert sum(batch.documents for batch in batches) == 8
    assert all(batch.documents <= batch_size or len(batch.owners) == 1 for batch in batches)


def test_no_due_owner_reads_nothing_more() -> None:
    cursor = FakeCursor(_rows([], not_due=3))
    due = DueOwners(cursor)  # type: ignore[arg-type]

    assert (due.window_documents, due.due_documents) == (6, 0)
    assert due.fetch(500) == [] and cursor.fetched == 1


def test_empty_window() -> None:
    due = DueOwners(FakeCursor([]))  # type: ignore[arg-type]

    assert (due.window_documents, due.due_documents, due.fetch(10)) == (0, 0, [])
