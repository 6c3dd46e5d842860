"""The dry run (`--dry-run`): what a batch's claim would do, decided by `rules.decide` in
Python and written nowhere. The claim statement mirrors the same rules in SQL."""

import uuid
from collections.abc import Sequence
from datetime import date

from reminders import events, rules, store

Due = tuple[store.DocumentRow, rules.Decision]


def most_urgent_per_owner(due: list[Due], cap: int) -> list[Due]:
    """At most `cap` due documents per owner, most urgent first (days left, then id): the
    event stays within a sane size; the rest stay unmarked, due again next cycle."""
    by_owner: dict[uuid.UUID, list[Due]] = {}
    for pair in due:
        by_owner.setdefault(pair[0].owner_user_id, []).append(pair)
    kept: list[Due] = []
    for pairs in by_owner.values():
        kept += pairs if len(pairs) <= cap else sorted(
            pairs, key=lambda p: (p[1].days_left, p[0].id))[:cap]
    return kept


def claim_batch(
    using: str,
    owner_ids: Sequence[uuid.UUID],
    window: rules.Window,
    thresholds: Sequence[int],
    as_of_date: date,
    *,
    max_documents_per_event: int = events.MAX_DOCUMENTS_PER_EVENT,
) -> store.BatchClaim:
    """What `store.claim_batch` would claim for these owners, counted the same way."""
    documents = store.batch_documents(using, owner_ids, window)
    due = [(doc, decision) for doc in documents if (decision := rules.decide(
        doc.expires_on, as_of_date, thresholds, doc.markers)) is not None]
    kept = most_urgent_per_owner(due, max_documents_per_event)
    notified = sorted(
        (store.NotifiedItem(str(doc.owner_user_id), str(doc.id), doc.type, decision.notify,
                            decision.days_left)
         for doc, decision in kept if decision.notify is not None),
        key=lambda item: (item.owner_user_id, item.days_left, item.document_id))  # as the claim
    return store.BatchClaim(
        markers_won=sum(len(decision.markers) for _, decision in kept),
        markers_rearmed=sum(len(decision.rearmed) for _, decision in kept),
        due_documents=len(kept),
        events_written=len({item.owner_user_id for item in notified}),
        # the dry run shows no message ids and does not look for them in the outbox
        owners_already_queued=0,
        notified=notified,
    )
