"""The integration event DocumentExpiryReminderKafkaEvent, contract version 1 (docs/design.md §2.5).

The body is built in SQL (store `claim_batch`) from the markers a cycle won; these are
the constants of its envelope. docs/contracts/ documents the contract and its JSON Schema.
"""

from datetime import UTC, datetime

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
