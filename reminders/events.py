"""The integration event DocumentExpiryReminderKafkaEvent, contract version 1 (docs/design.md §2.5).

The body is built in SQL (store `claim_batch`) from the markers a cycle won; these are
the constants of its envelope. docs/contracts/ documents the contract and its JSON Schema.
"""

import hashlib
import uuid
from collections.abc import Iterable
from datetime import UTC, date, datetime
from typing import NamedTuple

AGGREGATE_TYPE = "Profile"
EVENT_TYPE = "DocumentExpiryReminderKafkaEvent"
CONTRACT_VERSION = 1
TOPIC = "pin.profile.document-expiry-reminders.v1"
# An item is about 200 bytes of JSON: 500 keep an event near 100 KB, far below Kafka's
# default 1 MB message limit. An owner with more due documents gets the most urgent 500;
# the others stay unmarked and go out in the next cycle's event.
MAX_DOCUMENTS_PER_EVENT = 500


# The document types that expire (docs/design.md §2.1): the admin's filter and the demo
# data offer these; the data may hold others, and the event carries whatever type it has.
DOCUMENT_TYPES = ("Passport", "InternationalPassport", "DriverLicense", "ResidencePermit", "Visa")

# The contract requires a non-empty type; a blank one in the source data goes out as this
# (reminders/sql/queries.sql, claim_batch).
UNKNOWN_DOCUMENT_TYPE = "Unknown"


def format_instant(instant: datetime) -> str:
    """`remindedAt`: an RFC 3339 UTC instant with a `Z`, milliseconds only when present."""
    utc = instant.astimezone(UTC)
    spec = "milliseconds" if utc.microsecond else "seconds"
    return utc.isoformat(timespec=spec).replace("+00:00", "Z")


# The outbox row's id (the `message_id` header) is named after what the reminder is and the
# arming its markers are in, so a reminder written again after a restore or rollback is a
# redelivery to every consumer, and a new arming a new reminder (docs/design.md, "One arming,
# one message id"; docs/contracts/ documents the derivation).
MESSAGE_ID_NAMESPACE = uuid.UUID("c5cc8b04-2178-5be9-aab2-e07f9c6ede53")


class ReminderItem(NamedTuple):
    """One document of an event, as its message id names it: its marker's (document,
    threshold), the expiry date and the arming the marker is in (1 from its first write, one
    more at each re-arm)."""

    document_id: uuid.UUID
    threshold_days: int
    expires_at: date
    arming: int = 1


def message_id_name(owner_user_id: uuid.UUID, items: Iterable[ReminderItem]) -> str:
    """The reminder's name: the owner, then `;document,threshold,YYYY-MM-DD` per item, with
    `,arming` after the date from the second arming on (a first arming is named as before the
    arming counted), the items by document id, threshold, expiry date (ids in canonical
    lowercase text)."""
    ordered = sorted((str(i.document_id), i.threshold_days, i.expires_at, i.arming)
                     for i in items)
    return str(owner_user_id) + "".join(
        f";{document},{threshold},{expires.isoformat()}" + (f",{arming}" if arming > 1 else "")
        for document, threshold, expires, arming in ordered)


def message_id(owner_user_id: uuid.UUID, items: Iterable[ReminderItem]) -> uuid.UUID:
    """The reminder's message id, as the claim statement computes it: a name-based UUID
    (RFC 9562 version 8, SHA-256, as its appendix B.2) over the namespace and the name."""
    name = message_id_name(owner_user_id, items).encode("utf-8")
    digest = bytearray(hashlib.sha256(MESSAGE_ID_NAMESPACE.bytes + name).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x80  # version 8
    digest[8] = (digest[8] & 0x3F) | 0x80  # the RFC 4122/9562 variant
    return uuid.UUID(bytes=bytes(digest))


def envelope_params(as_of: datetime) -> dict[str, object]:
    """The event's envelope as the claim statement's parameters: `store.claim_batch`'s, and
    the benchmark's floor's, which runs the same statement (bench/bench_reminders.py)."""
    return {
        "reminded_at": format_instant(as_of),
        "aggregate_type": AGGREGATE_TYPE,
        "event_type": EVENT_TYPE,
        "contract_version": CONTRACT_VERSION,
        "topic": TOPIC,
        "message_id_namespace": MESSAGE_ID_NAMESPACE,
        "unknown_type": UNKNOWN_DOCUMENT_TYPE,
    }
