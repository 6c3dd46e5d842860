"""profile.outbox_messages (docs/design.md §2.4)."""

import uuid
from typing import Self

from django.contrib.postgres.functions import RandomUUID
from django.db import models
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now

# When a row was published, either way (the function of migration 0005_stream_position).
_PUBLISHED_AT = "outbox_published_at(outbox_messages)"
# The rows in one delivery state: the view of migration 0008_message_states, which the backlog
# query (outbox/sql/queries.sql, outbox_backlog) reads too.
_IN_STATE = "select s.id from outbox_message_states s where s.state = %s"


class OutboxMessageQuerySet(models.QuerySet["OutboxMessage"]):
    """The delivery states, with the one meaning of the relay's backlog (view
    `outbox_message_states`): waiting (the stream ahead of the position, or a slow-lane row
    neither published nor parked), parked, published."""

    def with_published_time(self) -> Self:
        """Annotate `published_time`: when the row was published (None: not yet)."""
        published_time = RawSQL(_PUBLISHED_AT, [],  # noqa: S611 - a constant, no input
                                output_field=models.DateTimeField())
        return self.annotate(published_time=published_time)

    def _in_state(self, state: str) -> Self:
        return self.filter(id__in=RawSQL(_IN_STATE, [state]))  # noqa: S611 - a parameter

    def waiting(self) -> Self:
        return self._in_state("waiting")

    def parked(self) -> Self:
        return self._in_state("parked")

    def published(self) -> Self:
        return self._in_state("published")


class OutboxMessage(models.Model):
    """An integration event waiting for (or done with) publication to Kafka."""

    objects = OutboxMessageQuerySet.as_manager()

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
    # Set only for a row delivered by the slow lane; a row delivered in the stream is published
    # when its batch was (outbox_relay_batches): see OutboxMessage.objects' annotations.
    published_at = models.DateTimeField(null=True)
    detoured_at = models.DateTimeField(
        null=True,
        help_text="Set when the message left the relay's stream for the slow lane "
        "(a failed delivery, or its key held behind one)",
    )
    attempts = models.IntegerField(default=0, db_default=0)
    last_error = models.TextField(null=True)
    parked_at = models.DateTimeField(
        null=True, help_text="Set when the relay gave up on the message; re-queue to retry"
    )
    available_at = models.DateTimeField(
        null=True,
        help_text="A slow-lane row is not delivered before this instant: its retry delay",
    )

    class Meta:
        db_table = "outbox_messages"
        # The admin's only write on the outbox (outbox/admin.py), and its view of the documents'
        # number masks in the payloads (redacted without it).
        permissions = [("requeue_outboxmessage", "Can re-queue parked outbox messages"),
                       ("view_number_masks", "Can see number masks in outbox payloads")]
        indexes = [
            # The admin's list (newest first) and a run's events (its time window).
            models.Index(fields=["created_at"], name="ix_outbox_messages_created_at"),
            # The slow lane (docs/outbox-relay.md): its waiting rows by key, for the head of each
            # key and for "is this key held behind a detoured row?". The stream itself is read
            # through ix_outbox_messages_stream on (txid, seq), columns the model does not map
            # (migration 0005_stream_position).
            models.Index(
                fields=["message_key"],
                name="ix_outbox_messages_slow_key",
                condition=models.Q(detoured_at__isnull=False, published_at__isnull=True),
            ),
            # Retention deletes slow-lane rows by the time they were published.
            models.Index(
                fields=["published_at"],
                name="ix_outbox_messages_published_at",
                condition=models.Q(published_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.id}"


class OutboxTopic(models.Model):
    """A topic the relay publishes to, with its partition count as the relay last saw it, and
    when one found it changed (outbox/topic_watch.py; migration 0011_topic_partitions). Written by the
    relay's named query record_topic_partitions only."""

    topic = models.CharField(max_length=249, primary_key=True)
    partitions = models.IntegerField()
    recorded_at = models.DateTimeField(db_default=Now())
    previous_partitions = models.IntegerField(null=True)
    changed_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "outbox_topics"
        constraints = [models.CheckConstraint(condition=models.Q(partitions__gt=0),
                                              name="ck_outbox_topics_partitions")]

    def __str__(self) -> str:
        return f"{self.topic} ({self.partitions} partitions)"
