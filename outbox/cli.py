"""Helpers shared by the relay's management commands."""

import os

from django.core.management.base import CommandError

from outbox.config import RelaySettings, load_relay_settings
from outbox.kafka import check_producer_config
from reminders.cli import EXIT_USAGE
from reminders.config import ConfigError

EXIT_OK = 0
EXIT_NOT_ALL_DELIVERED = 1


def relay_settings_from_env(*, need_kafka: bool = True) -> RelaySettings:
    """KAFKA_* and OUTBOX_* from the environment (with the producer's configuration checked by
    librdkafka, offline), or a one-line CommandError with exit code 2."""
    try:
        settings = load_relay_settings(os.environ, need_kafka=need_kafka)
        if need_kafka:
            check_producer_config(settings)
        return settings
    except ConfigError as exc:
        raise CommandError(f"bad configuration: {exc}", returncode=EXIT_USAGE) from None
