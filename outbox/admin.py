"""The outbox in the admin: browse messages read-only; the one write is re-queueing parked
messages, for holders of `outbox.requeue_outboxmessage`, each recorded in the admin log.

The re-queue is the operator's one write, the admin's action and manage.py requeue_outbox's
alike (`requeue_preview`, `requeue`): a preview of what would go back, and the re-queue,
which says what it did in one log line (logger `outbox.requeue`: counts and message ids, never a
payload or a key) and counts it in `profile_outbox_requeued_total{via}`.

Re-queue clears `parked_at` and resets `attempts` to 0 so the relay tries again with its
full budget; `last_error` is kept as the record of why it was parked until the relay
overwrites it.
"""

import json
import logging
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from core.admin import (
    OverviewCard,
    ReadOnlyAdmin,
    RunIdFilter,
    clipped,
    compact_time,
    exact_uuid_filter,
    short_id,
)
from core.logs import log_event
from outbox import metrics
from outbox import store as outbox_store
from outbox.models import OutboxMessage, OutboxMessageQuerySet

logger = logging.getLogger("outbox.requeue")

REQUEUE_PERMISSION = "outbox.requeue_outboxmessage"
# Whoever lacks it sees the payloads with the documents' number masks redacted.
NUMBER_MASKS_PERMISSION = "outbox.view_number_masks"
# The payload keys holding a number mask (the reminder event's contract: documents[].numberMask).
MASK_KEYS = frozenset({"numberMask"})
MASK_REDACTED = "(hidden: needs outbox.view_number_masks)"
ERROR_PREVIEW_CHARS = 60
CHANGELIST = "admin:outbox_outboxmessage_changelist"
# The re-queue's log line.
REQUEUED = "outbox messages requeued"


def requeue_preview(using: str, ids: Sequence[uuid.UUID] | None) -> list[outbox_store.ParkedRow]:
    """The parked rows a re-queue of `ids` (None: all) would make deliverable again, oldest
    parked first; changes nothing."""
    return outbox_store.requeue_preview(using, ids)


def requeue(using: str, ids: Sequence[uuid.UUID] | None, *, via: str) -> list[uuid.UUID]:
    """Make the parked rows among `ids` (None: all) deliverable again with fresh attempts; the
    ids re-queued. Logged and counted, also when nothing was parked."""
    requeued = outbox_store.requeue_parked(using, ids)
    metrics.install_requeue_metrics()
    metrics.record_requeued(len(requeued), via)
    not_parked = [] if ids is None else sorted(set(ids) - set(requeued))
    log_event(logger, logging.INFO, REQUEUED, via=via, selected="all" if ids is None else "ids",
              requeued=len(requeued), ids=sorted(str(i) for i in requeued),
              not_parked=len(not_parked), not_parked_ids=[str(i) for i in not_parked])
    return requeued


def backlog_card() -> OverviewCard:
    """The outbox's card on the admin overview: the one backlog query's numbers."""
    backlog = outbox_store.backlog("default")
    lines = [f"unpublished (waiting for the relay), {backlog.parked} parked"]
    if backlog.oldest_created_at is not None:
        lines.append(f"oldest from {backlog.oldest_created_at:%Y-%m-%d %H:%M} UTC")
    return OverviewCard(
        id="overview-outbox", title="Outbox", value=backlog.unpublished, lines=tuple(lines),
        link_url=reverse(CHANGELIST) + "?delivery=unpublished",
        link_text="Unpublished messages",
    )


class DeliveryStateFilter(admin.SimpleListFilter):
    """Published; unpublished (the backlog: waiting for the relay, parked ones excluded); or
    parked (waiting for an operator): the backlog's definitions (docs/design.md §2.4, the
    query `outbox_backlog`), so a choice lists as many rows as the overview counts.

    The states are OutboxMessage.objects' (outbox/models.py).
    """

    title = "delivery"
    parameter_name = "delivery"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("published", "Published"), ("unpublished", "Unpublished (waiting for the relay)"),
                ("parked", "Parked (waiting for an operator)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        queryset = cast(OutboxMessageQuerySet, queryset)
        match self.value():
            case "published":
                return queryset.published()
            case "unpublished":
                return queryset.waiting()
            case "parked":
                return queryset.parked()
            case _:
                return queryset


class CorrelationFilter(RunIdFilter):
    """The events one run wrote: `?correlation_id=<run id>` (their headers carry it), as the
    run history links to them, with the run's window in `created_at__gte` / `__lte` (which
    ix_outbox_messages_created_at serves, instead of a scan of the whole outbox).
    """

    title = "run (correlation id)"
    parameter_name = "correlation_id"

    def rows_of_run(self, request: HttpRequest, queryset: QuerySet[Any],
                    run_id: uuid.UUID) -> QuerySet[Any]:
        return queryset.filter(headers__correlation_id=str(run_id))


def masks_redacted(value: Any) -> Any:
    """`value` (a payload) with every number mask (MASK_KEYS, at any depth) replaced."""
    if isinstance(value, dict):
        return {key: MASK_REDACTED if key in MASK_KEYS and item is not None
                else masks_redacted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [masks_redacted(item) for item in value]
    return value


def _pretty_json(value: Any) -> SafeString:
    return format_html('<pre class="outbox-json">{}</pre>',
                       json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ReadOnlyAdmin):
    list_display = ("message", "event_type", "key", "run", "created", "published", "attempts",
                    "error_preview", "parked")
    list_filter = (DeliveryStateFilter, CorrelationFilter)
    ordering = ("-created_at",)
    indexed_fields = ("id", "created_at")
    search_fields = ("=id", "=message_key")
    search_help_text = "Paste a message id or an owner id (the message key), as an exact UUID."
    actions = ("requeue_parked",)
    fields = ("id", "event_type", "contract_version", "topic", "message_key", "aggregate_type",
              "aggregate_id", "created_at", "published_at", "parked_at", "attempts", "last_error",
              "payload_json", "headers_json")
    readonly_fields = ("published_at", "payload_json", "payload_redacted_json", "headers_json")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return cast(OutboxMessageQuerySet, super().get_queryset(request)).with_published_time()

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(REQUEUE_PERMISSION)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Any], bool]:
        return exact_uuid_filter(queryset, search_term, ("id",), text_fields=("message_key",)), False

    @admin.display(description="message", ordering="id")
    def message(self, message: OutboxMessage) -> SafeString:
        return short_id(message.pk)

    @admin.display(description="key (owner)", ordering="message_key")
    def key(self, message: OutboxMessage) -> SafeString:
        return short_id(message.message_key)

    @admin.display(description="run", empty_value="")
    def run(self, message: OutboxMessage) -> SafeString:
        """The run that wrote it (the correlation id), linked to all that run's events."""
        run_id = message.headers.get("correlation_id") if isinstance(message.headers, dict) else None
        if not run_id:
            return SafeString("")
        url = reverse(CHANGELIST) + "?" + urlencode({"correlation_id": run_id})
        return format_html('<a href="{}">{}</a>', url, short_id(run_id))

    @admin.display(description="created (UTC)", ordering="created_at")
    def created(self, message: OutboxMessage) -> str:
        return compact_time(message.created_at)

    @admin.display(description="published (UTC)", ordering="published_time", empty_value="")
    def published(self, message: OutboxMessage) -> str:
        """When it was published, in the stream (its batch's time) or by the slow lane."""
        return compact_time(getattr(message, "published_time", message.published_at))

    @admin.display(description="last error", empty_value="")
    def error_preview(self, message: OutboxMessage) -> SafeString:
        return clipped(message.last_error, ERROR_PREVIEW_CHARS)

    @admin.display(description="parked", ordering="parked_at", empty_value="")
    def parked(self, message: OutboxMessage) -> SafeString:
        """Only what needs an operator: a parked row says so; a healthy row shows nothing."""
        if message.parked_at is None:
            return SafeString("")
        return format_html('<span class="attention" title="parked at {} UTC">parked</span>',
                           compact_time(message.parked_at))

    @admin.display(description="payload")
    def payload_json(self, message: OutboxMessage) -> SafeString:
        return _pretty_json(message.payload)

    @admin.display(description="payload (number masks hidden)")
    def payload_redacted_json(self, message: OutboxMessage) -> SafeString:
        return _pretty_json(masks_redacted(message.payload))

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # A display has no request: which payload field a user sees is chosen here.
        if request.user.has_perm(NUMBER_MASKS_PERMISSION):
            return self.fields
        return tuple("payload_redacted_json" if f == "payload_json" else f for f in self.fields)

    @admin.display(description="headers")
    def headers_json(self, message: OutboxMessage) -> SafeString:
        return _pretty_json(message.headers)

    @admin.action(permissions=["requeue"], description="Re-queue the selected parked messages")
    def requeue_parked(self, request: HttpRequest, queryset: QuerySet[OutboxMessage]) -> None:
        with transaction.atomic():
            parked = list(cast(OutboxMessageQuerySet, queryset).parked()
                          .order_by("created_at").select_for_update())
            # The relay's own re-queue: attempts and the retry delay reset, the row goes out at
            # once; logged and counted as the command's.
            requeue(queryset.db, [m.pk for m in parked], via="admin")
            for message in parked:
                self.log_change(request, message, (
                    f"Re-queued: parked_at cleared (was {message.parked_at:%Y-%m-%d %H:%M:%S} UTC) "
                    f"and attempts reset (was {message.attempts})."
                ))
        skipped = queryset.count() - len(parked)
        self.message_user(request, f"Re-queued {len(parked)} parked message(s).", messages.SUCCESS)
        if skipped:
            self.message_user(request, f"Left {skipped} selected message(s) alone: not parked.",
                              messages.WARNING)


def run_events_url(run_id: str, started_at: datetime, finished_at: datetime | None) -> str:
    """This list filtered to the events a run wrote (correlation id = run id), created while
    it ran (the window lets the indexes find them); offered to the run history (apps.py)."""
    params = {"correlation_id": run_id, "created_at__gte": started_at.isoformat()}
    if finished_at is not None:
        params["created_at__lte"] = finished_at.isoformat()
    return reverse("admin:outbox_outboxmessage_changelist") + "?" + urlencode(params)

