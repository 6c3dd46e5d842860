"""The read-only admin base of both apps, and what keeps their list pages fast on tables of
millions of rows: a paginator that never counts a whole table, and search by exact UUID
through the indexes. Also the overview cards an app offers to the project's overview page."""

import json
import uuid
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from django.contrib import admin
from django.contrib.admin.exceptions import NotRegistered
from django.contrib.auth.models import Group, User
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Q, QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from core.login_throttle import ThrottledLoginForm
from core.queries import QueryFile

QUERIES = QueryFile(Path(__file__).parent / "sql" / "admin.sql")

# Up to this many rows a list is counted exactly (cheap: the count stops at the bound).
EXACT_COUNT_LIMIT = 10_000
# List columns show ids and texts cut to these lengths; the full value is on hover (title).
SHORT_ID_CHARS = 8


def planner_estimate(queryset: QuerySet[Any]) -> int:
    """The row count PostgreSQL's planner expects for `queryset`, from EXPLAIN (no execution)."""
    sql, params = queryset.order_by().query.sql_with_params()
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(QUERIES["planner_estimate"].format(statement=sql), params)
        (plan,) = cursor.fetchone()
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return int(plan[0]["Plan"]["Plan Rows"])


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Counts exactly up to EXACT_COUNT_LIMIT rows; past that, takes the planner's estimate.

    `is_estimate` tells the template to say "about". The last pages of an estimated list
    may come out empty or short; nobody pages through millions of rows by hand.
    """

    is_estimate = False

    @cached_property
    def count(self) -> int:
        queryset: QuerySet[Any] = self.object_list  # type: ignore[assignment]
        bounded = queryset.order_by().values("pk")[: EXACT_COUNT_LIMIT + 1].count()
        if bounded <= EXACT_COUNT_LIMIT:
            return bounded
        self.is_estimate = True
        return max(planner_estimate(queryset), bounded)


def parse_uuid(term: str) -> uuid.UUID | None:
    """The UUID an operator pasted (with or without dashes, braces or spaces), or None."""
    try:
        return uuid.UUID(term.strip())
    except ValueError:
        return None


class RunIdFilter(admin.SimpleListFilter):
    """A list filter on one run, `?<parameter_name>=<run id>`, as the run history links to
    it: no list of runs to choose from, only the one asked for (so the filter strip shows it
    is active); a value that is not a UUID matches nothing. Subclasses say which rows the
    run wrote (`rows_of_run`)."""

    title = "run"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [] if value is None else [(value, f"run {value[:8]}")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        run_id = parse_uuid(value)
        return queryset.none() if run_id is None else self.rows_of_run(request, queryset, run_id)

    def rows_of_run(self, request: HttpRequest, queryset: QuerySet[Any],
                    run_id: uuid.UUID) -> QuerySet[Any]:
        raise NotImplementedError


def exact_uuid_filter(
    queryset: QuerySet[Any], term: str, uuid_fields: Sequence[str], text_fields: Sequence[str] = ()
) -> QuerySet[Any]:
    """Rows whose `uuid_fields` (or `text_fields`, as text) equal the pasted UUID.

    Anything that is not a UUID finds nothing: no text scan, ever.
    """
    if not term.strip():
        return queryset
    value = parse_uuid(term)
    if value is None:
        return queryset.none()
    match = Q()
    for name in uuid_fields:
        match |= Q(**{name: value})
    for name in text_fields:
        match |= Q(**{name: str(value)})
    return queryset.filter(match)


def short_id(value: object) -> SafeString:
    """A long id cut to its first characters for a list column; the full id on hover."""
    if value is None:
        return SafeString("")
    text = str(value)
    shown = text if len(text) <= SHORT_ID_CHARS else text[:SHORT_ID_CHARS] + "\u2026"
    return format_html('<span class="short-id" title="{}">{}</span>', text, shown)


def clipped(text: str | None, limit: int) -> SafeString:
    """`text` on one line, cut to `limit` characters for a list column; the whole on hover."""
    if not text:
        return SafeString("")
    one_line = " ".join(text.split())
    shown = one_line if len(one_line) <= limit else one_line[: limit - 1] + "\u2026"
    return format_html('<span class="clipped" title="{}">{}</span>', text, shown)


def compact_time(instant: datetime | None, *, seconds: bool = True) -> str:
    """An instant as a list column shows it: `2026-12-01 03:00:05` (UTC), narrow and sortable."""
    if instant is None:
        return ""
    return f"{instant.astimezone(UTC):%Y-%m-%d %H:%M:%S}"[: None if seconds else -3]


# The lookups a querystring may use on a field it may filter on: equality, ranges and dates,
# which an index serves; never a text search (`__icontains`) or a JSON path into a payload.
QUERYSTRING_LOOKUPS = frozenset({"exact", "in", "isnull", "gt", "gte", "lt", "lte", "year",
                                 "month", "day"})


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """No add, change or delete for anyone, superusers included; no bulk actions. A querystring
    filters only on the list filters' fields, the date hierarchy's and `indexed_fields`, with
    QUERYSTRING_LOOKUPS; any other lookup answers 400 (Django's DisallowedModelAdminLookup)."""

    actions: Sequence[str] | None = None
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    indexed_fields: tuple[str, ...] = ()

    def querystring_fields(self) -> set[str]:
        """The fields a querystring may filter on."""
        fields = {entry if isinstance(entry, str) else str(entry[0])
                  for entry in self.list_filter if isinstance(entry, str | tuple)}
        fields |= {str(entry.parameter_name) for entry in self.list_filter
                   if isinstance(entry, type) and issubclass(entry, admin.SimpleListFilter)}
        hierarchy = {str(self.date_hierarchy)} if self.date_hierarchy else set()
        return fields | set(self.indexed_fields) | hierarchy

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        field_name, _, rest = lookup.partition(LOOKUP_SEP)
        if field_name not in self.querystring_fields() or (rest and rest not in QUERYSTRING_LOOKUPS):
            return False
        return bool(super().lookup_allowed(lookup, value, request))

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class OverviewCard:
    """A card of the admin overview: a big number, lines under it, and a link."""

    id: str
    title: str
    value: int | str
    lines: tuple[str, ...]
    link_url: str
    link_text: str


# Cards that apps offer to the overview page (in their AppConfig.ready): the page shows the
# outbox's backlog without the reminders app importing the outbox app.
CardSource = Callable[[], OverviewCard]
_card_sources: dict[str, CardSource] = {}


def offer_card(name: str, source: CardSource) -> None:
    """Offer the card `source()` builds under `name` (once per name)."""
    _card_sources[name] = source


def offered_cards() -> list[OverviewCard]:
    """The offered cards, built now, in the order they were offered."""
    return [source() for source in _card_sources.values()]


# The URL of the events a run wrote, offered by the app that lists them (in its
# AppConfig.ready): the run history links there without the reminders app knowing the outbox.
RunEventsLink = Callable[[str, datetime, datetime | None], str]
_run_events_link: list[RunEventsLink] = []


def offer_run_events_link(link: RunEventsLink) -> None:
    """Offer `link(run_id, started_at, finished_at)`, the URL of a run's events."""
    _run_events_link[:] = [link]


def run_events_link() -> RunEventsLink | None:
    """The offered link to a run's events (None when no installed app lists them)."""
    return _run_events_link[0] if _run_events_link else None


# Users and groups are managed with manage.py under the owner's role (docs/admin.md), never in
# the admin, whose database role may only read them; its login is throttled.
for _model in (User, Group):
    with suppress(NotRegistered):
        admin.site.unregister(_model)
admin.site.login_form = ThrottledLoginForm
