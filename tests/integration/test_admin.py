"""The admin classes: read-only for everyone, re-queue behind its permission, staff only,
and list queries that go through the indexes (checked with EXPLAIN)."""

import json
import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.db.models import QuerySet
from django.test import Client, RequestFactory
from django.urls import reverse

from core.admin import EstimatedCountPaginator, exact_uuid_filter
from outbox.models import OutboxMessage
from reminders.admin import DatetimeKind, LedgerQuerySet
from reminders.models import DocumentExpiryReminder, PersonDocument, ReminderRun
from reminders.overview import build_chart
from reminders.viewers import VIEWERS_GROUP, ensure_viewers_group
from tests.support.admin_data import (
    bulk_ledger,
    finished_run,
    ledger_rows,
    outbox_message,
    staff_viewer,
)

pytestmark = pytest.mark.django_db

LEDGER = reverse("admin:reminders_documentexpiryreminder_changelist")
OUTBOX = reverse("admin:outbox_outboxmessage_changelist")
NOW = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
READ_ONLY = (DocumentExpiryReminder, ReminderRun, OutboxMessage)


def _request(user: User, path: str = "/admin/", **get: str) -> Any:
    request = RequestFactory().get(path, get)
    request.user = user
    return request


def _explain(queryset: QuerySet[Any]) -> str:
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"explain {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def _changelist(user: User, model: type[Any] = DocumentExpiryReminder, **get: str) -> Any:
    model_admin = admin.site._registry[model]
    return model_admin.get_changelist_instance(_request(user, **get))


@pytest.mark.parametrize("model", READ_ONLY, ids=lambda m: m.__name__)
def test_superuser_can_view_but_not_add_change_or_delete(model: type[Any], admin_user: User) -> None:
    model_admin = admin.site._registry[model]
    request = _request(admin_user)

    assert model_admin.has_view_permission(request)
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request)
    assert not model_admin.has_delete_permission(request)
    assert "delete_selected" not in model_admin.get_actions(request)


@pytest.mark.parametrize("model", (DocumentExpiryReminder, ReminderRun), ids=lambda m: m.__name__)
def test_ledger_and_runs_have_no_bulk_actions(model: type[Any], admin_user: User) -> None:
    assert admin.site._registry[model].get_actions(_request(admin_user)) == {}


def test_ledger_detail_has_no_save_or_delete_and_refuses_writes(admin_client: Client) -> None:
    [owner] = ledger_rows(1, reminded_at=NOW)
    marker = DocumentExpiryReminder.objects.filter(owner_user_id=owner.owner_user_id).first()
    assert marker is not None
    change_url = reverse("admin:reminders_documentexpiryreminder_change", args=[marker.pk])

    page = admin_client.get(change_url).content.decode()

    assert str(marker.document_id) in page
    assert 'name="_save"' not in page and 'name="_continue"' not in page
    assert "deletelink" not in page
    assert admin_client.post(change_url, {"threshold_days": "1"}).status_code == 403
    assert admin_client.get(reverse("admin:reminders_documentexpiryreminder_add")).status_code == 403
    delete_url = reverse("admin:reminders_documentexpiryreminder_delete", args=[marker.pk])
    assert admin_client.post(delete_url, {"post": "yes"}).status_code == 403
    assert DocumentExpiryReminder.objects.filter(pk=marker.pk, threshold_days=marker.threshold_days).exists()


def test_person_documents_are_not_in_the_admin() -> None:
    assert PersonDocument not in admin.site._registry
    assert {m._meta.db_table for m in admin.site._registry} >= {
        "document_expiry_reminders", "document_expiry_reminder_runs", "outbox_messages"}


@pytest.mark.parametrize("url", [LEDGER, OUTBOX, reverse("admin:reminders_overview")])
def test_non_staff_is_sent_to_the_login_page(client: Client, url: str) -> None:
    user = User.objects.create_user("investor", password="x")  # noqa: S106
    client.force_login(user)

    response = client.get(url)

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_viewers_group_holds_exactly_the_view_permissions() -> None:
    group = ensure_viewers_group(apps)
    ensure_viewers_group(apps)  # idempotent

    codenames = set(group.permissions.values_list("content_type__app_label", "codename"))
    assert group.name == VIEWERS_GROUP
    assert codenames == {("reminders", "view_documentexpiryreminder"),
                         ("reminders", "view_reminderrun"), ("outbox", "view_outboxmessage")}


def test_viewer_can_browse_every_page_and_change_nothing(client: Client) -> None:
    client.force_login(staff_viewer())
    ledger_rows(2, reminded_at=NOW)
    finished_run(NOW)
    message = outbox_message(parked=True, attempts=5, last_error="MSG_SIZE_TOO_LARGE")

    for url in (LEDGER, OUTBOX, reverse("admin:reminders_reminderrun_changelist"),
                reverse("admin:reminders_overview"),
                reverse("admin:outbox_outboxmessage_change", args=[message.pk])):
        assert client.get(url).status_code == 200, url
    assert client.get("/admin/auth/user/").status_code == 404  # users are managed by a command


def _post_requeue(client: Client, *messages: OutboxMessage) -> Any:
    return client.post(OUTBOX, {"action": "requeue_parked",
                                "_selected_action": [str(m.pk) for m in messages]})


def test_requeue_is_refused_without_the_permission(client: Client) -> None:
    viewer = staff_viewer()
    client.force_login(viewer)
    parked = outbox_message(parked=True, attempts=5, last_error="MSG_SIZE_TOO_LARGE")

    _post_requeue(client, parked)

    parked.refresh_from_db()
    assert parked.parked_at is not None and parked.attempts == 5
    assert "requeue_parked" not in admin.site._registry[OutboxMessage].get_actions(_request(viewer))
    assert not LogEntry.objects.exists()


def test_requeue_with_the_permission_resets_parked_rows_and_logs_them(client: Client) -> None:
    operator = staff_viewer("operator")
    operator.user_permissions.add(Permission.objects.get(codename="requeue_outboxmessage"))
    client.force_login(operator)
    parked = outbox_message(parked=True, attempts=5, last_error="MSG_SIZE_TOO_LARGE")
    pending = outbox_message(attempts=2)
    published = outbox_message(published=True, attempts=1)

    response = _post_requeue(client, parked, pending, published)

    assert response.status_code == 302
    parked.refresh_from_db()
    assert (parked.parked_at, parked.attempts, parked.last_error) == (None, 0, "MSG_SIZE_TOO_LARGE")
    for untouched, attempts in ((pending, 2), (published, 1)):
        untouched.refresh_from_db()
        assert untouched.attempts == attempts
    [entry] = LogEntry.objects.all()
    assert (entry.object_id, entry.action_flag, entry.user_id) == (str(parked.pk), CHANGE, operator.pk)
    assert "Re-queued" in entry.get_change_message() and "was 5" in entry.get_change_message()


def test_outbox_detail_shows_the_payload_as_formatted_json(admin_client: Client) -> None:
    message = outbox_message()

    page = admin_client.get(reverse("admin:outbox_outboxmessage_change", args=[message.pk])).content

    expected = json.dumps(message.payload, indent=2, sort_keys=True).replace('"', "&quot;")
    assert expected in page.decode()
    assert b'name="_save"' not in page


def test_outbox_delivery_filter(admin_user: User) -> None:
    parked, pending, published = (outbox_message(parked=True), outbox_message(),
                                  outbox_message(published=True))

    def ids(state: str) -> set[uuid.UUID]:
        return {m.pk for m in _changelist(admin_user, OutboxMessage, delivery=state).queryset}

    assert ids("parked") == {parked.pk}
    assert ids("unpublished") == {pending.pk}  # the backlog: parked rows are counted apart
    assert ids("published") == {published.pk}


def test_search_takes_exact_uuids_only(admin_user: User) -> None:
    first, second = ledger_rows(2, reminded_at=NOW)
    queryset = DocumentExpiryReminder.objects.all()

    by_owner = exact_uuid_filter(queryset, f" {first.owner_user_id} ", ("document_id", "owner_user_id"))
    by_document = exact_uuid_filter(queryset, str(second.document_ids[0]).upper(),
                                    ("document_id", "owner_user_id"))

    assert {m.owner_user_id for m in by_owner} == {first.owner_user_id} and len(by_owner) == 4
    assert {m.document_id for m in by_document} == {second.document_ids[0]}
    assert list(exact_uuid_filter(queryset, str(first.owner_user_id)[:8], ("owner_user_id",))) == []
    assert exact_uuid_filter(queryset, "", ("owner_user_id",)).count() == 4 * 2


@pytest.fixture
def big_ledger() -> None:
    """Enough markers (and fresh statistics) that the planner chooses as it would in production."""
    bulk_ledger(15_000, first_day=date(2026, 9, 1), days=90)


def test_uuid_search_uses_the_owner_and_document_indexes(admin_user: User, big_ledger: None) -> None:
    owner = ledger_rows(1, reminded_at=NOW)[0].owner_user_id

    changelist = _changelist(admin_user, q=str(owner))
    plan = _explain(changelist.queryset[:100])

    assert "ix_document_expiry_reminders_owner" in plan
    assert "ux_document_expiry_reminders_dedupe" in plan
    assert "Seq Scan" not in plan
    assert {m.owner_user_id for m in changelist.result_list} == {owner}


def test_list_pages_and_filters_use_indexes(admin_user: User, big_ledger: None) -> None:
    newest = _explain(_changelist(admin_user).queryset[:100])
    threshold = _explain(_changelist(admin_user, threshold_days="7").queryset[:100])
    expiring = _explain(_changelist(
        admin_user, expires_at__gte="2026-10-01", expires_at__lt="2026-10-02").queryset[:100])
    day = _explain(_changelist(
        admin_user, reminded_at__year="2026", reminded_at__month="10", reminded_at__day="5").queryset[:100])

    assert "ix_document_expiry_reminders_reminded_at" in newest
    assert "ix_document_expiry_reminders_reminded_at" in threshold
    assert "ix_document_expiry_reminders_expires_at" in expiring
    assert "ix_document_expiry_reminders_reminded_at" in day
    for plan in (newest, threshold, expiring, day):
        assert "Seq Scan" not in plan, plan


def test_big_list_is_estimated_not_counted(admin_user: User, big_ledger: None) -> None:
    changelist = _changelist(admin_user)

    assert changelist.paginator.is_estimate
    assert 10_000 < changelist.result_count < 25_000
    assert changelist.full_result_count is None
    assert len(changelist.result_list) == changelist.list_per_page


def test_small_list_is_counted_exactly() -> None:
    ledger_rows(3, reminded_at=NOW)
    paginator = EstimatedCountPaginator(DocumentExpiryReminder.objects.order_by("pk"), 5)

    assert (paginator.count, paginator.is_estimate, paginator.num_pages) == (12, False, 3)


def test_ledger_list_page_renders_with_estimated_count(admin_client: Client, big_ledger: None) -> None:
    page = admin_client.get(LEDGER).content.decode()

    assert "about " in page and "reminder markers" in page
    assert "Overview" in page


@pytest.mark.parametrize("kind", ["year", "month", "day"])
def test_date_hierarchy_periods_match_a_full_distinct(kind: DatetimeKind) -> None:
    for offset in (0, 1, 1, 33, 40, 400):
        ledger_rows(1, reminded_at=NOW - timedelta(days=offset, hours=offset % 7))
    plain = DocumentExpiryReminder.objects.filter(type="Visa")

    skipped = LedgerQuerySet(model=DocumentExpiryReminder).filter(type="Visa")

    assert list(skipped.datetimes("reminded_at", kind)) == list(plain.datetimes("reminded_at", kind))


@pytest.mark.real_clock
def test_overview_page_shows_chart_backlog_and_last_cycle(admin_client: Client) -> None:
    today = datetime.now(UTC)
    ledger_rows(3, reminded_at=today - timedelta(days=2), thresholds=(7,))
    ledger_rows(2, reminded_at=today, thresholds=(1,))
    finished_run(today - timedelta(hours=1), status=ReminderRun.Status.PARTIAL)
    outbox_message(parked=True)

    page = admin_client.get(reverse("admin:reminders_overview")).content.decode()

    assert page.count("<rect ") == 2
    assert "Reminders sent per day and threshold" in page and ": 10</h2>" in page
    assert "Partial" in page and "due of 0 documents in the window" in page
    assert "1 parked" in page


def test_chart_stacks_each_day_by_threshold() -> None:
    first = date(2026, 11, 1)
    counts = {(first, 7): 30, (first, 1): 10, (first + timedelta(days=2), 0): 5}

    chart = build_chart(counts, first, 3, thresholds=(30, 7, 1, 0))

    day_one = [b for b in chart.bars if b.title.startswith("2026-11-01")]
    assert [b.title for b in day_one] == ["2026-11-01: 10 at 1 day", "2026-11-01: 30 at 7 days"]
    assert day_one[0].y + day_one[0].height == pytest.approx(chart.plot_bottom)
    assert day_one[1].y + day_one[1].height == pytest.approx(day_one[0].y)
    assert chart.total == 45 and chart.y_ticks[-1].label == "40"  # the tallest day, 40
    assert [label for label, _ in chart.legend] == ["30 days", "7 days", "1 day", "0 days"]


def test_date_hierarchy_shows_on_the_ledger_filtered_by_date_only(admin_client: Client) -> None:
    ledger_rows(1, reminded_at=NOW)
    ledger_rows(1, reminded_at=NOW - timedelta(days=40))

    plain = admin_client.get(LEDGER).content.decode()
    by_month = admin_client.get(LEDGER, {"reminded_at__year": "2026", "reminded_at__month": "11"})
    filtered = admin_client.get(LEDGER, {"threshold_days": "7"}).content.decode()

    assert 'class="toplinks"' in plain and "October 2026" in plain and "November 2026" in plain
    assert "November 29" in by_month.content.decode()
    assert 'class="toplinks"' not in filtered
