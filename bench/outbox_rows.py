"""The relay benchmarks' data: reminder events as the cycle writes them (`bench_messages`),
COPYed into the outbox as unpublished rows (`load_outbox`)."""

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta


@dataclass(frozen=True)
class BenchMessage:
    id: uuid.UUID
    key: str
    payload: str
    headers: dict[str, str]
    created_at: datetime


def bench_messages(count: int, topic_seed: int = 0) -> list[BenchMessage]:
    """`count` reminder events, one per owner (as a cycle writes them), ~400 bytes each."""
    base = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
    messages = []
    for n in range(count):
        owner = str(uuid.UUID(int=(topic_seed << 64) + n + 1, version=4))
        message_id = uuid.uuid4()
        payload = json.dumps({
            "ownerUserId": owner,
            "remindedAt": "2026-11-29T03:00:00Z",
            "documents": [{"documentId": str(uuid.uuid4()), "type": "Passport",
                           "numberMask": f"45 ** ****{n % 100:02d}", "expiresAt": "2026-12-06",
                           "thresholdDays": 7, "daysLeft": 7}],
        })
        created_at = base + timedelta(microseconds=n)
        # What outbox_headers() stores for the worker (outbox migrations 0010 and 0014).
        headers = {"message_id": str(message_id), "correlation_id": str(uuid.uuid4()),
                   "event_type": "DocumentExpiryReminderKafkaEvent", "contract_version": "1",
                   "aggregate_type": "Profile", "aggregate_id": owner,
                   "ce_specversion": "1.0", "ce_id": str(message_id),
                   "ce_source": "/pin/profile/document-expiry-reminder",
                   "ce_type": "pin.profile.document-expiry-reminder.v1",
                   "ce_time": created_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                   "ce_subject": owner, "content-type": "application/json"}
        messages.append(BenchMessage(message_id, owner, payload, headers, created_at))
    return messages


def load_outbox(messages: Iterable[BenchMessage], topic: str, using: str = "default", *,
                analyze: bool = True) -> None:
    """COPY the messages into outbox_messages as unpublished rows (then VACUUM ANALYZE the
    table, unless `analyze` is false)."""
    from core.db import raw_connection

    conn = raw_connection(using)
    columns = ("id, aggregate_type, aggregate_id, event_type, contract_version, topic, "
               "message_key, payload, headers, created_at, attempts")
    with conn.transaction(), conn.cursor() as cur, cur.copy(
        f"copy outbox_messages ({columns}) from stdin"
    ) as copy:
        for m in messages:
            copy.write_row((m.id, "Profile", m.key, m.headers["event_type"], 1, topic, m.key,
                            m.payload, json.dumps(m.headers), m.created_at, 0))
    with conn.cursor() as cur:
        if analyze and conn.autocommit:
            cur.execute("vacuum analyze outbox_messages")


