"""The event contract, checked against the JSON Schema shipped in docs/contracts/."""

import json
import uuid
from datetime import date
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from django.db import connection

from reminders import events

SCHEMA_PATH = (
    Path(__file__).resolve().parents[2] / "docs" / "contracts"
    / "document-expiry-reminder.v1.schema.json"
)


@cache
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


def assert_event_valid(payload: dict[str, Any]) -> None:
    """Raise if `payload` breaks the contract."""
    validator().validate(payload)


def named_after(body: dict[str, Any]) -> uuid.UUID:
    """The message id the contract derives from an event's owner and items."""
    return events.message_id(uuid.UUID(body["ownerUserId"]), [
        events.ReminderItem(uuid.UUID(d["documentId"]), d["thresholdDays"],
                            date.fromisoformat(d["expiresAt"])) for d in body["documents"]])


def assert_outbox_matches_contract() -> None:
    """Every outbox row: a valid body, and the envelope of docs/design.md §2.4 (a cycle's row
    named after its reminder, §2.6)."""
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        cursor.execute(
            "select id, aggregate_type, aggregate_id, event_type, contract_version, topic,"
            " message_key, payload, headers from outbox_messages"
        )
        rows = cursor.fetchall()
        cursor.execute("select run_id::text from document_expiry_reminder_runs")
        runs = {r[0] for r in cursor.fetchall()}
    for (msg_id, agg_type, agg_id, event_type, version, topic, key, payload, headers) in rows:
        body = json.loads(payload) if isinstance(payload, str) else payload
        head = json.loads(headers) if isinstance(headers, str) else headers
        assert_event_valid(body)
        assert (agg_type, event_type, version, topic) == (
            events.AGGREGATE_TYPE, events.EVENT_TYPE, events.CONTRACT_VERSION, events.TOPIC
        )
        assert agg_id == key == body["ownerUserId"]
        assert head["message_id"] == str(msg_id)
        assert head["event_type"] == events.EVENT_TYPE
        assert head["contract_version"] == str(events.CONTRACT_VERSION)
        assert head["correlation_id"]
        if head["correlation_id"] in runs:  # a cycle wrote it: named after its reminder
            assert msg_id == named_after(body)
