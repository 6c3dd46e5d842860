"""A small, obviously-correct model of the reminder rules (docs/design.md §3.2), written for the tests
only and independent of `reminders.rules`: the chaos scenarios and the property test compare
what the worker left in the database with what this model says a run (or a sequence of
daily runs) must leave.

Read it as the specification, one day at a time:
- a document takes part when it is Active, not deleted, has an expiry, and its UTC expiry
  date lies from `retention` days before the as-of date to `max(thresholds)` days after;
- `left` = UTC expiry date - UTC as-of date; a threshold `t` is reached when `left <= t`;
- a marker counts only for the expiry date it was written for: after a renewal (or a
  correction) the document's markers of the old date count for nothing, and the new one
  replaces the old one for its threshold, as its next arming (a marker written where none
  was is arming 1);
- reached thresholds without a marker get one; the smallest of them is "the one to tell",
  and it is told (notified, and listed in the owner's event of the day) unless the document
  already has a marker for an even smaller threshold (it was told something more urgent);
- at most `cap` documents per owner per day, the most urgent first (smallest `left`, then
  id); the others get nothing that day;
- an event item carries the document's type, or "Unknown" when that is blank;
- at the end of the day, markers whose expiry date is before as-of date - retention go;
- an owner's event of the day has the message id the contract names: the owner, then each
  item's (document, threshold, expiry date) and, from its second on, the arming of its marker.
"""

import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from django.db import connection

from reminders.events import MESSAGE_ID_NAMESPACE
from tests.support.contract import contract_name, recipe

DEFAULT_CAP = 500


@dataclass(frozen=True)
class RefDocument:
    id: uuid.UUID
    owner: uuid.UUID
    type: str
    number_mask: str | None
    expires_at: datetime | None
    active: bool  # status = 'Active' and not soft-deleted


@dataclass(frozen=True)
class RefMarker:
    notified: bool
    expiry_day: date
    arming: int = 1


@dataclass
class ReferenceLedger:
    """The markers and events the worker must have produced after the runs fed to `run`."""

    # document id -> {threshold: marker}
    markers: dict[uuid.UUID, dict[int, RefMarker]] = field(default_factory=dict)
    # (owner, as-of date) -> {document id: event item}
    events: dict[tuple[uuid.UUID, date], dict[uuid.UUID, dict[str, Any]]] = field(
        default_factory=dict)
    # markers that replaced one of another expiry date
    rearmed: int = 0
    # (owner, as-of date) -> {document id: the arming of the marker its event item told}
    told_armings: dict[tuple[uuid.UUID, date], dict[uuid.UUID, int]] = field(
        default_factory=dict)

    def copy(self) -> "ReferenceLedger":
        return ReferenceLedger({d: dict(m) for d, m in self.markers.items()},
                               {k: dict(v) for k, v in self.events.items()}, self.rearmed,
                               {k: dict(v) for k, v in self.told_armings.items()})

    def run(self, documents: list[RefDocument], as_of: datetime, thresholds: tuple[int, ...],
            retention_days: int = 90, cap: int = DEFAULT_CAP) -> None:
        """One clean run of the worker at `as_of` with `thresholds`."""
        today = as_of.astimezone(UTC).date()
        wanted: dict[uuid.UUID, list[tuple[int, uuid.UUID, RefDocument]]] = defaultdict(list)
        for doc in documents:
            if not doc.active or doc.expires_at is None:
                continue
            expiry_day = doc.expires_at.astimezone(UTC).date()
            left = (expiry_day - today).days
            if left < -retention_days or left > max(thresholds):
                continue
            marked = _of_day(self.markers.get(doc.id, {}), expiry_day)
            if any(t not in marked for t in thresholds if left <= t):
                wanted[doc.owner].append((left, doc.id, doc))
        for owner, due in wanted.items():
            for left, _id, doc in sorted(due, key=lambda x: (x[0], x[1]))[:cap]:
                self._remind(doc, owner, left, today, thresholds)
        for kept in self.markers.values():
            for t in [t for t, m in kept.items() if (m.expiry_day - today).days < -retention_days]:
                del kept[t]

    def _remind(self, doc: RefDocument, owner: uuid.UUID, left: int, today: date,
                thresholds: tuple[int, ...]) -> None:
        assert doc.expires_at is not None
        expiry_day = doc.expires_at.astimezone(UTC).date()
        marked = self.markers.setdefault(doc.id, {})
        current = _of_day(marked, expiry_day)
        new = sorted(t for t in thresholds if left <= t and t not in current)
        to_tell = new[0]
        told_more_urgent = any(t < to_tell for t in current)
        for t in new:
            self.rearmed += t in marked
            arming = marked[t].arming + 1 if t in marked else 1
            marked[t] = RefMarker(notified=(t == to_tell and not told_more_urgent),
                                  expiry_day=expiry_day, arming=arming)
        if not told_more_urgent:
            self.events.setdefault((owner, today), {})[doc.id] = {
                "documentId": str(doc.id), "type": doc.type if doc.type.strip() else "Unknown",
                "numberMask": doc.number_mask,
                "expiresAt": expiry_day.isoformat(), "thresholdDays": to_tell,
                "daysLeft": left,
            }
            self.told_armings.setdefault((owner, today), {})[doc.id] = marked[to_tell].arming

    def marker_set(self) -> set[tuple[uuid.UUID, int, bool, date]]:
        """(document, threshold, notified, the expiry date the marker answers for)."""
        return {(d, t, m.notified, m.expiry_day)
                for d, marked in self.markers.items() for t, m in marked.items()}

    def armings(self) -> dict[tuple[uuid.UUID, int], int]:
        """(document, threshold) -> the arming its marker is in."""
        return {(d, t): m.arming for d, marked in self.markers.items() for t, m in marked.items()}

    def message_ids(self) -> dict[tuple[uuid.UUID, date], uuid.UUID]:
        """(owner, as-of date) -> the message id of the owner's event of that day."""
        return {
            (owner, day): recipe(MESSAGE_ID_NAMESPACE, contract_name(str(owner), [
                (item["documentId"], item["thresholdDays"], item["expiresAt"],
                 self.told_armings[(owner, day)][document])
                for document, item in items.items()]))
            for (owner, day), items in self.events.items()}

    def reminders(self) -> int:
        """How many (document, threshold) reminders were notified."""
        return sum(m.notified for marked in self.markers.values() for m in marked.values())


def _of_day(marked: dict[int, RefMarker], expiry_day: date) -> set[int]:
    """The thresholds marked for this expiry date (markers of another date do not count)."""
    return {t for t, m in marked.items() if m.expiry_day == expiry_day}


def documents_from_database() -> list[RefDocument]:
    """Every row of person_documents, as the model sees it (read as the table's owner).

    Expiries beyond what Python's datetime holds (BC dates, year 10000+) are clamped to year
    1 / 9999: far outside any window either way.
    """
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        cursor.execute(
            "select id, owner_user_id, type, number_mask,"
            " greatest(least(expires_at, '9999-12-31 00:00+00'), '0001-01-02 00:00+00'),"
            " status = 'Active' and deleted_at is null"
            " from person_documents order by id")
        return [RefDocument(*row) for row in cursor.fetchall()]
