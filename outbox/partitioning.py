"""Where a key goes, and whether its partition can take a record now (docs/outbox-relay.md,
"One partition's outage"): pure rules, no I/O.

The producer's partitioner is librdkafka's `murmur2_random` (a guarded property,
outbox/kafka.py), the Java client's: murmur2 of the key's UTF-8 bytes, made positive, modulo the
partition count. So the relay knows a row's partition from its key and the topic's metadata,
without storing it."""

from collections.abc import Sequence

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_SEED = 0x9747B28C


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of `data` (org.apache.kafka.common.utils.Utils.murmur2), unsigned 32-bit."""
    h = (_SEED ^ len(data)) & _MASK
    tail = len(data) - len(data) % 4
    for i in range(0, tail, 4):
        k = (int.from_bytes(data[i:i + 4], "little") * _M) & _MASK
        k ^= k >> 24
        h = ((h * _M) & _MASK) ^ ((k * _M) & _MASK)
    rest = data[tail:]
    if len(rest) == 3:
        h ^= rest[2] << 16
    if len(rest) >= 2:
        h ^= rest[1] << 8
    if rest:
        h = ((h ^ rest[0]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


def partition_of(key: str, partitions: int) -> int:
    """The partition the relay's producer chooses for `key` on a topic of `partitions`."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def partition_problem(leader: int, isrs: Sequence[int], min_insync: int | None) -> str | None:
    """Why a partition cannot take a record now, by its metadata; None if it looks able to.
    No leader: librdkafka would hold the record until the delivery timeout. Fewer in-sync
    replicas than `min.insync.replicas` (None: not known, the configuration unreadable): the
    broker would refuse it, or append it and answer NOT_ENOUGH_REPLICAS_AFTER_APPEND (a copy
    on the topic that the relay counts as not delivered). The in-sync replicas are counted as
    the broker lists them, as it counts them itself (Tansu names its one broker three times and
    takes the write; durability counts distinct brokers instead: topic.replicas_of)."""
    if leader < 0:
        return "no leader"
    in_sync = len(isrs)
    if min_insync is not None and in_sync < min_insync:
        return f"{in_sync} in-sync replica(s), min.insync.replicas={min_insync}"
    return None
