"""The operator's window onto the worker: the ledger, the run history and an overview page.

Everything here is read-only, superusers included (docs/design.md §5). List pages stay fast on a
ledger of millions of rows: no full count, exact-UUID search through the indexes, filters
whose choices cost a few index probes, and a date hierarchy that skips through an index.
"""

from datetime import date, datetime, timedelta, tzinfo
from typing import Any, Literal

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone

from core.admin import ReadOnlyAdmin, exact_uuid_filter
from reminders.events import DOCUMENT_TYPES
from reminders.models import DocumentExpiryReminder, ReminderRun
from reminders.overview import configured_thresholds, days_label, overview_context

DatetimeKind = Literal["year", "month", "week", "day", "hour", "minute", "second"]


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
        if not value.lstrip("-").isdigit():
            return queryset.none()
        return queryset.filter(threshold_days=int(value))


class DocumentTypeFilter(admin.SimpleListFilter):
    title = "document type"
    parameter_name = "type"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # A fixed list (others can still be typed in the URL): a DISTINCT would read every row.
        return [(t, t) for t in DOCUMENT_TYPES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset if value is None else queryset.filter(type=value)


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
    list_display = ("document_id", "owner_user_id", "type", "threshold_days", "expires_at",
                    "reminded_at", "notified", "run_id")
    list_filter = (ThresholdFilter, DocumentTypeFilter, "notified", ("expires_at", ExpiryRangeFilter))
    date_hierarchy = "reminded_at"
    search_fields = ("=document_id", "=owner_user_id")
    search_help_text = "Paste a document id or an owner id (an exact UUID)."
    fields = ("id", "document_id", "owner_user_id", "type", "threshold_days", "expires_at",
              "reminded_at", "notified", "run_id")

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
    list_display = ("started_at", "status", "trigger", "as_of", "finished_at", "duration_ms",
                    "reminders_sent",
                    "owners_notified", "markers_written", "markers_rearmed",
                    "skipped_already_marked", "pruned", "failed_owners", "host")
    list_filter = ("status", "trigger")
    ordering = ("-started_at",)
    search_fields = ("=run_id",)
    search_help_text = "Paste a run id (an exact UUID)."
    fields = ("run_id", "status", "trigger", "tick", "as_of", "started_at", "finished_at",
              "duration_ms", "thresholds",
              "reminders_sent", "owners_notified", "markers_written", "markers_rearmed",
              "skipped_already_marked", "pruned", "failed_owners", "error", "host")

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Any], bool]:
        return exact_uuid_filter(queryset, search_term, ("run_id",)), False
