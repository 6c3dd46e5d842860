"""The integration event DocumentExpiryReminderKafkaEvent, contract version 1 (DESIGN 2.4).

The body is built in SQL (store `claim_batch`) from the markers a cycle won; these are
the constants of its envelope. docs/contracts/ documents the contract and its JSON Schema.
"""

from datetime import UTC, datetime

AGGREGATE_TYPE = "Profile"
EVENT_TYPE = "DocumentExpiryReminderKafkaEvent"
CONTRACT_VERSION = 1
TOPIC = "pin.profile.document-expiry-reminders.v1"


def format_instant(instant: datetime) -> str:
    """`remindedAt`: an RFC 3339 UTC instant with a `Z`, milliseconds only when present."""
    utc = instant.astimezone(UTC)
    spec = "milliseconds" if utc.microsecond else "seconds"
    return utc.isoformat(timespec=spec).replace("+00:00", "Z")
