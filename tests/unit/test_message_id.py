"""The outbox row's id (the `message_id` header) is named after what the reminder is and the
arming its markers are in (docs/contracts/document-expiry-reminder.md, "message_id"):
recomputed here from the contract's recipe alone, and the contract's worked examples are what
the worker computes."""

import random
import re
import uuid
from datetime import date, timedelta
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from reminders.events import MESSAGE_ID_NAMESPACE, ReminderItem, message_id, message_id_name
from tests.support.contract import contract_name, recipe

CONTRACT = Path(__file__).resolve().parents[2] / "docs" / "contracts" / "document-expiry-reminder.md"
OWNER = uuid.UUID("6f1c2d3e-0000-4000-8000-000000000001")
PASSPORT = ReminderItem(uuid.UUID("0b7e9a52-0000-4000-8000-00000000000a"), 7, date(2026, 12, 6))
VISA = ReminderItem(uuid.UUID("0b7e9a52-0000-4000-8000-000000000009"), 0, date(2026, 11, 29))
# The contract's worked examples: a first arming, and the passport's marker in its third (its
# expiry corrected to another date, then back to this one)
EXAMPLES = [[PASSPORT, VISA], [PASSPORT._replace(arming=3), VISA]]


def test_the_name_is_the_owner_then_its_items_sorted_by_document() -> None:
    assert message_id_name(OWNER, [PASSPORT, VISA]) == (
        "6f1c2d3e-0000-4000-8000-000000000001"
        ";0b7e9a52-0000-4000-8000-000000000009,0,2026-11-29"
        ";0b7e9a52-0000-4000-8000-00000000000a,7,2026-12-06")


def test_an_arming_after_the_first_follows_the_date_and_a_first_one_is_named_as_before() -> None:
    assert message_id_name(OWNER, [PASSPORT._replace(arming=3), VISA._replace(arming=1)]) == (
        "6f1c2d3e-0000-4000-8000-000000000001"
        ";0b7e9a52-0000-4000-8000-000000000009,0,2026-11-29"
        ";0b7e9a52-0000-4000-8000-00000000000a,7,2026-12-06,3")
    # the ids every reminder had before the arming counted: an arming 1 keeps them
    assert message_id(OWNER, [PASSPORT, VISA]) == uuid.UUID("a20811b6-1a51-857a-9fa0-e656260a2335")


def test_the_id_is_the_contracts_recipe_a_version_8_uuid() -> None:
    for items in EXAMPLES:
        made = message_id(OWNER, items)
        name = contract_name(str(OWNER), [(str(i.document_id), i.threshold_days,
                                           i.expires_at.isoformat(), i.arming) for i in items])

        assert made == recipe(MESSAGE_ID_NAMESPACE, name)
        assert (made.version, made.variant) == (8, uuid.RFC_4122)


def test_the_contract_states_the_namespace_and_worked_examples_that_hold() -> None:
    text = CONTRACT.read_text(encoding="utf-8")
    [namespace] = re.findall(r"namespace is `([0-9a-f-]{36})`", text)
    stated = re.findall(r"name `([^`]+)`\s+gives `([0-9a-f-]{36})`", text)

    assert namespace == str(MESSAGE_ID_NAMESPACE)
    assert [name for name, _ in stated] == [message_id_name(OWNER, items) for items in EXAMPLES]
    for (name, made), items in zip(stated, EXAMPLES, strict=True):
        assert made == str(recipe(uuid.UUID(namespace), name)) == str(
            message_id(OWNER, list(reversed(items))))


items = st.lists(st.builds(ReminderItem, st.uuids(), st.integers(0, 400),
                           st.dates(date(2000, 1, 1), date(2100, 12, 31)), st.just(1)),
                 min_size=1, max_size=6, unique_by=lambda i: i.document_id)


@given(st.uuids(), items, st.randoms())
def test_the_id_depends_on_what_the_reminder_is_not_on_the_items_order(
    owner: uuid.UUID, reminder: list[ReminderItem], rng: random.Random,
) -> None:
    shuffled = list(reminder)
    rng.shuffle(shuffled)
    later = [reminder[0]._replace(expires_at=reminder[0].expires_at + timedelta(days=1)),
             *reminder[1:]]

    assert message_id(owner, shuffled) == message_id(owner, reminder)
    assert message_id(owner, later) != message_id(owner, reminder)
    assert message_id(uuid.uuid5(owner, "other"), reminder) != message_id(owner, reminder)


@given(st.uuids(), items, st.lists(st.integers(1, 50), min_size=6, max_size=6),
       st.integers(0, 5), st.integers(1, 50))
def test_one_arming_one_id_a_replay_of_it_the_same_another_arming_another(
    owner: uuid.UUID, reminder: list[ReminderItem], armings: list[int], which: int, other: int,
) -> None:
    armed = [i._replace(arming=a) for i, a in zip(reminder, armings, strict=False)]
    which %= len(armed)
    rearmed = [*armed[:which], armed[which]._replace(arming=other), *armed[which + 1:]]

    # the same items in the same armings (a restore's replay) are the same reminder
    assert message_id(owner, [i._replace() for i in armed]) == message_id(owner, armed)
    # an item in another arming, even of the same date, is another reminder
    assert (message_id(owner, rearmed) == message_id(owner, armed)) == (
        other == armed[which].arming)
    # an arming 1 is named as the items were before the arming counted: three fields an item
    assert message_id_name(owner, [i._replace(arming=1) for i in armed]).count(",") == 2 * len(
        armed)
