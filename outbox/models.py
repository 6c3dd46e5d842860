"""profile.outbox_messages (docs/design.md §2.4)."""

import uuid

from django.contrib.postgres.functions import RandomUUID
from django.db import models
from django.db.models.functions import Now


class OutboxMessage(models.Model):
    """An integration event waiting for (or done with) publication to Kafka."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, db_default=RandomUUID(), editable=False)
    aggregate_type = models.CharField(max_length=64)
    aggregate_id = models.CharField(max_length=64)
    event_type = models.CharField(max_length=128)
    contract_version = models.IntegerField()
    topic = models.CharField(max_length=249)
    message_key = models.CharField(max_length=256)
    payload = models.JSONField()
    headers = models.JSONField()
    created_at = models.DateTimeField(db_default=Now())
    published_at = models.DateTimeField(null=True)
    attempts = models.IntegerField(default=0, db_default=0)
    last_error = models.TextField(null=True)
    parked_at = models.DateTimeField(
        null=True, help_text="Set when the relay gave up on the message; re-queue to retry"
    )
    available_at = models.DateTimeField(
        null=True,
        help_text="Not claimable before this instant: a relay's claim lease, or a retry delay",
    )
    claimed_by = models.CharField(
        max_length=64, null=True, help_text="The relay instance holding the current claim"
    )

    class Meta:
        db_table = "outbox_messages"
        # The admin's only write on the outbox (outbox/admin.py): parked -> pending again.
        permissions = [("requeue_outboxmessage", "Can re-queue parked outbox messages")]
        indexes = [
            models.Index(
                fields=["created_at"],
                name="ix_outbox_messages_unpublished",
                condition=models.Q(published_at__isnull=True),
            ),
            # The relay's per-key order check: "is there an older unpublished row of this key?"
            models.Index(
                fields=["message_key", "created_at", "id"],
                name="ix_outbox_messages_unpublished_key",
                condition=models.Q(published_at__isnull=True),
            ),
            # Retention deletes published rows by age without scanning the unpublished ones.
            models.Index(
                fields=["published_at"],
                name="ix_outbox_messages_published_at",
                condition=models.Q(published_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.id}"
