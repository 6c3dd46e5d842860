"""The event contract, checked against the JSON Schema shipped in docs/contracts/."""

import hashlib
import itertools
import json
import uuid
from collections import Counter
from collections.abc import Mapping
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


# (documentId, thresholdDays) -> the arming of its marker when the event was written
Armings = Mapping[tuple[str, int], int]


def recipe(namespace: uuid.UUID, name: str) -> uuid.UUID:
    """The contract's recipe, written from its text: SHA-256 over the namespace's 16 bytes and
    the name's UTF-8, the first 16 bytes, version 8, variant 10."""
    raw = bytearray(hashlib.sha256(namespace.bytes + name.encode()).digest()[:16])
    raw[6] = raw[6] & 0x0F | 0x80
    raw[8] = raw[8] & 0x3F | 0x80
    return uuid.UUID(bytes=bytes(raw))


def contract_name(owner: str, items: list[tuple[str, int, str, int]]) -> str:
    """The contract's name, written from its text: the owner, then `;document,threshold,date`
    per (document, threshold, date, arming) item by document, threshold, date, with `,arming`
    after the date from the second arming on."""
    return owner + "".join(f";{d},{t},{e}" + (f",{a}" if a > 1 else "")
                           for d, t, e, a in sorted(items))


def named_after(body: dict[str, Any], armings: Armings | None = None) -> uuid.UUID:
    """The message id the contract derives from an event's owner and items, each item in the
    arming `armings` gives it (its first arming when not given)."""
    armings = armings or {}
    return events.message_id(uuid.UUID(body["ownerUserId"]), [
        events.ReminderItem(uuid.UUID(d["documentId"]), d["thresholdDays"],
                            date.fromisoformat(d["expiresAt"]),
                            armings.get((d["documentId"], d["thresholdDays"]), 1))
        for d in body["documents"]])


def _named_after_an_arming(msg_id: uuid.UUID, body: dict[str, Any], run: str,
                           markers: dict[tuple[str, int], tuple[str, str, int]],
                           listed: Mapping[tuple[str, int], int]) -> bool:
    """Whether `msg_id` is `body` named in the armings its items can have had: the arming of
    an item's marker when the event's run still holds it at the item's date; else any arming
    up to the marker's, or up to the number of events listing the item's (document, threshold)
    when more (the marker was re-armed since, or lost and written anew); True when a marker is
    gone (pruned)."""
    choices: list[range] = []
    for d in body["documents"]:
        key = (d["documentId"], d["thresholdDays"])
        marker = markers.get(key)
        if marker is None:
            return True
        expires, by_run, armings = marker
        held = (expires, by_run) == (d["expiresAt"], run)
        choices.append(range(armings, armings + 1) if held
                       else range(1, max(armings, listed[key]) + 1))
    keys = [(d["documentId"], d["thresholdDays"]) for d in body["documents"]]
    return any(msg_id == named_after(body, dict(zip(keys, picked, strict=True)))
               for picked in itertools.product(*choices))


def assert_outbox_matches_contract() -> None:
    """Every outbox row: a valid body, and the envelope of docs/design.md §2.4 (a cycle's row
    named after its reminder and its markers' arming, §2.6)."""
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        cursor.execute(
            "select id, aggregate_type, aggregate_id, event_type, contract_version, topic,"
            " message_key, payload, headers from outbox_messages"
        )
        rows = cursor.fetchall()
        cursor.execute("select run_id::text from document_expiry_reminder_runs")
        runs = {r[0] for r in cursor.fetchall()}
        cursor.execute("select document_id::text, threshold_days, expires_at::text, run_id::text,"
                       " armings from document_expiry_reminders")
        markers = {(d, t): (e, r, a) for d, t, e, r, a in cursor.fetchall()}
    bodies = [json.loads(row[7]) if isinstance(row[7], str) else row[7] for row in rows]
    listed = Counter[tuple[str, int]](
        (str(d.get("documentId")), int(d.get("thresholdDays") or 0)) for body in bodies
        if isinstance(body, dict) for d in body.get("documents") or [] if isinstance(d, dict))
    for row in rows:
        _assert_row_matches_contract(row, runs, markers, listed)


def _assert_row_matches_contract(
    row: tuple[Any, ...], runs: set[str], markers: dict[tuple[str, int], tuple[str, str, int]],
    listed: Counter[tuple[str, int]],
) -> None:
    (msg_id, agg_type, agg_id, event_type, version, topic, key, payload, headers) = row
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
        assert (msg_id.version, msg_id.variant) == (8, uuid.RFC_4122)
        assert _named_after_an_arming(msg_id, body, head["correlation_id"], markers, listed)
        # and its CloudEvents headers stored with the rest (outbox migration 0014)
        assert (head["ce_id"], head["ce_subject"], head["ce_specversion"]) == (
            str(msg_id), agg_id, "1.0")
