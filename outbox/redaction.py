"""Secrets out of any text the relay shows: the settings' passwords, and the values of
KAFKA_PRODUCER_CONFIG's properties whose names say they are secret."""

import re

from outbox.config import RelaySettings

# Property names whose values are secrets: never shown, even from KAFKA_PRODUCER_CONFIG.
_SECRET_NAME = re.compile(r"password|secret|token|\.pem$|credential")


def secrets(settings: RelaySettings) -> list[str]:
    """Every secret value in the settings, to scrub from any text shown."""
    security = settings.security
    values = [s.value for s in (security.sasl_password, security.ssl_key_password) if s]
    values += [str(v) for k, v in settings.extra_properties if _SECRET_NAME.search(k)]
    return [v for v in values if v]


def redact(text: str, settings: RelaySettings) -> str:
    for secret in secrets(settings):
        text = text.replace(secret, "***")
    return text
