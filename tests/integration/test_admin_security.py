"""No admin page reveals a person document's encrypted payload, whoever looks (every admin page
a superuser can reach, after a real cycle over documents with known secrets); number masks only
to those allowed; querystrings limited to the filters and the indexes, bad values a 400; no user
or group pages; a throttled login; short sessions and a year of HSTS."""

import io
import os
import re
import subprocess
import sys

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from core.login_throttle import LOGIN_THROTTLE
from outbox.models import OutboxMessage
from reminders.models import DocumentExpiryReminder, ReminderRun
from reminders.viewers import ensure_viewers_group
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import CycleRunner
from tests.support.factories import Documents
from tests.support.ledger import AS_OF, expiring_in
from tests.support.processes import ROOT

PASSWORD = "a long test password"  # noqa: S105 - a test user's


def test_no_admin_page_shows_a_document_payload(
    run: CycleRunner, documents: Documents, client: Client
) -> None:
    ciphers = [f"CIPHER-SECRET-{n}".encode() for n in range(3)]
    for n, cipher in enumerate(ciphers):
        documents(expires_at=expiring_in(2 + n), payload_cipher=cipher)
    run(AS_OF)
    client.force_login(User.objects.create_superuser("root", "root@example.com", "x"))

    pages = [reverse("admin:index"), reverse("admin:reminders_overview")]
    for model in (DocumentExpiryReminder, ReminderRun, OutboxMessage):
        meta = model._meta
        pages.append(reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist"))
        for obj in model.objects.all()[:3]:
            pages.append(reverse(f"admin:{meta.app_label}_{meta.model_name}_change",
                                 args=[obj.pk]))
    bodies = []
    for page in pages:
        response = client.get(page)
        assert response.status_code == 200, page
        bodies.append(response.content.decode())

    assert len(pages) >= 10
    everything = "\n".join(bodies)
    for cipher in ciphers:
        assert cipher.decode() not in everything
        assert cipher.hex() not in everything
    assert not re.search(r"person[ _]?documents?", everything, re.IGNORECASE)
    assert_outbox_matches_contract()


def _viewer(name: str, *permissions: str) -> User:
    ensure_viewers_group(apps)  # a migration's data: gone once a transactional test flushed
    call_command("admin_user", name, "--viewer", *permissions, stdout=io.StringIO())
    user = User.objects.get(username=name)
    user.set_password(PASSWORD)
    user.save()
    return user


def test_number_masks_are_hidden_from_viewers_without_the_permission(
    run: CycleRunner, documents: Documents,
) -> None:
    documents(expires_at=expiring_in(3), number_mask="45 ** ****77")
    run(AS_OF)
    message = OutboxMessage.objects.get()
    page = reverse("admin:outbox_outboxmessage_change", args=[message.pk])

    viewer, masks = Client(), Client()
    viewer.force_login(_viewer("alice"))
    masks.force_login(_viewer("bob", "--number-masks"))
    hidden, shown = viewer.get(page), masks.get(page)

    assert hidden.status_code == shown.status_code == 200
    assert "45 ** ****77" not in hidden.content.decode()
    assert "(hidden: needs outbox.view_number_masks)" in hidden.content.decode()
    assert "45 ** ****77" in shown.content.decode()
    assert_outbox_matches_contract()


@pytest.mark.parametrize(("query", "status"), [
    ("?payload__icontains=45", 400),
    ("?payload__documents__0__numberMask=x", 400),
    ("?topic__startswith=a", 400),
    ("?message_key__icontains=1", 400),
    ("?created_at__gte=2026-01-01T00:00:00%2B00:00", 200),
    ("?delivery=parked", 200),
    ("?delivery=nonsense", 200),
    ("?correlation_id=not-a-uuid", 200),
])
def test_outbox_querystrings_are_limited_to_the_filters_and_the_indexes(
    admin_client: Client, query: str, status: int,
) -> None:
    response = admin_client.get(reverse("admin:outbox_outboxmessage_changelist") + query)
    assert response.status_code == status


@pytest.mark.parametrize(("query", "status"), [
    ("?threshold_days=\u00b2", 400),
    ("?threshold_days=\u0663", 400),
    ("?threshold_days=99999999999999999999", 400),
    ("?threshold_days=7", 200),
    ("?type=%00", 400),
    ("?type=" + "x" * 40, 400),
    ("?type=Passport", 200),
    ("?notified__exact=maybe", 302),
    ("?expires_at__gte=not-a-date", 302),
    ("?reminded_at__year=abc", 302),
    ("?run_id=zzz", 200),
    ("?document_id=" + "0" * 8 + "-0000-0000-0000-" + "0" * 12, 200),
    ("?owner_user_id__icontains=1", 400),
    ("?type__icontains=pass", 400),
    ("?threshold_days__gt=1", 200),  # a list filter's field, by range
    ("?id__gt=1", 400),
])
def test_ledger_filters_answer_400_to_bad_values_never_500(
    admin_client: Client, query: str, status: int,
) -> None:
    response = admin_client.get(reverse("admin:reminders_documentexpiryreminder_changelist")
                                + query)
    assert response.status_code == status


def test_user_and_group_pages_are_not_in_the_admin(admin_client: Client) -> None:
    assert admin_client.get("/admin/auth/user/").status_code == 404
    assert admin_client.get("/admin/auth/group/").status_code == 404
    assert admin_client.get("/admin/auth/user/add/").status_code == 404


def test_login_is_throttled_after_five_failures_for_a_name(
    transactional_db: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1_000.0]
    monkeypatch.setattr(LOGIN_THROTTLE, "clock", lambda: now[0])
    _viewer("carol")
    client = Client()

    def login(password: str) -> int:
        response = client.post("/admin/login/?next=/admin/",
                               {"username": "carol", "password": password})
        return int(response.status_code)

    assert [login("wrong") for _ in range(5)] == [200] * 5
    assert login(PASSWORD) == 200  # the right password, refused: throttled
    assert "_auth_user_id" not in client.session
    now[0] += 15 * 60 + 1
    assert login(PASSWORD) == 302
    assert "_auth_user_id" in client.session


def test_sessions_are_short_and_hsts_lasts_a_year() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
         "print(settings.SESSION_COOKIE_AGE, settings.SECURE_HSTS_SECONDS, "
         "settings.SESSION_EXPIRE_AT_BROWSER_CLOSE)"],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")},
             "DJANGO_SETTINGS_MODULE": "pin_profile.settings"},
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)
    assert done.stdout.split() == ["3600", "31536000", "True"], done.stderr
