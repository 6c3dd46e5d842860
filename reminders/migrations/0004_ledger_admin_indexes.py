"""Indexes for the admin's ledger list: newest first, date hierarchy, overview, threshold filter.

Built concurrently so that adding them to a production ledger never blocks the worker.
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
        AddIndexConcurrently(
            model_name="documentexpiryreminder",
            index=models.Index(
                fields=["threshold_days", "reminded_at"],
                name="ix_document_expiry_reminders_threshold_reminded_at",
            ),
        ),
    ]
