"""The audit names a reminder as the claim does: its statement carries the claim's own
expressions for the name and the message id (reminders/sql/queries.sql `claim_batch`), word for
word, so the two cannot drift apart (docs/contracts/document-expiry-reminder.md, "message_id")."""

import re

import pytest

from audit import store
from reminders import store as reminders_store

# each piece of the derivation, from its first words to its last, as the claim writes it
PIECES = {
    "the name": (r"owner_user_id::text \|\| string_agg\(", r"\) as name"),
    "the digest": (r"substring\(sha256\(", r"from 1 for 16\)"),
    "the version and variant": (r"encode\(set_byte\(", r"'hex'\)::uuid"),
}


def words(statement: str) -> str:
    return " ".join(statement.split())


def piece(statement: str, first: str, last: str) -> str:
    found = re.findall(f"{first}.*?{last}", words(statement))
    assert len(found) == 1, f"{first!r} .. {last!r} is not once in the statement: {found}"
    return str(found[0])


@pytest.mark.parametrize("name", PIECES)
def test_the_audit_derives_the_message_id_with_the_claims_own_expression(name: str) -> None:
    first, last = PIECES[name]
    claim = piece(reminders_store.QUERIES["claim_batch"], first, last)

    assert claim == piece(store.QUERIES["ledger_outbox"], first, last)


def test_both_name_the_namespace_by_the_same_parameter() -> None:
    namespace = "uuid_send(%(message_id_namespace)s::uuid)"
    assert namespace in words(reminders_store.QUERIES["claim_batch"])
    assert namespace in words(store.QUERIES["ledger_outbox"])
