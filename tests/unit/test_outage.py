"""OutageLog: a Kafka outage as the first failure, a summary per interval, and the recovery;
librdkafka's own lines for the same failures left out; and PartitionOutages, one such log per
partition that could not take rows while the others did."""

import logging
from typing import Any

import pytest

from outbox.kafka import (
    FAILING,
    PARTITION_FAILING,
    PARTITION_RESTORED,
    PARTITION_STILL_FAILING,
    RESTORED,
    STILL_FAILING,
    LibrdkafkaLog,
    OutageLog,
    PartitionOutages,
)

Line = tuple[int, str, dict[str, Any]]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def outage_log(interval_s: float = 60.0) -> tuple[OutageLog, list[Line], FakeClock]:
    lines: list[Line] = []
    clock = FakeClock()
    log = OutageLog(lambda level, event, fields: lines.append((level, event, fields)),
                    interval_s=interval_s, clock=clock)
    return log, lines, clock


def events(lines: list[Line]) -> list[str]:
    return [event for _, event, _ in lines]


def test_the_first_failure_is_said_at_once() -> None:
    log, lines, _ = outage_log()
    log.failed("_TRANSPORT: 127.0.0.1:9/bootstrap: Connect failed")
    assert lines == [(30, FAILING, {"error": "_TRANSPORT: 127.0.0.1:9/bootstrap: Connect failed",
                                    "repeats": 0, "failing_for_s": 0.0})]
    assert log.failing


def test_a_day_of_failures_twice_a_second_is_one_line_a_minute() -> None:
    log, lines, clock = outage_log(interval_s=60)
    for _ in range(2 * 86_400):
        log.failed("_ALL_BROKERS_DOWN: 1/1 brokers are down")
        clock.now += 0.5
    log.restored()
    assert events(lines) == [FAILING, *[STILL_FAILING] * 1_439, RESTORED]
    summary = lines[1][2]
    assert summary["repeats"] == 119 and summary["failing_for_s"] == 60.0
    assert lines[-1][2] == {"failing_for_s": 86_400.0, "failures": 2 * 86_400}
    assert lines[-1][0] == 20  # the recovery is news, not a warning


def test_a_summary_counts_the_repeats_and_the_released_messages_since_the_last_line() -> None:
    log, lines, clock = outage_log(interval_s=10)
    log.failed("a", released=3)
    for _ in range(4):
        clock.now += 3
        log.failed("b", released=2)
    assert events(lines) == [FAILING, STILL_FAILING]
    assert lines[0][2]["released"] == 3
    assert lines[1][2] == {"error": "b", "repeats": 3, "failing_for_s": 12.0, "released": 8}


def test_restored_without_an_outage_says_nothing() -> None:
    log, lines, _ = outage_log()
    log.restored()
    assert lines == [] and not log.failing


def test_a_flapping_connection_is_at_most_one_failure_and_one_recovery_line_per_interval() -> None:
    # One broker of several unreachable while the others deliver: fail, recover, fail, ...
    log, lines, clock = outage_log(interval_s=60)
    for _ in range(600):  # 10 minutes, a failure and a recovery every second
        log.failed("_TRANSPORT: dead:9092/bootstrap: Connect failed")
        clock.now += 0.5
        log.restored()
        clock.now += 0.5
    assert events(lines) == [FAILING, RESTORED] * 10
    assert [f["repeats"] for _, e, f in lines if e == FAILING] == [0] + [59] * 9


def test_an_outage_after_a_quiet_interval_is_said_at_once_again() -> None:
    log, lines, clock = outage_log(interval_s=60)
    log.failed("a")
    log.restored()
    clock.now += 61
    log.failed("b")
    assert events(lines) == [FAILING, RESTORED, FAILING]
    assert lines[-1][2] == {"error": "b", "repeats": 0, "failing_for_s": 0.0}


def test_librdkafka_lines_the_relay_reports_itself_are_not_logged_twice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = LibrdkafkaLog(["s3cret"])
    fmt = "%s [%s] %s"
    with caplog.at_level(logging.DEBUG, logger="outbox.kafka"):
        log.log(logging.ERROR, fmt, "FAIL", "relay-1#producer-1", "k:9092/1: Connect failed: refused")
        log.log(logging.ERROR, fmt, "ERROR", "relay-1#producer-1", "k:9092/1: 1/1 brokers are down")
        log.log(logging.CRITICAL, fmt, "FATAL", "relay-1#producer-1", "Fatal error: Unknown Producer Id")
        log.log(logging.WARNING, fmt, "CONFWARN", "relay-1#producer-1", "property x is s3cret")
    assert [r.getMessage() for r in caplog.records] == [
        "CONFWARN [relay-1#producer-1] property x is ***"]


# --- one partition's outage -----------------------------------------------------------------


def partition_outages() -> tuple[PartitionOutages, list[Line], FakeClock]:
    lines: list[Line] = []
    clock = FakeClock()
    outages = PartitionOutages(lambda level, event, fields: lines.append((level, event, fields)),
                               interval_s=60.0, clock=clock)
    return outages, lines, clock


def test_a_partitions_outage_counts_its_failed_batches_and_says_it_with_its_topic_and_number(
) -> None:
    outages, lines, clock = partition_outages()

    assert outages.failed(("t", 0), ["a", "b"], "_MSG_TIMED_OUT") == 1
    clock.now += 10
    assert outages.failed(("t", 0), ["c"], "_MSG_TIMED_OUT") == 2
    assert outages.failed(("t", 3), ["d"], "NOT_ENOUGH_REPLICAS") == 1  # a log of its own
    clock.now += 60
    assert outages.failed(("t", 0), ["a"], "_MSG_TIMED_OUT") == 3

    assert outages.down == {("t", 0), ("t", 3)}
    assert lines == [
        (logging.WARNING, PARTITION_FAILING, {"topic": "t", "partition": 0,
         "error": "_MSG_TIMED_OUT", "repeats": 0, "failing_for_s": 0.0, "deferred": 2}),
        (logging.WARNING, PARTITION_FAILING, {"topic": "t", "partition": 3,
         "error": "NOT_ENOUGH_REPLICAS", "repeats": 0, "failing_for_s": 0.0, "deferred": 1}),
        (logging.WARNING, PARTITION_STILL_FAILING, {"topic": "t", "partition": 0,
         "error": "_MSG_TIMED_OUT", "repeats": 1, "failing_for_s": 70.0, "deferred": 2}),
    ]


def test_a_deferred_keys_delivery_says_its_partition_is_back_and_a_later_outage_starts_afresh(
) -> None:
    outages, lines, clock = partition_outages()
    outages.failed(("t", 0), ["a", "b"], "_MSG_TIMED_OUT")
    outages.failed(("t", 1), ["c"], "_MSG_TIMED_OUT")
    clock.now += 5

    assert outages.delivered(["x"]) == set()  # never deferred: says nothing
    assert outages.delivered(["a"]) == {("t", 0)}
    assert outages.down == {("t", 1)}
    assert lines[-1] == (logging.INFO, PARTITION_RESTORED, {
        "topic": "t", "partition": 0, "failing_for_s": 5.0, "failures": 1})
    assert outages.delivered(["b"]) == set()  # its partition is already back
    clock.now += 120
    assert outages.failed(("t", 0), ["e"], "_MSG_TIMED_OUT") == 1
    assert lines[-1][1] == PARTITION_FAILING


def test_a_partition_back_makes_its_other_deferred_keys_due_once_and_no_other_partitions(
) -> None:
    outages, _lines, _clock = partition_outages()
    outages.failed(("t", 0), ["a", "b", "c"], "_MSG_TIMED_OUT")
    outages.failed(("t", 1), ["d"], "_MSG_TIMED_OUT")

    assert outages.take_due() == []
    outages.delivered(["a"])
    assert sorted(outages.take_due()) == ["b", "c"]  # not "a" (delivered), not "d" (still down)
    assert outages.take_due() == []  # taken: once


def test_the_metadata_showing_a_partition_able_again_ends_its_outage_as_a_delivery_does() -> None:
    outages, lines, _clock = partition_outages()
    outages.failed(("t", 0), ["a", "b"], "LEADER_NOT_AVAILABLE")

    assert outages.ready("t", 1) is False  # not in an outage: nothing to say
    assert outages.ready("t", 0) is True
    assert outages.down == set() and sorted(outages.take_due()) == ["a", "b"]
    assert lines[-1][1] == PARTITION_RESTORED
    assert outages.ready("t", 0) is False
