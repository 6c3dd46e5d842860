"""Where the relay's producer puts a key (outbox.topic_watch: librdkafka's `murmur2_random`,
the Java client's partitioner, checked against the Java client's own values in
tests/unit/test_partitioning.py), and keys a test can place on the partition it wants."""

from outbox.topic_watch import murmur2, partition_of

__all__ = ["keys_on", "keys_on_every_partition", "murmur2", "partition_of"]


def keys_on(partition: int, partitions: int, count: int, prefix: str) -> list[str]:
    """`count` keys the relay's producer puts on `partition` of a topic of `partitions`."""
    found = (f"{prefix}-{n}" for n in range(100_000))
    return [k for k in found if partition_of(k, partitions) == partition][:count]


def keys_on_every_partition(partitions: int, count: int, prefix: str) -> list[str]:
    """`count` keys for each partition of a topic of `partitions`, the partitions in turn."""
    groups = [keys_on(p, partitions, count, prefix) for p in range(partitions)]
    return [k for group in zip(*groups, strict=True) for k in group]
