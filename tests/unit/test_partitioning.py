"""Where a key goes, and whether its partition looks able to take a record
(outbox/topic_watch.py; docs/outbox-relay.md, "One partition's outage")."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox.topic_watch import murmur2, partition_of, partition_problem


def signed(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value


@pytest.mark.parametrize(("data", "java"), [
    # org.apache.kafka.common.utils.UtilsTest.testMurmur2: the Java client's own values.
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
])
def test_murmur2_is_the_java_clients(data: bytes, java: int) -> None:
    assert signed(murmur2(data)) == java


@given(st.text(max_size=40), st.integers(min_value=1, max_value=64))
def test_a_keys_partition_is_one_of_the_topics(key: str, partitions: int) -> None:
    assert 0 <= partition_of(key, partitions) < partitions
    assert partition_of(key, partitions) == (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


@pytest.mark.parametrize(("leader", "isrs", "min_insync", "problem"), [
    (1, [1, 2, 3], 2, None),
    (1, [1, 2], 2, None),
    (-1, [1, 2, 3], 2, "no leader"),
    (-1, [], None, "no leader"),
    (1, [1], 2, "1 in-sync replica(s), min.insync.replicas=2"),
    (1, [1, 1, 1], 2, None),  # as the broker lists them: Tansu's one broker, and it takes it
    (1, [1], None, None),  # the configuration unreadable: the leader alone is judged
    (1, [1], 1, None),
])
def test_a_partition_looks_able_with_a_leader_and_enough_in_sync_replicas(
    leader: int, isrs: list[int], min_insync: int | None, problem: str | None,
) -> None:
    assert partition_problem(leader, isrs, min_insync) == problem
