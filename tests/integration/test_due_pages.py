"""The due owners by pages (behind a transaction pooler, `DATABASE_POOL_MODE=transaction`):
the same cycle as the held cursor's, most urgent owners first, one event an owner a cycle,
nothing read twice when an owner claimed on one page has documents left due (the cap) after
the next page's key, and the census of the first pass."""

import uuid
from collections.abc import Iterator

import pytest
from django.db import connections

from reminders import store
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import CycleRunner
from tests.support.factories import Documents
from tests.support.ledger import AS_OF, events, expiring_in

OWNERS = 12


@pytest.fixture
def by_pages(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The paged due list, a page of two owners at batch size 1 (DUE_PAGE_BATCHES = 2); the
    owners of the pages read, in order."""
    monkeypatch.setitem(connections["default"].settings_dict, "DISABLE_SERVER_SIDE_CURSORS", True)
    monkeypatch.setattr(store, "DUE_PAGE_BATCHES", 2)
    pages: list[int] = []
    reader = store._due_page_reader

    def counted(*args: object, **kwargs: object) -> object:
        read = reader(*args, **kwargs)  # type: ignore[arg-type]

        def read_page(after: store.DueOwner | None) -> list[tuple[object, ...]]:
            rows = read(after)
            pages.append(sum(row[0] is not None for row in rows))  # owners, not the census row
            return rows

        return read_page

    monkeypatch.setattr(store, "_due_page_reader", counted)
    yield pages


def _owners(documents: Documents, count: int, per_owner: int) -> list[uuid.UUID]:
    """`count` owners, owner i's documents due in i + 1, i + 1 + count, ... days: the list's
    order is the owners' order, and an owner's second document is after every first one."""
    owners = [uuid.uuid4() for _ in range(count)]
    for n, owner in enumerate(owners):
        for k in range(per_owner):
            documents(owner_user_id=owner, expires_at=expiring_in(n + 1 + k * count))
    return owners


def test_by_pages_most_urgent_first_one_event_an_owner_and_the_census(
        run: CycleRunner, documents: Documents, by_pages: list[int]) -> None:
    owners = _owners(documents, OWNERS, per_owner=2)

    # One claim connection: the events' order is the due list's (two commit a pair either way).
    result = run(AS_OF, batch_size=1, claim_connections=1)

    assert result.ok, result.error
    assert [e["ownerUserId"] for e in events()] == [str(o) for o in owners]
    assert (result.window_documents, result.due_documents) == (2 * OWNERS, 2 * OWNERS)
    assert result.reminders_sent == 2 * OWNERS
    # pages of two owners, then the empty one that ends the list
    assert by_pages == [2] * (OWNERS // 2) + [0]

    again = run(AS_OF, batch_size=1)  # nothing due: the census still counts the window

    assert (again.window_documents, again.due_documents) == (2 * OWNERS, 0)
    assert again.reminders_sent == 0
    assert_outbox_matches_contract()


def test_by_pages_an_owner_capped_on_one_page_is_not_read_again_on_the_next(
        run: CycleRunner, documents: Documents, by_pages: list[int]) -> None:
    # Each owner's second document is past the cap: still due after its claim, its first due
    # expiry moves past every other owner's key (the pages after would list it again).
    owners = _owners(documents, OWNERS, per_owner=2)

    result = run(AS_OF, batch_size=1, max_documents_per_event=1, claim_connections=1)

    assert result.ok, result.error
    assert [e["ownerUserId"] for e in events()] == [str(o) for o in owners]
    assert result.reminders_sent == OWNERS
    assert result.owners_notified == OWNERS
    assert by_pages == [2] * (OWNERS // 2) + [0]

    again = run(AS_OF, batch_size=1, max_documents_per_event=1)  # the next cycle: the rest

    assert again.reminders_sent == OWNERS
    assert len(events()) == 2 * OWNERS
    assert_outbox_matches_contract()


def test_by_pages_the_dry_run_reads_each_owner_once(
        run: CycleRunner, documents: Documents, by_pages: list[int]) -> None:
    _owners(documents, OWNERS, per_owner=2)

    result = run(AS_OF, batch_size=1, dry_run=True)

    assert result.owners_notified == OWNERS
    assert result.reminders_sent == 2 * OWNERS
    assert not events()
