"""Which partition a keyed message lands on, under librdkafka's `consistent_random` (CRC-32,
its default) and `murmur2_random` (the Java client's): tests pick keys both put on the same
partition, so that they hold whichever partitioner the producer is configured with."""

import zlib

MURMUR2_SEED = 0x9747B28C
MURMUR2_M = 0x5BD1E995
MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2), as an unsigned 32 bits."""
    h = (MURMUR2_SEED ^ len(data)) & MASK
    whole = len(data) - len(data) % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * MURMUR2_M) & MASK
        k ^= k >> 24
        k = (k * MURMUR2_M) & MASK
        h = ((h * MURMUR2_M) & MASK) ^ k
    tail = data[whole:]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * MURMUR2_M) & MASK
    h ^= h >> 13
    h = (h * MURMUR2_M) & MASK
    return h ^ (h >> 15)


def crc32_partition(key: str, partitions: int) -> int:
    return zlib.crc32(key.encode()) % partitions


def murmur2_partition(key: str, partitions: int) -> int:
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def partition_of(key: str, partitions: int) -> int:
    """The partition of a key `keys_on` picked (both partitioners agree on it)."""
    return crc32_partition(key, partitions)


def keys_on(partition: int, partitions: int, count: int, prefix: str) -> list[str]:
    """`count` keys that both partitioners put on `partition`."""
    found = (f"{prefix}-{n}" for n in range(100_000))
    return [k for k in found if crc32_partition(k, partitions) == partition
            == murmur2_partition(k, partitions)][:count]
