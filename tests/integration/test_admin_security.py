"""No admin page reveals a person document's encrypted payload, whoever looks: every admin
page a superuser can reach, after a real cycle over documents with known secrets."""

import re

from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from outbox.models import OutboxMessage
from reminders.models import DocumentExpiryReminder, ReminderRun
from tests.conftest import CycleRunner
from tests.support.factories import Documents
from tests.support.ledger import AS_OF, expiring_in


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
