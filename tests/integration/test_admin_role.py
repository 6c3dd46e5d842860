"""The admin web process's database role (`pin_admin_web`, core/sql/roles.sql): it does
what the admin does (the overview's queries, re-queue, a login's reads and Django's sessions) and is
refused everything else, the encrypted payload and any write to the documents first of all.
tests/ops/test_admin_production.py runs the whole admin under gunicorn as this role."""

from datetime import UTC, datetime

import psycopg
import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.backends.db import SessionStore
from django.db import transaction
from django.utils import timezone
from psycopg import errors

from core.roles import ADMIN_WEB_ROLE
from outbox import store as outbox_store
from outbox.models import OutboxMessage
from reminders.overview import overview_context
from tests.support.admin_data import ledger_rows, outbox_message
from tests.support.db_roles import as_role, test_database_url
from tests.support.factories import Documents
from tests.support.invariants import documents_md5
from tests.support.ledger import expiring_in

_NEW_DOCUMENT = (
    "insert into profile.person_documents (id, owner_user_id, person_id, type, status,"
    " payload_cipher, created_at, updated_at) values (gen_random_uuid(), gen_random_uuid(),"
    " gen_random_uuid(), 'Visa', 'Active', '\\x00', now(), now())"
)
_NEW_MARKER = (
    "insert into profile.document_expiry_reminders (id, document_id, owner_user_id, type,"
    " threshold_days, expires_at, reminded_at, notified, run_id) values (gen_random_uuid(),"
    " gen_random_uuid(), gen_random_uuid(), 'Visa', 7, current_date, now(), true, gen_random_uuid())"
)
_NEW_EVENT = (
    "insert into profile.outbox_messages (id, aggregate_type, aggregate_id, event_type,"
    " contract_version, topic, message_key, payload, headers, created_at, attempts)"
    " values (gen_random_uuid(), 'Profile', 'x', 'E', 1, 't', 'x', '{}', '{}', now(), 0)"
)
FORBIDDEN = [
    # The documents: no encrypted payload, no column the admin does not filter on, no write.
    "select payload_cipher from profile.person_documents limit 1",
    "select * from profile.person_documents limit 1",
    "select number_mask from profile.person_documents limit 1",
    "select owner_user_id from profile.person_documents limit 1",
    "copy profile.person_documents to stdout",
    "update profile.person_documents set status = status",
    _NEW_DOCUMENT,
    "delete from profile.person_documents",
    "truncate profile.person_documents",
    # The ledger and the run history are the worker's to write.
    _NEW_MARKER,
    "update profile.document_expiry_reminders set notified = notified",
    "delete from profile.document_expiry_reminders",
    "update profile.document_expiry_reminder_runs set status = status",
    "delete from profile.document_expiry_reminder_runs",
    # The outbox: only the columns re-queue sets; no new, edited, published or deleted events.
    _NEW_EVENT,
    "update profile.outbox_messages set payload = payload",
    "update profile.outbox_messages set published_at = now()",
    "update profile.outbox_messages set last_error = null",
    "delete from profile.outbox_messages",
    # Django's catalogue is migrate's; no schema changes.
    "delete from profile.django_content_type",
    "update profile.auth_permission set name = name",
    "select * from profile.django_migrations",
    "create table profile.admin_scratch (id int)",
    "drop table profile.django_session",
    "alter table profile.auth_user add column scratch int",
    # Users and groups are managed with a command under the owner's role: a login only reads
    # them and stamps last_login.
    "insert into profile.auth_user (password, is_superuser, username, first_name, last_name,"
    " email, is_staff, is_active, date_joined) values ('x', true, 'intruder', '', '', '', true,"
    " true, now())",
    "update profile.auth_user set is_superuser = true",
    "delete from profile.auth_user",
    "insert into profile.auth_group (name) values ('intruders')",
    "insert into profile.auth_user_groups (user_id, group_id) values (1, 1)",
    "delete from profile.auth_group_permissions",
    "insert into profile.auth_user_user_permissions (user_id, permission_id) values (1, 1)",
]


def test_admin_role_is_refused_what_the_admin_never_does(documents: Documents) -> None:
    documents(expires_at=expiring_in(3), payload_cipher=b"CIPHER-SECRET")
    before = documents_md5()
    refused = 0
    with psycopg.connect(test_database_url(ADMIN_WEB_ROLE), autocommit=True) as conn:
        [(role,)] = conn.execute("select current_user").fetchall()
        assert role == ADMIN_WEB_ROLE
        for sql in FORBIDDEN:
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(sql)
            refused += 1
        # What the overview's census reads, and nothing more of the documents.
        [(count,)] = conn.execute(
            "select count(*) from profile.person_documents"
            " where status = 'Active' and deleted_at is null and expires_at is not null").fetchall()
        assert count == 1
    assert refused == len(FORBIDDEN)
    assert documents_md5() == before


def test_admin_role_does_what_the_admin_does(documents: Documents) -> None:
    documents(expires_at=expiring_in(3))
    ledger_rows(2, reminded_at=timezone.now())
    parked = outbox_message(parked=True, attempts=5, last_error="MSG_SIZE_TOO_LARGE")
    user = User.objects.create_user("operator", is_staff=True)

    with as_role(ADMIN_WEB_ROLE):
        overview = overview_context(datetime.now(UTC))
        assert overview["backlog"].window_documents == 1
        outbox_card = {card.id: card for card in overview["cards"]}["overview-outbox"]
        # the outbox's backlog query
        assert outbox_card.lines[0] == "unpublished (waiting for the relay), 1 parked"
        with transaction.atomic():  # the admin action's own shape: lock, then re-queue
            locked = list(OutboxMessage.objects.select_for_update().filter(pk=parked.pk))
            assert outbox_store.requeue_parked("default", [m.pk for m in locked]) == [parked.pk]
        session = SessionStore()
        session["_auth_user_id"] = str(user.pk)
        session.create()
        user.last_login = timezone.now()
        user.save(update_fields=["last_login"])
        user.set_password("rehashed when Django's hasher changes")
        user.save(update_fields=["password"])
        assert user.has_perm("outbox.view_outboxmessage") is False

    parked.refresh_from_db()
    assert parked.parked_at is None and parked.attempts == 0
    assert SessionStore(session.session_key).get("_auth_user_id") == str(user.pk)
    OutboxMessage.objects.all().delete()  # a bare test row, not a contract event
