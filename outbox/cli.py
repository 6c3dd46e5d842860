"""Helpers shared by the relay's management commands."""

import os

from django.core.management.base import CommandError

from core.commands import EXIT_USAGE
from core.config import ConfigError
from outbox.config import RelaySettings, load_relay_settings

EXIT_OK = 0
EXIT_NOT_ALL_DELIVERED = 1


def relay_settings_from_env(*, need_kafka: bool = True) -> RelaySettings:
    """KAFKA_BOOTSTRAP_SERVERS and OUTBOX_* from the environment, or a one-line CommandError
    with exit code 2."""
    try:
        return load_relay_settings(os.environ, need_kafka=need_kafka)
    except ConfigError as exc:
        raise CommandError(f"bad configuration: {exc}", returncode=EXIT_USAGE) from None
