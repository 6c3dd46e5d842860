"""The outbox row's id (the `message_id` header) is named after what the reminder is
(docs/contracts/document-expiry-reminder.md, "message_id"): recomputed here from the contract's
recipe alone, and the contract's worked example is what the worker computes."""

import hashlib
import random
import re
import uuid
from datetime import date
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from reminders.events import MESSAGE_ID_NAMESPACE, ReminderItem, message_id, message_id_name

CONTRACT = Path(__file__).resolve().parents[2] / "docs" / "contracts" / "document-expiry-reminder.md"
OWNER = uuid.UUID("6f1c2d3e-0000-4000-8000-000000000001")
PASSPORT = ReminderItem(uuid.UUID("0b7e9a52-0000-4000-8000-00000000000a"), 7, date(2026, 12, 6))
VISA = ReminderItem(uuid.UUID("0b7e9a52-0000-4000-8000-000000000009"), 0, date(2026, 11, 29))


def recipe(namespace: str, name: str) -> uuid.UUID:
    """The contract's recipe, written from its text: SHA-256 over the namespace's 16 bytes and
    the name's UTF-8, the first 16 bytes, version 8, variant 10."""
    raw = bytearray(hashlib.sha256(uuid.UUID(namespace).bytes + name.encode()).digest()[:16])
    raw[6] = raw[6] & 0x0F | 0x80
    raw[8] = raw[8] & 0x3F | 0x80
    return uuid.UUID(bytes=bytes(raw))


def test_the_name_is_the_owner_then_its_items_sorted_by_document() -> None:
    assert message_id_name(OWNER, [PASSPORT, VISA]) == (
        "6f1c2d3e-0000-4000-8000-000000000001"
        ";0b7e9a52-0000-4000-8000-000000000009,0,2026-11-29"
        ";0b7e9a52-0000-4000-8000-00000000000a,7,2026-12-06")


def test_the_id_is_the_contracts_recipe_a_version_8_uuid() -> None:
    made = message_id(OWNER, [PASSPORT, VISA])

    assert made == recipe(str(MESSAGE_ID_NAMESPACE), message_id_name(OWNER, [VISA, PASSPORT]))
    assert (made.version, made.variant) == (8, uuid.RFC_4122)


def test_the_contract_states_the_namespace_and_a_worked_example_that_holds() -> None:
    text = CONTRACT.read_text(encoding="utf-8")
    [namespace] = re.findall(r"namespace is `([0-9a-f-]{36})`", text)
    [(name, stated)] = re.findall(r"name `([^`]+)`\s+gives `([0-9a-f-]{36})`", text)

    assert namespace == str(MESSAGE_ID_NAMESPACE)
    assert name == message_id_name(OWNER, [PASSPORT, VISA])
    assert stated == str(recipe(namespace, name)) == str(message_id(OWNER, [VISA, PASSPORT]))


items = st.lists(st.builds(ReminderItem, st.uuids(), st.integers(0, 400),
                           st.dates(date(2000, 1, 1), date(2100, 12, 31))),
                 min_size=1, max_size=6, unique_by=lambda i: i.document_id)


@given(st.uuids(), items, st.randoms())
def test_the_id_depends_on_what_the_reminder_is_not_on_the_items_order(
    owner: uuid.UUID, reminder: list[ReminderItem], rng: random.Random,
) -> None:
    shuffled = list(reminder)
    rng.shuffle(shuffled)
    later = [reminder[0]._replace(expires_at=reminder[0].expires_at.replace(year=2101)),
             *reminder[1:]]

    assert message_id(owner, shuffled) == message_id(owner, reminder)
    assert message_id(owner, later) != message_id(owner, reminder)
    assert message_id(uuid.uuid5(owner, "other"), reminder) != message_id(owner, reminder)
