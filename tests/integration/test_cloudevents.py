"""A CloudEvents consumer reads the topic without code of ours (docs/contracts/
document-expiry-reminder.md, "CloudEvents"): the `cloudevents` SDK's Kafka binding in binary
mode gets back each event, its id (the message id), its data (the payload) and its attributes,
for a row the worker wrote (headers stored at insert) and for rows the previous release wrote
(completed by the relay's reads, in the stream and in the slow lane)."""

import json
import uuid
from datetime import datetime
from typing import Any

import pytest
from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings.kafka import KafkaMessage, from_binary
from cloudevents.core.formats.json import JSONFormat
from django.db import connection

from core.roles import WORKER_ROLE
from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import Record, read_topic
from outbox.relay import Relay
from reminders import events
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import CycleRunner, as_role
from tests.support.factories import Documents
from tests.support.ledger import AS_OF, expiring_in
from tests.support.relay_support import as_relay, event_payload, relay_settings, stored_rows

CE_TYPE = "pin.profile.document-expiry-reminder.v1"
CE_SOURCE = "/pin/profile/document-expiry-reminder"
# The CloudEvents headers a writer may not forge (its extra headers lose to the outbox's own).
FORGED = {"ce_id": "forged", "ce_type": "forged", "ce_source": "forged", "ce_time": "forged",
          "ce_subject": "forged", "ce_specversion": "0.3", "content-type": "text/plain"}


def as_cloudevent(record: Record) -> BaseCloudEvent:
    """A record as a CloudEvents consumer takes it: the SDK's Kafka binding, binary mode."""
    message = KafkaMessage(headers={k: v.encode() for k, v in record.headers.items()},
                           key=record.key.encode(), value=record.value)
    return from_binary(message, JSONFormat())


def assert_cloudevent(record: Record, row_id: str, created_at: datetime) -> None:
    """The record read as a CloudEvent: the row's id, payload, owner and time."""
    event = as_cloudevent(record)
    assert event.get_id() == row_id == record.message_id
    assert event.get_data() == record.json()
    assert event.get_specversion() == "1.0"
    assert event.get_type() == CE_TYPE
    assert event.get_source() == CE_SOURCE
    assert event.get_subject() == record.key == record.json()["ownerUserId"]
    assert event.get_time() == created_at  # to the microsecond, in UTC
    assert event.get_datacontenttype() == "application/json"
    assert event.get_extension("partitionkey") == record.key  # the key stays the owner
    # The headers consumers used before stay, beside CloudEvents'.
    assert record.headers["message_id"] == row_id
    assert record.headers["event_type"] == events.EVENT_TYPE
    assert record.headers["aggregate_id"] == record.key


def test_a_cloudevents_consumer_reads_the_worker_s_events(
    run: CycleRunner, documents: Documents, kafka: MockKafkaCluster
) -> None:
    for days in (29, 6, 0):
        documents(expires_at=expiring_in(days))
    run(AS_OF)
    rows = stored_rows()
    assert len(rows) == 3
    with as_relay():
        assert Relay(relay_settings(kafka.bootstrap_servers)).run_pass().published == 3

    records = read_topic(kafka.bootstrap_servers)
    assert sorted(r.message_id for r in records) == sorted(rows)
    for record in records:
        row = rows[record.message_id]
        # Stored at insert (outbox_headers), sent as stored.
        assert row.headers["ce_id"] == record.message_id and row.headers["ce_subject"] == row.key
        assert record.headers == row.headers
        assert_cloudevent(record, record.message_id, row.created_at)
    assert_outbox_matches_contract()


def insert_previous_release_row(owner: str, headers_sql: str, params: list[Any]) -> str:
    """A row as the previous release's writer stored it (headers by `headers_sql`, a form of
    outbox_headers without the CloudEvents headers), as the worker role; its id."""
    row_id = str(uuid.uuid4())
    with as_role(WORKER_ROLE), connection.cursor() as cursor:
        cursor.execute(
            "insert into outbox_messages (id, aggregate_type, aggregate_id, event_type,"
            " contract_version, topic, message_key, payload, headers, created_at, attempts)"
            f" values (%s, %s, %s, %s, %s, %s, %s, %s, {headers_sql}, now(), 0)",
            [row_id, events.AGGREGATE_TYPE, owner, events.EVENT_TYPE, events.CONTRACT_VERSION,
             events.TOPIC, owner, json.dumps(event_payload(owner, 0)), row_id, *params])
    return row_id


# 0.1.0's seven-argument form stored the aggregate but no CloudEvents headers; the five-argument
# one (a writer older still) neither. Forged CloudEvents extras never win at the read.
PREVIOUS_RELEASE = {
    "seven arguments, before 0014": (
        "outbox_headers(%s, 'run-1', %s, %s, %s, %s, %s::jsonb)"
        " - array['ce_specversion', 'ce_id', 'ce_source', 'ce_type', 'ce_time', 'ce_subject',"
        "         'content-type']",
        lambda owner: [events.EVENT_TYPE, events.CONTRACT_VERSION, events.AGGREGATE_TYPE, owner,
                       json.dumps({"traceparent": "00-ab-cd-01"})]),
    "five arguments": (
        "outbox_headers(%s, 'run-1', %s, %s, %s::jsonb)",
        lambda _owner: [events.EVENT_TYPE, events.CONTRACT_VERSION, json.dumps(FORGED)]),
}


@pytest.mark.parametrize("lane", ["stream", "slow lane"])
@pytest.mark.parametrize("form", list(PREVIOUS_RELEASE))
def test_a_row_of_the_previous_release_reaches_the_topic_as_a_cloudevent(
    transactional_db: None, kafka: MockKafkaCluster, form: str, lane: str
) -> None:
    headers_sql, params = PREVIOUS_RELEASE[form]
    owner = str(uuid.uuid4())
    row_id = insert_previous_release_row(owner, headers_sql, params(owner))
    if lane == "slow lane":  # a row the relay detoured once: due again, read by read_slow
        with connection.cursor() as cursor:
            cursor.execute("update outbox_messages set detoured_at = now(), attempts = 1"
                           " where id = %s", [row_id])
    [row] = stored_rows().values()
    assert "ce_id" not in row.headers
    with as_relay():
        stats = Relay(relay_settings(kafka.bootstrap_servers)).run_pass()

    assert stats.published == 1
    [record] = read_topic(kafka.bootstrap_servers)
    assert_cloudevent(record, row_id, row.created_at)
    assert record.headers["correlation_id"] == "run-1"
    assert record.headers["aggregate_type"] == events.AGGREGATE_TYPE
    if form == "seven arguments, before 0014":
        assert record.headers["traceparent"] == "00-ab-cd-01"


def test_a_writer_s_extra_headers_never_replace_the_cloudevents_headers(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    owner = str(uuid.uuid4())
    row_id = insert_previous_release_row(
        owner, "outbox_headers(%s, 'run-1', %s, %s, %s, %s, %s::jsonb)",
        [events.EVENT_TYPE, events.CONTRACT_VERSION, events.AGGREGATE_TYPE, owner,
         json.dumps(FORGED)])
    [row] = stored_rows().values()
    with as_relay():
        assert Relay(relay_settings(kafka.bootstrap_servers)).run_pass().published == 1

    assert row.headers["ce_id"] == row_id
    [record] = read_topic(kafka.bootstrap_servers)
    assert_cloudevent(record, row_id, row.created_at)


@pytest.mark.parametrize(("event_type", "name"), [
    ("DocumentExpiryReminderKafkaEvent", "document-expiry-reminder"),  # spelled out
    ("ProfileAddressChangedKafkaEvent", "profile-address-changed"),  # by the rule
    ("KycRefreshed", "kyc-refreshed"),
])
def test_the_cloudevents_name_is_the_event_type_in_kebab_case_without_kafka_event(
    transactional_db: None, event_type: str, name: str
) -> None:
    with connection.cursor() as cursor:
        cursor.execute("select outbox_cloudevents_name(%s),"
                       " lower(regexp_replace(regexp_replace(%s, 'KafkaEvent$', ''),"
                       "                      '([a-z0-9])([A-Z])', '\\1-\\2', 'g'))",
                       [event_type, event_type])
        assert cursor.fetchone() == (name, name)  # the spelled-out name is the rule's
