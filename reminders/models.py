"""Tables of the reminder worker (docs/design.md §2): the ledger and run history it owns, and the
documents table it only reads."""

import uuid

from django.contrib.postgres.functions import RandomUUID
from django.db import models
from django.db.models.functions import Now

DEDUPE_CONSTRAINT = "ux_document_expiry_reminders_dedupe"


class PersonDocument(models.Model):
    """profile.person_documents, owned by the profile service: read-only here, never migrated.

    `payload_cipher` is deliberately not mapped: the worker never reads it.
    """

    id = models.UUIDField(primary_key=True)
    owner_user_id = models.UUIDField()
    person_id = models.UUIDField()
    type = models.CharField(max_length=32)
    number_mask = models.CharField(max_length=32, null=True)
    expires_at = models.DateTimeField(null=True)
    status = models.CharField(max_length=16)
    deleted_at = models.DateTimeField(null=True)

    class Meta:
        managed = False
        db_table = "person_documents"

    def __str__(self) -> str:
        return f"{self.type} {self.id}"


class DocumentExpiryReminder(models.Model):
    """One row = for (document, threshold) the reminder is done, for the expiry date it
    carries (docs/design.md §2.2); a new expiry date re-arms it in place, counting its
    armings (docs/design.md §2.6)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, db_default=RandomUUID(), editable=False)
    document_id = models.UUIDField()
    owner_user_id = models.UUIDField()
    type = models.CharField(max_length=32)
    threshold_days = models.IntegerField()
    expires_at = models.DateField(help_text="UTC date of the document's expiry, kept for pruning")
    reminded_at = models.DateTimeField()
    notified = models.BooleanField(help_text="True only for the threshold that went into an event")
    run_id = models.UUIDField(help_text="The cycle that wrote the marker")
    armings = models.IntegerField(
        default=1, db_default=1,
        help_text="Which arming of (document, threshold) this is: 1 from its first write, one "
                  "more each time a new expiry date re-armed it; its reminder's message id names it")

    class Meta:
        db_table = "document_expiry_reminders"
        constraints = [
            models.UniqueConstraint(fields=["document_id", "threshold_days"], name=DEDUPE_CONSTRAINT),
        ]
        indexes = [
            models.Index(fields=["owner_user_id"], name="ix_document_expiry_reminders_owner"),
            models.Index(fields=["expires_at"], name="ix_document_expiry_reminders_expires_at"),
            # For the admin: newest first, the date hierarchy, the overview's last 30 days.
            models.Index(fields=["reminded_at"], name="ix_document_expiry_reminders_reminded_at"),
        ]
        verbose_name = "reminder marker"

    def __str__(self) -> str:
        return f"{self.document_id} @ {self.threshold_days}d"


class ReminderRun(models.Model):
    """One cycle of the worker: when, for which as-of, how it ended, and its counters."""

    class Status(models.TextChoices):
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        PARTIAL = "partial"  # finished, some owners failed (retried next cycle)
        TIMED_OUT = "timed_out"  # stopped at max_run_duration; the rest is picked up next tick
        STOPPED = "stopped"  # stopped by SIGTERM/SIGINT between batches
        FAILED = "failed"  # aborted by an error (database lost, say)

    class Trigger(models.TextChoices):
        LOOP = "loop"  # a tick of `--loop`
        MANUAL = "manual"  # a single run: the re-trigger, or a backfill with a past --as-of

    run_id = models.UUIDField(primary_key=True)
    as_of = models.DateTimeField()
    started_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True)
    status = models.CharField(max_length=16, choices=Status.choices)
    thresholds = models.CharField(max_length=200)
    reminders_sent = models.IntegerField(default=0, db_default=0)
    owners_notified = models.IntegerField(default=0, db_default=0)
    markers_written = models.IntegerField(default=0, db_default=0)
    # of markers_written: those that replaced a marker of an earlier expiry date (docs/design.md §3.2)
    markers_rearmed = models.IntegerField(default=0, db_default=0)
    # owners whose reminder the outbox already held under its message id: no second event
    owners_already_queued = models.IntegerField(default=0, db_default=0)
    skipped_already_marked = models.IntegerField(default=0, db_default=0)
    pruned = models.IntegerField(default=0, db_default=0)
    failed_owners = models.IntegerField(default=0, db_default=0)
    duration_ms = models.IntegerField(null=True)
    error = models.TextField(null=True)
    host = models.CharField(max_length=255, default="", db_default="")
    trigger = models.CharField(max_length=16, choices=Trigger.choices, default=Trigger.MANUAL,
                               db_default=Trigger.MANUAL)
    # the loop's tick this run was for, on the worker's clock: the loop decides "missed" on it
    tick = models.DateTimeField(null=True)

    class Meta:
        db_table = "document_expiry_reminder_runs"
        indexes = [models.Index(fields=["started_at"], name="ix_reminder_runs_started_at")]
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"run {self.run_id} ({self.status})"


# A cycle that did its work (docs/design.md §2.3): the loop's missed-tick rule, liveness, the
# last-success metric, the overview and the run-history prune all count these, and only these.
SUCCESSFUL_STATUSES = frozenset({
    ReminderRun.Status.SUCCEEDED, ReminderRun.Status.PARTIAL, ReminderRun.Status.TIMED_OUT,
})
