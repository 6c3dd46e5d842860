"""An index on the ledger's reminded_at for the admin: newest first (with any filter riding
it), the date hierarchy's probes and the overview's last 30 days.

Built concurrently so that adding it to a production ledger never blocks the worker.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("reminders", "0003_reminder_viewers_group"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="documentexpiryreminder",
            index=models.Index(fields=["reminded_at"], name="ix_document_expiry_reminders_reminded_at"),
        ),
    ]
