"""The relay when things go wrong: the broker away and back, a message that cannot be
delivered, re-queueing it. (Its settings and error rules, pure, are in tests/unit.)"""

import logging
import threading
import uuid
from datetime import timedelta
from io import StringIO

import pytest
from confluent_kafka.admin import AdminClient
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import read_topic
from outbox import store
from outbox.relay import Relay
from tests.integration.test_relay_topic import said
from tests.support.relay_support import (
    BASE_TIME,
    TOPIC,
    RelayThread,
    as_relay,
    first_seen_order,
    insert_outbox,
    interleaved_rows,
    outbox_state,
    relay_lock_holders,
    relay_settings,
    unpublished_count,
    wait_for,
    written_order,
)


def test_broker_down_pauses_with_backoff_and_everything_goes_out_when_it_is_back(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    written = interleaved_rows(keys=5, per_key=3)
    kafka.set_down()
    settings = relay_settings(kafka.bootstrap_servers, delivery_timeout=timedelta(milliseconds=300))
    waits: list[float] = []
    stop = threading.Event()

    def recorded_wait(seconds: float) -> None:
        waits.append(seconds)
        stop.wait(seconds)

    thread = RelayThread(settings, stop=stop, wait=recorded_wait)
    thread.start()
    try:
        wait_for(lambda: len(waits) >= 5, timeout=30, what="five backoffs while the broker is down")
        stats = thread.relay.stats
        # No tight loop: one claim per backoff, each wait longer than the last up to the cap.
        assert stats.batches <= len(waits) + 1
        ceilings = [min(0.4, 0.05 * 2 ** n) for n in range(len(waits))]
        assert all(c / 2 <= w <= c for w, c in zip(waits, ceilings, strict=False))
        # Nothing was lost or counted against the messages: no attempt burned, none parked, and
        # a whole broker away detours nothing (the position waits for it).
        down = outbox_state()
        assert all(r["published_at"] is None and r["attempts"] == 0 and r["parked_at"] is None
                   and r["detoured_at"] is None for r in down)
        assert stats.published == 0 and stats.released >= 5

        kafka.set_up()
        wait_for(lambda: unpublished_count() == 0, timeout=60, what="every row published")
    finally:
        thread.stop_and_join()

    # Published in order per key, with no attempt counted for the outage. As the broker comes
    # back, a partition whose leader answers a moment after the others' may have its rows
    # deferred (that partition's outage, not the broker's), and the probe batch after the
    # outage held its keys' later rows behind their heads: those were detoured, and the slow
    # lane's delivery counts their one attempt.
    after = outbox_state()
    assert all(r["attempts"] == 0 and r["parked_at"] is None for r in after
               if r["detoured_at"] is None)
    assert all(r["attempts"] == 1 for r in after if r["detoured_at"] is not None)
    assert all(r["last_error"] is None for r in after if r["detoured_at"] is None)
    records = read_topic(kafka.bootstrap_servers)
    assert first_seen_order(records) == {k: [str(i) for i in ids] for k, ids in written.items()}


def test_one_pass_with_the_broker_down_releases_everything_and_reports_it(
    transactional_db: None,
) -> None:
    rows = [insert_outbox(str(uuid.uuid4()), created_at=BASE_TIME) for _ in range(3)]
    settings = relay_settings("127.0.0.1:9", delivery_timeout=timedelta(milliseconds=300))

    with as_relay():
        stats = Relay(settings).run_pass()

    assert (stats.batches, stats.released, stats.published, stats.failed) == (1, 3, 0, 0)
    # Still in the stream, ahead of the position: none published or detoured, no attempt.
    assert [(r["id"], r["published_at"], r["detoured_at"], r["attempts"], r["available_at"])
            for r in outbox_state()] \
        == [(r.id, None, None, 0, None) for r in sorted(rows, key=lambda r: (r.created_at, r.id))]


def test_a_poison_message_is_parked_while_other_keys_flow_and_holds_its_own_key(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    poison_key = str(uuid.uuid4())
    poison = insert_outbox(poison_key, created_at=BASE_TIME,
                           payload='{"filler": "' + "x" * 1_200_000 + '"}')
    behind = insert_outbox(poison_key, created_at=BASE_TIME + timedelta(seconds=1), seq=1)
    others = interleaved_rows(keys=6, per_key=2)
    settings = relay_settings(kafka.bootstrap_servers, max_attempts=3,
                              backoff_initial=timedelta(milliseconds=10),
                              backoff_max=timedelta(milliseconds=20))

    with as_relay():
        relay = Relay(settings)
        wait_for(lambda: relay.run_pass().parked == 1, timeout=30, what="the poison to be parked")

    state = {r["id"]: r for r in outbox_state()}
    assert state[poison.id]["parked_at"] is not None
    assert state[poison.id]["attempts"] == 3
    assert "MSG_SIZE_TOO_LARGE" in state[poison.id]["last_error"]
    assert state[behind.id]["published_at"] is None  # order per key: it waits behind the poison
    assert all(state[i]["published_at"] is not None for ids in others.values() for i in ids)
    records = read_topic(kafka.bootstrap_servers)
    assert first_seen_order(records) == {k: [str(i) for i in ids] for k, ids in others.items()}

    # The operator sees it, fixes it, re-queues it: it goes out, then the row behind it.
    listing = _call("requeue_outbox")
    assert str(poison.id) in listing and "holding back 1" in listing
    fix_payload(poison.id)
    assert f"re-queued 1 message(s)\n  {poison.id}" in _call("requeue_outbox", "--id", str(poison.id))
    with as_relay():
        Relay(settings).run_pass()
    assert unpublished_count() == 0
    after = read_topic(kafka.bootstrap_servers)
    assert first_seen_order(after)[poison_key] == [str(poison.id), str(behind.id)]


OTHER_TOPIC = "pin.payments.transfers.v1"


def cluster_topics(bootstrap: str) -> set[str]:
    """The topics the cluster has (listing them creates none)."""
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def test_a_row_naming_a_topic_off_the_allowlist_is_parked_at_once_never_sent_and_holds_its_key(
    transactional_db: None, kafka: MockKafkaCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker's role may write any topic into a row: the relay sends only to OUTBOX_TOPICS.
    Such a row is parked in its place, in one pass (no attempt, no retry), other owners flow and
    its own later rows wait behind it, as behind any parked row."""
    key = str(uuid.uuid4())
    others = interleaved_rows(keys=6, per_key=2)
    foreign = insert_outbox(key, created_at=BASE_TIME + timedelta(seconds=1), topic=OTHER_TOPIC)
    behind = insert_outbox(key, created_at=BASE_TIME + timedelta(seconds=2), seq=1)
    later = interleaved_rows(keys=6, per_key=2)
    settings = relay_settings(kafka.bootstrap_servers, batch_size=3)  # reads ahead, pipelined
    refusal = (f"topic {OTHER_TOPIC!r} is not on OUTBOX_TOPICS ({TOPIC}): never sent, parked")

    with as_relay(), caplog.at_level(logging.ERROR, logger="outbox.relay"):
        stats = Relay(settings).run_pass()

    assert (stats.parked, stats.failed) == (1, 0)
    state = {r["id"]: r for r in outbox_state()}
    assert state[foreign.id]["parked_at"] is not None
    assert (state[foreign.id]["attempts"], state[foreign.id]["last_error"]) == (0, refusal)
    assert state[behind.id]["published_at"] is None and state[behind.id]["parked_at"] is None
    flowed = {**others, **later}
    assert all(state[i]["published_at"] is not None for ids in flowed.values() for i in ids)
    assert first_seen_order(read_topic(kafka.bootstrap_servers)) == written_order(flowed)
    assert OTHER_TOPIC not in cluster_topics(kafka.bootstrap_servers)  # never even looked at
    [line] = said(caplog, "message parked, its topic is not on OUTBOX_TOPICS")
    assert (line["message_id"], line["topic"]) == (foreign.id, OTHER_TOPIC)
    assert store.backlog("default").parked == 1

    # Re-queued as it is, the slow lane parks it again at once; once the topic is on the
    # allowlist it goes out, and the row behind it after it.
    _call("requeue_outbox", "--id", str(foreign.id))
    with as_relay():
        assert Relay(settings).run_pass().parked == 1
    assert {r["id"]: r for r in outbox_state()}[foreign.id]["last_error"] == refusal
    assert OTHER_TOPIC not in cluster_topics(kafka.bootstrap_servers)
    _call("requeue_outbox", "--id", str(foreign.id))
    with as_relay():
        Relay(settings.with_overrides(topics=frozenset({TOPIC, OTHER_TOPIC}))).run_pass()
    assert unpublished_count() == 0
    [sent] = read_topic(kafka.bootstrap_servers, OTHER_TOPIC)
    assert sent.message_id == str(foreign.id)
    assert first_seen_order(read_topic(kafka.bootstrap_servers))[key] == [str(behind.id)]


def fix_payload(message_id: uuid.UUID) -> None:
    """The operator's fix of a poison row (a payload that fits), done as the table owner."""
    with connection.cursor() as cursor:
        cursor.execute("update outbox_messages set payload = %s where id = %s",
                       ['{"fixed": true}', message_id])


def _call(*args: str) -> str:
    out = StringIO()
    with as_relay():
        call_command(*args, stdout=out)
    return out.getvalue()


def test_requeue_of_a_message_that_is_not_parked_fails_with_exit_1(transactional_db: None) -> None:
    row = insert_outbox(str(uuid.uuid4()), created_at=BASE_TIME)
    with pytest.raises(CommandError) as raised:
        _call("requeue_outbox", "--id", str(row.id))
    assert raised.value.returncode == 1
    assert str(row.id) in str(raised.value)




def test_stop_before_a_batch_reads_nothing(transactional_db: None) -> None:
    insert_outbox(str(uuid.uuid4()), created_at=BASE_TIME)
    stop = threading.Event()
    stop.set()
    with as_relay():
        start = store.read_position("default")
        assert Relay(relay_settings("127.0.0.1:9"), stop=stop).publish_available().read == 0
        assert relay_lock_holders() == []  # it did not even take the lead
        assert store.read_position("default") == start
    [row] = outbox_state()
    assert (row["published_at"], row["detoured_at"], row["attempts"]) == (None, None, 0)
