"""What an operator sees in the admin: a run's error, status, markers and events;
short ids with the full id on hover; a parked column that marks only parked rows; delivery
filters that list what the backlog counts; no "View site"; and filters that use indexes."""

import html
import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client, RequestFactory
from django.urls import reverse

from outbox import store as outbox_store
from outbox.admin import backlog_card
from outbox.models import OutboxMessage
from reminders.admin import run_events_url, run_markers_url
from reminders.models import DocumentExpiryReminder, ReminderRun
from tests.support.admin_data import bulk_ledger, finished_run, ledger_rows, outbox_message
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import CycleRunner
from tests.support.factories import Documents
from tests.support.ledger import AS_OF, expiring_in

RUNS = reverse("admin:reminders_reminderrun_changelist")
LEDGER = reverse("admin:reminders_documentexpiryreminder_changelist")
OUTBOX = reverse("admin:outbox_outboxmessage_changelist")
NOW = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
LONG_ERROR = ("OperationalError: connection to server at \"db.internal\" (10.0.0.5), port 5432 "
              "failed: server closed the connection unexpectedly <retrying>")


def _explain(queryset: Any) -> str:
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"explain {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def _changelist(user: User, model: type[Any], **get: str) -> Any:
    request = RequestFactory().get("/admin/", get)
    request.user = user
    return admin.site._registry[model].get_changelist_instance(request)


def test_run_links_list_exactly_its_markers_and_its_events(
    run: CycleRunner, documents: Documents, admin_client: Client
) -> None:
    for days in (7, 1, 30):
        documents(expires_at=expiring_in(days))
    first = run(AS_OF)
    documents(expires_at=expiring_in(8))  # due the next day, at 7 days
    second = run(AS_OF + timedelta(days=1))
    first_run = ReminderRun.objects.get(run_id=first.run_id)
    second_run = ReminderRun.objects.get(run_id=second.run_id)
    assert first_run.markers_written > 0 and second_run.markers_written > 0

    page = admin_client.get(RUNS).content.decode()
    for each in (first_run, second_run):
        assert f'href="{html.escape(run_markers_url(each))}"' in page
        assert f'href="{html.escape(run_events_url(each))}"' in page

    for each in (first_run, second_run):
        markers = admin_client.get(run_markers_url(each)).context["cl"].result_list
        assert {m.run_id for m in markers} == {each.run_id}
        assert len(markers) == DocumentExpiryReminder.objects.filter(run_id=each.run_id).count() \
            == each.markers_written
        events = admin_client.get(run_events_url(each)).context["cl"].result_list
        assert {m.headers["correlation_id"] for m in events} == {str(each.run_id)}
        assert len(events) == each.owners_notified
    assert_outbox_matches_contract()


def test_runs_list_shows_status_colours_error_and_failed_owners(admin_client: Client) -> None:
    for hours, status in enumerate(("succeeded", "partial", "timed_out", "failed")):
        finished_run(NOW - timedelta(hours=hours), status=status)
    failed = ReminderRun.objects.get(status="failed")
    failed.error, failed.failed_owners = LONG_ERROR, 7
    failed.save()

    page = admin_client.get(RUNS).content.decode()

    for status, label in (("succeeded", "Succeeded"), ("partial", "Partial"),
                          ("timed_out", "Timed Out"), ("failed", "Failed")):
        assert f'<span class="run-status run-status-{status}">{label}</span>' in page
    assert f'title="{html.escape(LONG_ERROR)}"' in page  # the whole error on hover
    assert html.escape(LONG_ERROR) not in page.replace(f'title="{html.escape(LONG_ERROR)}"', "")
    assert '<span class="attention">7</span>' in page
    assert f'title="{failed.run_id}">{str(failed.run_id)[:8]}\u2026</span>' in page
    detail = admin_client.get(reverse("admin:reminders_reminderrun_change", args=[failed.pk]))
    assert html.escape(LONG_ERROR) in detail.content.decode()
    assert html.escape(run_events_url(failed)) in detail.content.decode()


def test_ledger_shows_short_ids_with_the_full_id_on_hover(admin_client: Client) -> None:
    [owner] = ledger_rows(1, reminded_at=NOW, thresholds=(7,))
    marker = DocumentExpiryReminder.objects.filter(owner_user_id=owner.owner_user_id).first()
    assert marker is not None

    page = admin_client.get(LEDGER).content.decode()

    for full in (marker.document_id, marker.owner_user_id, marker.run_id):
        assert f'title="{full}">{str(full)[:8]}\u2026</span>' in page
    assert reverse("admin:reminders_reminderrun_change", args=[marker.run_id]) in page


def test_outbox_parked_column_marks_only_parked_rows(admin_client: Client) -> None:
    outbox_message()
    outbox_message(published=True, attempts=1)
    outbox_message(parked=True, attempts=5, last_error="MSG_SIZE_TOO_LARGE")

    page = admin_client.get(OUTBOX).content.decode()

    assert page.count('class="attention"') == 1
    assert "icon-no.svg" not in page and "icon-yes.svg" not in page


def test_delivery_filters_list_what_the_backlog_counts(admin_user: User) -> None:
    parked, pending, published = (outbox_message(parked=True), outbox_message(),
                                  outbox_message(published=True))
    outbox_message()

    def ids(state: str) -> set[uuid.UUID]:
        return {m.pk for m in _changelist(admin_user, OutboxMessage, delivery=state).queryset}

    backlog = outbox_store.backlog("default")
    assert len(ids("unpublished")) == backlog.unpublished == backlog_card().value == 2
    assert pending.pk in ids("unpublished") and parked.pk not in ids("unpublished")
    assert ids("parked") == {parked.pk} and backlog.parked == 1
    assert ids("published") == {published.pk}
    assert "delivery=unpublished" in backlog_card().link_url


def test_admin_has_no_view_site_link_and_no_nav_sidebar(admin_client: Client) -> None:
    for url in (reverse("admin:index"), LEDGER, RUNS, OUTBOX, reverse("admin:reminders_overview")):
        page = admin_client.get(url).content.decode()
        assert "View site" not in page, url
        assert 'id="nav-sidebar"' not in page, url
    assert admin.site.site_url is None


@pytest.fixture
def big_outbox() -> None:
    """Many published rows and a few waiting, with fresh statistics, as production has."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            insert into outbox_messages
                (id, aggregate_type, aggregate_id, event_type, contract_version, topic,
                 message_key, payload, headers, created_at, published_at, attempts)
            select gen_random_uuid(), 'Profile', k, 'DocumentExpiryReminderKafkaEvent', 1, 't', k,
                   '{}'::jsonb, jsonb_build_object('correlation_id', gen_random_uuid()::text),
                   %(first)s::timestamptz + i * interval '20 seconds',
                   case when i %% 500 = 0 then null
                        else %(first)s::timestamptz + i * interval '20 seconds' + interval '1 second' end,
                   0
            from generate_series(1, 30000) as i, lateral (select gen_random_uuid()::text as k) key
            """,
            {"first": datetime(2026, 11, 22, tzinfo=UTC)},
        )
        cursor.execute("analyze outbox_messages")


def test_run_filters_use_indexes(admin_user: User, big_outbox: None) -> None:
    bulk_ledger(15_000, first_day=date(2026, 9, 1), days=90)
    run = finished_run(datetime(2026, 11, 28, 3, 0, tzinfo=UTC))
    ledger_rows(3, reminded_at=run.started_at + timedelta(seconds=1), run_id=run.run_id)

    markers = _changelist(admin_user, DocumentExpiryReminder, run_id=str(run.run_id))
    events = _changelist(admin_user, OutboxMessage, correlation_id=str(run.run_id),
                         created_at__gte=run.started_at.isoformat(),
                         created_at__lte=(run.finished_at or run.started_at).isoformat())

    assert len(markers.result_list) == 3 * 2 * 2  # owners x types x thresholds
    assert list(events.result_list) == []
    markers_plan, events_plan = _explain(markers.queryset[:100]), _explain(events.queryset[:100])
    for plan in (markers_plan, events_plan):
        assert "Seq Scan" not in plan, plan
    assert "ix_document_expiry_reminders_reminded_at" in markers_plan
    assert "ix_outbox_messages_created_at" in events_plan
