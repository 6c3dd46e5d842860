"""publish_outbox reads its options before librdkafka's offline check, so that the check sees the
settings the relay runs with (--batch-size sizes the producer's queue)."""

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from core.config import ConfigError
from outbox import kafka
from outbox.config import RelaySettings


def test_the_producer_check_sees_the_batch_size_override(monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[RelaySettings] = []

    def check(settings: RelaySettings) -> None:
        checked.append(settings)
        raise ConfigError("KAFKA_PRODUCER_CONFIG", "stop here")  # before any database work

    monkeypatch.setattr(kafka, "check_producer_config", check)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")
    monkeypatch.setenv("OUTBOX_BATCH_SIZE", "500")
    with pytest.raises(CommandError) as raised:
        call_command("publish_outbox", "--batch-size", "7")
    assert raised.value.returncode == 2
    assert [s.batch_size for s in checked] == [7]


def test_a_bad_batch_size_is_said_before_a_bad_producer_property(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")
    monkeypatch.setenv("KAFKA_PRODUCER_CONFIG", '{"no.such.property": "1"}')
    with pytest.raises(CommandError) as raised:
        call_command("publish_outbox", "--batch-size", "0")
    assert raised.value.returncode == 2 and "--batch-size" in str(raised.value)
