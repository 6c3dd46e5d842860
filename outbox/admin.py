"""The outbox in the admin: browse messages read-only; the one write is re-queueing parked
messages, for holders of `outbox.requeue_outboxmessage`, each recorded in the admin log.

Re-queue clears `parked_at` and resets `attempts` to 0 so the relay tries again with its
full budget; `last_error` is kept as the record of why it was parked until the relay
overwrites it.
"""

import json
from typing import Any

from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from core.admin import OverviewCard, ReadOnlyAdmin, exact_uuid_filter
from outbox import store as outbox_store
from outbox.models import OutboxMessage

REQUEUE_PERMISSION = "outbox.requeue_outboxmessage"
ERROR_PREVIEW_CHARS = 80


def backlog_card() -> OverviewCard:
    """The outbox's card on the admin overview: the one backlog query's numbers."""
    backlog = outbox_store.backlog("default")
    lines = [f"unpublished, {backlog.parked} parked"]
    if backlog.oldest_created_at is not None:
        lines.append(f"oldest from {backlog.oldest_created_at:%Y-%m-%d %H:%M} UTC")
    return OverviewCard(
        id="overview-outbox", title="Outbox", value=backlog.unpublished, lines=tuple(lines),
        link_url=reverse("admin:outbox_outboxmessage_changelist") + "?delivery=unpublished",
        link_text="Unpublished messages",
    )


class DeliveryStateFilter(admin.SimpleListFilter):
    """Published, unpublished (waiting for the relay) or parked (waiting for an operator).

    Parked messages are unpublished ones, so both unpublished states ride the partial index
    ix_outbox_messages_unpublished.
    """

    title = "delivery"
    parameter_name = "delivery"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("published", "Published"), ("unpublished", "Unpublished"), ("parked", "Parked")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        match self.value():
            case "published":
                return queryset.filter(published_at__isnull=False)
            case "unpublished":
                return queryset.filter(published_at__isnull=True)
            case "parked":
                return queryset.filter(published_at__isnull=True, parked_at__isnull=False)
            case _:
                return queryset


def _pretty_json(value: Any) -> SafeString:
    return format_html('<pre class="outbox-json">{}</pre>',
                       json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ReadOnlyAdmin):
    list_display = ("event_type", "message_key", "created_at", "published_at", "attempts",
                    "error_preview", "parked")
    list_filter = (DeliveryStateFilter,)
    ordering = ("-created_at",)
    search_fields = ("=id", "=message_key")
    search_help_text = "Paste a message id or an owner id (the message key), as an exact UUID."
    actions = ("requeue_parked",)
    fields = ("id", "event_type", "contract_version", "topic", "message_key", "aggregate_type",
              "aggregate_id", "created_at", "published_at", "parked_at", "attempts", "last_error",
              "payload_json", "headers_json")
    readonly_fields = ("payload_json", "headers_json")

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(REQUEUE_PERMISSION)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Any], bool]:
        return exact_uuid_filter(queryset, search_term, ("id",), text_fields=("message_key",)), False

    @admin.display(description="last error")
    def error_preview(self, message: OutboxMessage) -> str:
        error = message.last_error or ""
        return error if len(error) <= ERROR_PREVIEW_CHARS else error[: ERROR_PREVIEW_CHARS - 1] + "…"

    @admin.display(boolean=True, description="parked")
    def parked(self, message: OutboxMessage) -> bool:
        return message.parked_at is not None

    @admin.display(description="payload")
    def payload_json(self, message: OutboxMessage) -> SafeString:
        return _pretty_json(message.payload)

    @admin.display(description="headers")
    def headers_json(self, message: OutboxMessage) -> SafeString:
        return _pretty_json(message.headers)

    @admin.action(permissions=["requeue"], description="Re-queue the selected parked messages")
    def requeue_parked(self, request: HttpRequest, queryset: QuerySet[OutboxMessage]) -> None:
        with transaction.atomic():
            parked = list(queryset.filter(published_at__isnull=True, parked_at__isnull=False)
                          .order_by("created_at").select_for_update())
            # The relay's own re-queue: it also clears the lease, so the row goes out at once.
            outbox_store.requeue_parked(queryset.db, [m.pk for m in parked])
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
