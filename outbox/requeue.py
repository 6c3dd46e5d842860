"""Re-queueing parked outbox messages, the operator's one write (manage.py requeue_outbox and the
admin's action): a preview of what would go back, and the re-queue, which says what it did in one
log line (counts and message ids, never a payload or a key) and counts it in
`profile_outbox_requeued_total{via}`."""

import logging
import uuid
from collections.abc import Sequence

from core.logs import log_event
from outbox import metrics, store

logger = logging.getLogger("outbox.requeue")

REQUEUED = "outbox messages requeued"


def preview(using: str, ids: Sequence[uuid.UUID] | None) -> list[store.ParkedRow]:
    """The parked rows a re-queue of `ids` (None: all) would make deliverable again, oldest
    parked first; changes nothing."""
    return store.requeue_preview(using, ids)


def requeue(using: str, ids: Sequence[uuid.UUID] | None, *, via: str) -> list[uuid.UUID]:
    """Make the parked rows among `ids` (None: all) deliverable again with fresh attempts; the
    ids re-queued. Logged and counted, also when nothing was parked."""
    requeued = store.requeue_parked(using, ids)
    metrics.install_requeue_metrics()
    metrics.record_requeued(len(requeued), via)
    not_parked = [] if ids is None else sorted(set(ids) - set(requeued))
    log_event(logger, logging.INFO, REQUEUED, via=via, selected="all" if ids is None else "ids",
              requeued=len(requeued), ids=sorted(str(i) for i in requeued),
              not_parked=len(not_parked), not_parked_ids=[str(i) for i in not_parked])
    return requeued
