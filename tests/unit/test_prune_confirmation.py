"""When prune_reminders asks for --yes (reminders.retention.reasons_to_confirm): past a tenth of
the ledger, or any marker of a document not expired yet on the database's clock."""

from datetime import date

import pytest

from reminders.retention import reasons_to_confirm
from reminders.store import PruneCensus

TODAY = date(2026, 11, 29)


@pytest.mark.parametrize(("expired", "markers", "asks"), [
    (0, 0, False), (0, 1000, False), (100, 1000, False), (101, 1000, True),
    (1, 10, False), (2, 10, True), (919, 919, True),
])
def test_more_than_a_tenth_of_the_ledger_asks(expired: int, markers: int, asks: bool) -> None:
    reasons = reasons_to_confirm(PruneCensus(expired, 0, markers, TODAY))
    assert bool(reasons) is asks
    if asks:
        assert reasons == [f"{expired} of the ledger's {markers} markers "
                           f"({expired * 100 // markers}%, more than 10%)"]


def test_any_marker_of_a_document_not_expired_yet_asks_and_both_reasons_are_said() -> None:
    assert reasons_to_confirm(PruneCensus(1, 1, 1000, TODAY)) == [
        "1 marker(s) of documents not expired yet (expiring on or after 2026-11-29, today on "
        "the database's clock)"]
    assert len(reasons_to_confirm(PruneCensus(500, 3, 1000, TODAY))) == 2
