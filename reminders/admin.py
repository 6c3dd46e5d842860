"""The operator's window onto the worker: the ledger, the run history and an overview page.

Everything here is read-only, superusers included (docs/design.md §5). List pages stay fast on a
ledger of millions of rows: no full count, exact-UUID search through the indexes, filters
whose choices cost a few index probes, and a date hierarchy that skips through an index.
"""

import uuid
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Any, Literal
from urllib.parse import urlencode

from django.contrib import admin
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from core.admin import (
    ReadOnlyAdmin,
    RunIdFilter,
    clipped,
    compact_time,
    exact_uuid_filter,
    run_events_link,
    short_id,
)
from core.config import MAX_COUNT, is_whole_number
from reminders.events import DOCUMENT_TYPES
from reminders.models import DocumentExpiryReminder, ReminderRun
from reminders.overview import configured_thresholds, days_label, overview_context

DatetimeKind = Literal["year", "month", "week", "day", "hour", "minute", "second"]
ERROR_PREVIEW_CHARS = 40
HOST_PREVIEW_CHARS = 16
# The ledger's type column holds this many characters.
TYPE_CHARS = DocumentExpiryReminder._meta.get_field("type").max_length or 32


def _next_period(start: datetime, kind: str) -> datetime:
    """The first instant of the year, month or day after the one `start` opens."""
    if kind == "year":
        return start.replace(year=start.year + 1)
    if kind == "month":
        return start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)
    following: date = start.date() + timedelta(days=1)
    return start.replace(year=following.year, month=following.month, day=following.day)


def _period_start(instant: datetime, kind: str) -> datetime:
    local = timezone.localtime(instant)
    local = local.replace(hour=0, minute=0, second=0, microsecond=0)
    if kind in ("year", "month"):
        local = local.replace(day=1)
    if kind == "year":
        local = local.replace(month=1)
    return local


class LedgerQuerySet(QuerySet[DocumentExpiryReminder]):
    """The admin's ledger queryset: the date hierarchy finds its years, months or days by
    skipping through the reminded_at index (one probe per period) instead of a DISTINCT
    over every row."""

    def datetimes(self, field_name: str, kind: DatetimeKind, order: Literal["ASC", "DESC"] = "ASC",
                  tzinfo: tzinfo | None = None) -> "QuerySet[DocumentExpiryReminder, datetime]":
        if field_name != "reminded_at" or kind not in ("year", "month", "day"):
            return super().datetimes(field_name, kind, order, tzinfo)
        probe = self.order_by(field_name).values_list("pk", field_name)
        representatives = []
        row = probe.first()
        while row is not None:
            representatives.append(row[0])
            following = _next_period(_period_start(row[1], kind), kind)
            row = probe.filter(reminded_at__gte=following).first()
        narrowed = self.filter(pk__in=representatives)
        return QuerySet.datetimes(narrowed, field_name, kind, order, tzinfo)


class ThresholdFilter(admin.SimpleListFilter):
    title = "threshold (days)"
    parameter_name = "threshold_days"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # The configured thresholds (REMINDER_THRESHOLDS_DAYS): a DISTINCT would read every row.
        # Filtered lists walk the reminded_at index, and every threshold is common there.
        return [(str(t), days_label(t)) for t in configured_thresholds()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        if not is_whole_number(value) or abs(int(value)) > MAX_COUNT:
            raise BadRequest("threshold_days: expected a whole number of days")
        return queryset.filter(threshold_days=int(value))


class DocumentTypeFilter(admin.SimpleListFilter):
    title = "document type"
    parameter_name = "type"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # A fixed list (others can still be typed in the URL): a DISTINCT would read every row.
        return [(t, t) for t in DOCUMENT_TYPES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is not None and (len(value) > TYPE_CHARS or "\x00" in value):
            raise BadRequest(f"type: expected a document type of at most {TYPE_CHARS} characters")
        return queryset if value is None else queryset.filter(type=value)


class RunFilter(RunIdFilter):
    """The markers a run wrote: `?run_id=<uuid>`, as the run history links to them.

    The run's markers were reminded between its start and its end (both on the database's
    clock, as reminded_at is), so the filter walks that slice of the reminded_at index
    instead of every marker.
    """

    parameter_name = "run_id"

    def rows_of_run(self, request: HttpRequest, queryset: QuerySet[Any],
                    run_id: uuid.UUID) -> QuerySet[Any]:
        queryset = queryset.filter(run_id=run_id)
        run = ReminderRun.objects.filter(run_id=run_id).only("started_at", "finished_at").first()
        if run is not None:
            queryset = queryset.filter(reminded_at__gte=run.started_at)
            if run.finished_at is not None:
                queryset = queryset.filter(reminded_at__lte=run.finished_at)
        return queryset


def run_markers_url(run: ReminderRun) -> str:
    """The ledger filtered to the markers `run` wrote."""
    return (reverse("admin:reminders_documentexpiryreminder_changelist") + "?"
            + urlencode({"run_id": str(run.run_id)}))


def run_events_url(run: ReminderRun) -> str:
    """The events `run` wrote, as the app that lists them links to them (core.admin's
    registry: reminders and outbox never import each other); "" without such an app."""
    link = run_events_link()
    return "" if link is None else link(str(run.run_id), run.started_at, run.finished_at)


class ExpiryRangeFilter(admin.DateFieldListFilter):
    """Expiry-date ranges around today (UTC), past and future; served by the expires_at index."""

    def __init__(self, field: Any, request: HttpRequest, params: dict[str, Any],  # noqa: PLR0917
                 model: Any, model_admin: Any, field_path: str) -> None:
        super().__init__(field, request, params, model, model_admin, field_path)
        today = timezone.now().date()

        def between(first: int, after_last: int) -> dict[str, bool | date | datetime]:
            return {self.lookup_kwarg_since: today + timedelta(days=first),
                    self.lookup_kwarg_until: today + timedelta(days=after_last)}

        self.links = (
            ("Any date", {}),
            ("Expired 31 to 90 days ago", between(-90, -30)),
            ("Expired in the last 30 days", between(-30, 0)),
            ("Expires today", between(0, 1)),
            ("Expires within 7 days", between(0, 8)),
            ("Expires within 30 days", between(0, 31)),
            ("Expires in over 30 days", {self.lookup_kwarg_since: today + timedelta(days=31)}),
        )


@admin.register(DocumentExpiryReminder)
class DocumentExpiryReminderAdmin(ReadOnlyAdmin):
    list_display = ("document", "owner", "type", "threshold_days", "expires_at", "reminded",
                    "notified", "run")
    list_filter = (ThresholdFilter, DocumentTypeFilter, "notified", ("expires_at", ExpiryRangeFilter),
                   RunFilter)
    date_hierarchy = "reminded_at"
    indexed_fields = ("document_id", "owner_user_id")
    search_fields = ("=document_id", "=owner_user_id")
    search_help_text = "Paste a document id or an owner id (an exact UUID)."
    fields = ("id", "document_id", "owner_user_id", "type", "threshold_days", "expires_at",
              "armings", "reminded_at", "notified", "run_id")

    @admin.display(description="document")
    def document(self, marker: DocumentExpiryReminder) -> SafeString:
        return short_id(marker.document_id)

    @admin.display(description="owner")
    def owner(self, marker: DocumentExpiryReminder) -> SafeString:
        return short_id(marker.owner_user_id)

    @admin.display(description="reminded at (UTC)", ordering="reminded_at")
    def reminded(self, marker: DocumentExpiryReminder) -> str:
        return compact_time(marker.reminded_at)

    @admin.display(description="run")
    def run(self, marker: DocumentExpiryReminder) -> SafeString:
        url = reverse("admin:reminders_reminderrun_change", args=[marker.run_id])
        return format_html('<a href="{}">{}</a>', url, short_id(marker.run_id))

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        # Filtered by expiry, walk the expiry index: newest-reminded-first would walk the
        # reminded_at index past every marker reminded since (the two dates move together).
        if any(key.startswith("expires_at__") for key in request.GET):
            return ("-expires_at",)
        return ("-reminded_at",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[DocumentExpiryReminder]:
        queryset = super().get_queryset(request)
        return LedgerQuerySet(model=queryset.model, query=queryset.query, using=queryset.db)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Any], bool]:
        # Equality on the owner index and the dedupe index (document_id leads it): never a scan.
        return exact_uuid_filter(queryset, search_term, ("document_id", "owner_user_id")), False

    def get_urls(self) -> list[URLPattern]:
        overview = path("overview/", self.admin_site.admin_view(self.overview_view),
                        name="reminders_overview")
        return [overview, *super().get_urls()]

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": "Reminders overview",
            "opts": self.model._meta,
            **overview_context(timezone.now()),
        }
        return TemplateResponse(request, "admin/reminders/overview.html", context)


@admin.register(ReminderRun)
class ReminderRunAdmin(ReadOnlyAdmin):
    # What tells a bad run apart, on a 1440 px screen; the other counters (re-armed, skipped,
    # pruned) and the whole error are on the run's page.
    list_display = ("run", "started", "status_badge", "trigger", "as_of_date", "duration",
                    "sent", "owners", "markers", "failed", "error_preview", "host_name", "links")
    list_filter = ("status", "trigger")
    ordering = ("-started_at",)
    search_fields = ("=run_id",)
    search_help_text = "Paste a run id (an exact UUID)."
    fields = ("run_id", "status", "trigger", "tick", "as_of", "started_at", "finished_at",
              "duration_ms", "thresholds",
              "reminders_sent", "owners_notified", "markers_written", "markers_rearmed",
              "owners_already_queued", "skipped_already_marked", "pruned", "failed_owners",
              "error", "host", "links")
    readonly_fields = ("links",)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Any], bool]:
        return exact_uuid_filter(queryset, search_term, ("run_id",)), False

    @admin.display(description="run", ordering="run_id")
    def run(self, run: ReminderRun) -> SafeString:
        return short_id(run.run_id)

    @admin.display(description="started (UTC)", ordering="started_at")
    def started(self, run: ReminderRun) -> str:
        return compact_time(run.started_at, seconds=False)

    @admin.display(description="status", ordering="status")
    def status_badge(self, run: ReminderRun) -> SafeString:
        return format_html('<span class="run-status run-status-{}">{}</span>', run.status,
                           run.get_status_display())

    @admin.display(description="as of (UTC date)", ordering="as_of")
    def as_of_date(self, run: ReminderRun) -> str:
        # The rules count days on the as-of's UTC date; the instant is on the run's page.
        return f"{run.as_of.astimezone(UTC):%Y-%m-%d}"

    @admin.display(description="duration", ordering="duration_ms")
    def duration(self, run: ReminderRun) -> str:
        return "" if run.duration_ms is None else f"{run.duration_ms / 1000:,.1f} s"

    @admin.display(description="sent", ordering="reminders_sent")
    def sent(self, run: ReminderRun) -> int:
        return run.reminders_sent

    @admin.display(description="owners", ordering="owners_notified")
    def owners(self, run: ReminderRun) -> int:
        return run.owners_notified

    @admin.display(description="markers", ordering="markers_written")
    def markers(self, run: ReminderRun) -> int:
        return run.markers_written

    @admin.display(description="failed owners", ordering="failed_owners")
    def failed(self, run: ReminderRun) -> SafeString | int:
        if not run.failed_owners:
            return 0
        return format_html('<span class="attention">{}</span>', run.failed_owners)

    @admin.display(description="error", empty_value="")
    def error_preview(self, run: ReminderRun) -> SafeString:
        return clipped(run.error, ERROR_PREVIEW_CHARS)

    @admin.display(description="host", ordering="host")
    def host_name(self, run: ReminderRun) -> SafeString:
        return clipped(run.host, HOST_PREVIEW_CHARS)

    @admin.display(description="what it wrote")
    def links(self, run: ReminderRun) -> SafeString:
        events = run_events_url(run)
        if not events:
            return format_html('<span class="run-links"><a href="{}">markers</a></span>',
                               run_markers_url(run))
        return format_html('<span class="run-links"><a href="{}">markers</a><a href="{}">events</a></span>',
                           run_markers_url(run), events)
