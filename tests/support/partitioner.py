"""Where the relay's producer puts a key: librdkafka's `murmur2_random`, the Java client's
partitioner (outbox/kafka.py, PARTITIONER), computed here as Kafka's Java client does
(org.apache.kafka.common.utils.Utils.murmur2, then toPositive, modulo the partitions), so that a
test can place keys on the partition it wants and check where each record went."""

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of `data` (seed 0x9747b28c), as an unsigned 32-bit value."""
    h = (0x9747B28C ^ len(data)) & _MASK
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
    """The partition the relay's producer (and a Java producer) chooses for `key`."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def keys_on(partition: int, partitions: int, count: int, prefix: str) -> list[str]:
    """`count` keys the relay's producer puts on `partition` of a topic of `partitions`."""
    found = (f"{prefix}-{n}" for n in range(100_000))
    return [k for k in found if partition_of(k, partitions) == partition][:count]
