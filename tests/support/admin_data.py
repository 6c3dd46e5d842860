"""Ledger, run and outbox rows for the admin tests, written through the models."""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.contrib.auth.models import User
from django.db import connection

from outbox.models import OutboxMessage
from reminders.models import DocumentExpiryReminder, ReminderRun
from reminders.viewers import ensure_viewers_group

PASSWORD = "correct horse battery staple"  # noqa: S105 (a test user's)


def staff_viewer(username: str = "viewer") -> User:
    """A staff user in the "reminder viewers" group, and nothing more."""
    from django.apps import apps

    user = User.objects.create_user(username, password=PASSWORD, is_staff=True)
    user.groups.add(ensure_viewers_group(apps))
    return user


@dataclass(frozen=True)
class Owner:
    owner_user_id: uuid.UUID
    document_ids: tuple[uuid.UUID, ...]


def ledger_rows(owners: int, *, reminded_at: datetime, run_id: uuid.UUID | None = None,
                thresholds: Sequence[int] = (30, 7), types: Sequence[str] = ("Passport", "Visa"),
                ) -> list[Owner]:
    """For each owner one document per type, marked at every threshold (the smallest notified)."""
    run_id = run_id or uuid.uuid4()
    made: list[Owner] = []
    rows: list[DocumentExpiryReminder] = []
    for index in range(owners):
        owner_id = uuid.uuid4()
        documents = tuple(uuid.uuid4() for _ in types)
        made.append(Owner(owner_id, documents))
        for document_id, doc_type in zip(documents, types, strict=True):
            for threshold in thresholds:
                rows.append(DocumentExpiryReminder(
                    document_id=document_id, owner_user_id=owner_id, type=doc_type,
                    threshold_days=threshold, expires_at=reminded_at.date() + timedelta(days=index % 30),
                    reminded_at=reminded_at, notified=threshold == min(thresholds), run_id=run_id,
                ))
    DocumentExpiryReminder.objects.bulk_create(rows)
    return made


def bulk_ledger(rows: int, *, first_day: date, days: int) -> None:
    """`rows` random markers spread over `days` days from `first_day`, in one statement."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            insert into document_expiry_reminders
                (id, document_id, owner_user_id, type, threshold_days, expires_at, reminded_at,
                 notified, run_id)
            select gen_random_uuid(), gen_random_uuid(), gen_random_uuid(),
                   (array['Passport', 'Visa', 'DriverLicense'])[1 + i %% 3],
                   (array[30, 7, 1, 0])[1 + i %% 4],
                   %(first_day)s::date + (i %% %(days)s) + 30,
                   %(first_day)s::timestamptz + (i %% %(days)s) * interval '1 day' + interval '3 hours',
                   i %% 4 = 3, gen_random_uuid()
            from generate_series(1, %(rows)s) as i
            """,
            {"rows": rows, "first_day": first_day, "days": days},
        )
        cursor.execute("analyze document_expiry_reminders")


def finished_run(started_at: datetime, status: str = ReminderRun.Status.SUCCEEDED,
                 **fields: object) -> ReminderRun:
    """A run that ended 2 s after `started_at`; `fields` override its counters, error, host."""
    values: dict[str, object] = {
        "run_id": uuid.uuid4(), "as_of": started_at, "started_at": started_at,
        "finished_at": started_at + timedelta(seconds=2), "status": status,
        "thresholds": "30,7,1,0", "reminders_sent": 12, "owners_notified": 9,
        "markers_written": 20, "duration_ms": 2000, **fields,
    }
    return ReminderRun.objects.create(**values)


def outbox_message(*, parked: bool = False, published: bool = False, attempts: int = 0,
                   last_error: str | None = None, correlation_id: uuid.UUID | None = None,
                   created_at: datetime | None = None,
                   published_at: datetime | None = None) -> OutboxMessage:
    """An outbox row; a published or parked one is so since now, or since `published_at`, as a
    slow-lane row (detoured: the relay sets published_at for those; any other row is in the
    stream, ahead of the relay's position)."""
    owner = str(uuid.uuid4())
    now = datetime.now(UTC)
    created = {} if created_at is None else {"created_at": created_at}
    return OutboxMessage.objects.create(
        aggregate_type="Profile", aggregate_id=owner, event_type="DocumentExpiryReminderKafkaEvent",
        contract_version=1, topic="pin.profile.document-expiry-reminders.v1", message_key=owner,
        payload={"ownerUserId": owner, "documents": [{"type": "Visa", "thresholdDays": 7}]},
        headers={"event_type": "DocumentExpiryReminderKafkaEvent",
                 **({"correlation_id": str(correlation_id)} if correlation_id else {})},
        published_at=(published_at or now) if published else None, parked_at=now if parked else None,
        detoured_at=(published_at or now) if published or parked else None, attempts=attempts,
        last_error=last_error, **created,
    )
