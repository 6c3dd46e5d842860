"""The topics the relay publishes to (docs/outbox-relay.md, "A topic that keeps what it
acknowledged"). Before its first batch to a topic, and again every LOOK_AGAIN_S while it leads,
the relay reads the topic's metadata (partitions, replicas) and configuration (the admin API's
DescribeConfigs), and:

- refuses to publish to a topic that may lose a record it acknowledged (`durability_problem`:
  `min.insync.replicas` below 2, or unclean leader election on): UndurableTopicError, exit 4,
  unless OUTBOX_ALLOW_UNDURABLE_TOPIC allows it (a single-broker development setup);
- where the configuration cannot be read (no DescribeConfigs right, a broker without the API),
  says so once and exports it (durability "unverified"), and publishes;
- records the partition count (outbox_topics) and says so loudly when it changed: a key's
  partition is its hash modulo the count, so order per key does not hold across the change;
- keeps which partitions cannot take a record now (no leader, fewer in-sync replicas than
  `min.insync.replicas`, or one that answered NOT_ENOUGH_REPLICAS_AFTER_APPEND since the last
  look): a row bound for one is not sent, it is deferred at once ("One partition's outage"),
  and the metadata is read again every LOOK_UNREADY_S until the partition looks able again;
- keeps the partitions that did not answer in time (their rows timed out in the client while
  the rest of their batch was delivered) the same way, until a row of theirs is acknowledged
  within the delivery timeout (the patient producer's probe, outbox.producer) or a look shows
  another leader;
- and, from the first such time-out, every partition whose acknowledgement waits on a broker
  the late one waited on (`LateBrokers`): its leader, or an in-sync follower (acks=all), so
  that a slow broker costs the other partitions one delivery timeout, not one per partition it
  holds up.

Where a key goes is known without storing it: the producer's partitioner is librdkafka's
`murmur2_random` (a guarded property, outbox.kafka), the Java client's: murmur2 of the key's UTF-8
bytes, made positive, modulo the partition count (`partition_of`).
"""

import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec

from core.config import ConfigError
from outbox import kafka, metrics, store
from outbox.config import ALLOW_UNDURABLE_VAR, Emit, RelaySettings
from outbox.kafka import describe, redact

# --- where a key goes, and whether its partition can take a record now (pure) --------------------
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
    takes the write; durability counts distinct brokers instead: replicas_of)."""
    if leader < 0:
        return "no leader"
    in_sync = len(isrs)
    if min_insync is not None and in_sync < min_insync:
        return f"{in_sync} in-sync replica(s), min.insync.replicas={min_insync}"
    return None


# --- the brokers a late partition waited on (pure) ----------------------------------------------

@dataclass(frozen=True, slots=True)
class Replicas:
    """Whom a partition's acknowledgement waits for (acks=all): its leader and its in-sync
    followers, as the last look saw them."""

    leader: int
    followers: frozenset[int]


class LateBrokers:
    """The brokers suspected of holding up a partition that did not answer in time
    (docs/outbox-relay.md, "A slow leader"). A late partition's leader is suspected as a leader
    and its followers as followers, less those a partition acknowledged in the same batch vouches
    for (its leader answered as a leader, its followers as followers: acks=all waited for them).
    A partition waits on a suspect when its leader is suspected as a leader or one of its
    followers as a follower, and it is kept back then: a broker stopped costs the partitions it
    leads or follows one delivery timeout, not one each. A broker reachable by the cluster but
    not by the relay is vouched for as a follower by the first partition it follows that answers
    in time, and keeps back only the partitions it leads."""

    def __init__(self) -> None:
        self.as_leader: set[int] = set()
        self.as_follower: set[int] = set()

    def __bool__(self) -> bool:
        return bool(self.as_leader or self.as_follower)

    def late(self, late: Iterable[Replicas], answered: Iterable[Replicas] = ()) -> None:
        """Partitions whose rows timed out (`late`) beside ones acknowledged (`answered`)."""
        for replicas in late:
            brokers = {replicas.leader, *replicas.followers} - {-1}
            self.as_leader |= brokers
            self.as_follower |= brokers
        self.vouch(answered)

    def vouch(self, answered: Iterable[Replicas]) -> None:
        """Partitions acknowledged within the delivery timeout: their brokers answered."""
        for replicas in answered:
            self.as_leader.discard(replicas.leader)
            self.as_follower -= replicas.followers

    def waited_on(self, replicas: Replicas) -> int | None:
        """The suspect the partition waits on, if any."""
        if replicas.leader in self.as_leader:
            return replicas.leader
        return min(replicas.followers & self.as_follower, default=None)

    def forget_all_but(self, present: set[int]) -> None:
        """A look: a suspect the cluster took out of every partition's replicas (fenced, out of
        the in-sync replicas) holds nothing up; when it rejoins it has caught up."""
        self.as_leader &= present
        self.as_follower &= present


# --- the watch ------------------------------------------------------------------------------------
MIN_INSYNC = "min.insync.replicas"
UNCLEAN = "unclean.leader.election.enable"
# Kafka's own defaults, for a broker that reports only what was set on the topic (Tansu).
KAFKA_DEFAULTS = {MIN_INSYNC: "1", UNCLEAN: "false"}
# The first look at a topic (a new admin connection: TLS, SASL); then, while its metadata could
# not be read, each batch's look waits this much at most (none while the producer finds Kafka
# failing).
FIRST_LOOK_TIMEOUT_S = 10.0
RETRY_LOOK_TIMEOUT_S = 1.0
# While leading, the relay looks at its topics again this often (a partition added, a
# configuration changed); librdkafka's own metadata refresh is every 5 minutes.
LOOK_AGAIN_S = 30.0
# ... and this often while a partition cannot take records: its rows are not sent meanwhile.
LOOK_UNREADY_S = 5.0
# The errors of a principal that may not describe the topic's configuration.
NOT_ALLOWED = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED,
                         KafkaError.CLUSTER_AUTHORIZATION_FAILED})


class UndurableTopicError(ConfigError):
    """The topic may lose what it acknowledges: the relay refuses to publish to it (exit 4,
    one line naming the topic's setting and the fix)."""

    def __init__(self, topic: str, problem: str) -> None:
        super().__init__(f"topic {topic}", problem)


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """What a topic's durability depends on, as the broker reports it."""

    topic: str
    partitions: int
    replicas: int  # distinct brokers holding the least replicated partition
    min_insync_replicas: int
    unclean_leader_election: bool


def topic_config(topic: str, partitions: int, replicas: int,
                 entries: Mapping[str, str | None]) -> TopicConfig:
    """A topic's configuration from DescribeConfigs' entries; a setting not reported is
    Kafka's default (KAFKA_DEFAULTS)."""

    def value(name: str) -> str:
        reported = entries.get(name)
        return (reported if reported is not None else KAFKA_DEFAULTS[name]).strip().lower()

    return TopicConfig(topic, partitions, replicas, int(value(MIN_INSYNC)),
                       value(UNCLEAN) == "true")


def durability_problem(config: TopicConfig) -> str | None:
    """Why the topic may lose a record the relay saw acknowledged (acks=all), with the fix, in
    one line; None if it keeps them. acks=all waits for the in-sync replicas, which may shrink
    to `min.insync.replicas`: below 2, one broker's copy is an acknowledgement, and that
    broker's loss loses it; an unclean leader election truncates what the new leader missed.
    The replication factor alone decides nothing: with min.insync.replicas 2 and one replica,
    the broker refuses every write (nothing is acknowledged, nothing lost)."""
    alter = (f"kafka-configs.sh --alter --entity-type topics --entity-name {config.topic} "
             f"--add-config")
    dev = f"; on a single-broker development setup only, {ALLOW_UNDURABLE_VAR}=on publishes anyway"
    if config.unclean_leader_election:
        return (f"{UNCLEAN}=true: a replica that missed acknowledged records may become leader "
                f"and drop them; set it to false ({alter} {UNCLEAN}=false){dev}")
    if config.min_insync_replicas < 2:
        return (f"{MIN_INSYNC}={config.min_insync_replicas} (replicas: {config.replicas}): "
                f"one broker's copy counts as acknowledged, and that broker's loss loses it; "
                f"replicate the topic 3 times and set {MIN_INSYNC}=2 "
                f"({alter} {MIN_INSYNC}=2){dev}")
    return None


def replicas_of(partitions: Mapping[int, Any]) -> int:
    """Distinct brokers of the least replicated partition (a broker named twice is one copy)."""
    return min((len(set(p.replicas)) for p in partitions.values()), default=0)


# What the watch says of a topic's durability, by its state (the metric's label).
DURABILITY_LINES = {"verified": (logging.INFO, "topic keeps what it acknowledges"),
                    "unverified": (logging.WARNING, "topic durability unverified"),
                    "allowed": (logging.WARNING, "topic may lose acknowledged records, allowed by "
                                                 "OUTBOX_ALLOW_UNDURABLE_TOPIC")}

# A row not sent: its partition and the error its deferral records, by key.
Unsendable = dict[str, tuple[int, KafkaError]]
# A broker suspected of holding partitions up is forgotten this long after it was first suspected
# (the next look), whether or not a partition that waits on it answered in time: a probe that
# cannot be answered (a producer the broker forgot) does not keep them back for good, and a broker
# still slow is suspected again at its partitions' next time-out.
LATE_FOR_S = 30.0


def any_answers(futures: Mapping[Any, Future[Any]], timeout: float) -> bool:
    """Whether one of the admin client's `futures` comes back with an answer within `timeout`."""
    pending = set(futures.values())
    deadline = time.monotonic() + timeout
    while pending and (left := deadline - time.monotonic()) > 0:
        done, pending = wait(pending, timeout=left, return_when=FIRST_COMPLETED)
        if any(f.exception() is None for f in done):
            return True
    return False


class KeptBack:
    """The partitions whose rows are not sent now, by topic, and why: the metadata shows them
    unable (`unready`, from the last look that read it), they did not answer in time (`slow`:
    until they do, or a look shows another leader), or they wait on a broker a late partition
    waited on (`late`: until it is vouched for, forgotten by a look, or LATE_FOR_S). A partition
    that was kept back and no longer is goes to `on_ready` (True if it was in an outage)."""

    def __init__(self, on_ready: Callable[[str, int], bool], clock: Callable[[], float]) -> None:
        self.on_ready = on_ready
        self._clock = clock
        self.unready: dict[str, dict[int, KafkaError]] = {}
        # The leader the last look had seen for each slow partition then, and the error a row
        # kept back records. Not forgotten by a look (the metadata says nothing of time).
        self.slow: dict[str, dict[int, tuple[int, KafkaError]]] = {}
        self.leaders: dict[str, dict[int, int]] = {}  # by topic, as the last look saw them
        self.replicas: dict[str, dict[int, Replicas]] = {}  # the same, with in-sync followers
        self.late = LateBrokers()
        self._late_since = 0.0

    def __bool__(self) -> bool:
        return any(self.unready.values()) or any(self.slow.values()) or bool(self.late)

    def error_for(self, topic: str, partition: int) -> KafkaError | None:
        """Why a row of the partition is not sent now; None if it is."""
        unready, slow = self.unready.get(topic), self.slow.get(topic)
        error = unready.get(partition) if unready else None
        if error is None and slow and partition in slow:
            error = slow[partition][1]
        if error is None and self.late:
            replicas = self.replicas.get(topic, {}).get(partition)
            broker = None if replicas is None else self.late.waited_on(replicas)
            if broker is not None:
                error = KafkaError(
                    KafkaError._MSG_TIMED_OUT,
                    f"not sent: the partition waits on broker {broker}, which did not answer in "
                    "time for another partition; kept back until a partition that waits on it "
                    "is acknowledged within the delivery timeout")
        return error

    def partitions_late(self, topic: str, late: Iterable[int], answered: Iterable[int]) -> None:
        """See TopicWatch.partitions_late."""
        late = [p for p in late if p >= 0]
        leaders, replicas = self.leaders.get(topic, {}), self.replicas.get(topic, {})
        for partition in late:
            self.slow.setdefault(topic, {})[partition] = (leaders.get(partition, -1), KafkaError(
                KafkaError._MSG_TIMED_OUT,
                "not sent: the partition's records timed out while the cluster answered; "
                "kept back until one is acknowledged within the delivery timeout"))
        before = self._kept_back_by_late()
        if not self.late:
            self._late_since = self._clock()
        self.late.late((replicas[p] for p in late if p in replicas),
                       (replicas[p] for p in answered if p in replicas))
        self._released(before)

    def answered_in_time(self, topic: str, partition: int) -> None:
        """See TopicWatch.answered_in_time."""
        if self.slow.get(topic, {}).pop(partition, None) is not None:
            self._back(topic, partition)
        if self.late and partition in self.replicas.get(topic, {}):
            before = self._kept_back_by_late()
            self.late.vouch([self.replicas[topic][partition]])
            self._released(before)

    def fell_short(self, topic: str, partition: int) -> None:
        """The partition answered NOT_ENOUGH_REPLICAS_AFTER_APPEND: unable until a look."""
        self.unready.setdefault(topic, {})[partition] = KafkaError(
            KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            "not sent: the partition answered that its in-sync replicas fell short after an "
            "append; held until the metadata shows them back")

    def seen(self, topic: str, partitions: Mapping[int, Any],
             unready: dict[int, KafkaError]) -> None:
        """A look read the topic's metadata: `unready` are unable now; whom each partition
        waits for (a suspect in none, or suspected for LATE_FOR_S, is forgotten); a slow one
        with another leader is not slow any more."""
        before, late_before = self.unready.get(topic, {}), self._kept_back_by_late()
        self.unready[topic] = unready
        self.leaders[topic] = {n: p.leader for n, p in partitions.items()}
        self.replicas[topic] = {n: Replicas(p.leader, frozenset(p.isrs) - {p.leader})
                                for n, p in partitions.items()}
        if self.late and self._clock() - self._late_since >= LATE_FOR_S:
            self.late = LateBrokers()
        self.late.forget_all_but({b for by_number in self.replicas.values()
                                  for r in by_number.values() for b in (r.leader, *r.followers)})
        slow = self.slow.get(topic, {})
        for number, (leader, _error) in list(slow.items()):
            if self.leaders[topic].get(number, -1) not in (leader, -1):
                del slow[number]  # another leader: it may well answer in time
                late_before.add((topic, number))
        late_before |= {(topic, n) for n in before}
        self._released(late_before)

    def sends_to_some(self, topic: str, count: int) -> bool:
        """Some of the topic's `count` partitions is not kept back now."""
        return any(self.error_for(topic, p) is None for p in range(count))

    def _kept_back_by_late(self) -> set[tuple[str, int]]:
        if not self.late:
            return set()
        return {(topic, number) for topic, partitions in self.replicas.items()
                for number, replicas in partitions.items() if self.late.waited_on(replicas)}

    def _released(self, before: set[tuple[str, int]]) -> None:
        """Of the partitions kept back `before`, those kept back no longer are ready."""
        for topic, number in sorted(before):
            if self.error_for(topic, number) is None:
                self._back(topic, number)

    def _back(self, topic: str, partition: int) -> None:
        if self.on_ready(topic, partition):
            metrics.set_partition_available(topic, partition)


class TopicWatch:
    """The relay's look at the topics it publishes to: `admit` before each batch (a topic's
    first batch waits for its look; rows its partitions cannot take now are not sent),
    `look_again_if_due` between batches while leading."""

    def __init__(self, settings: RelaySettings, using: str, *, client_id: str, emit: Emit,
                 admin: Callable[[], Any] | None = None, look_again_s: float = LOOK_AGAIN_S,
                 look_unready_s: float = LOOK_UNREADY_S,
                 kafka_failing: Callable[[], bool] = lambda: False,
                 on_ready: Callable[[str, int], bool] = lambda _topic, _partition: False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.using = using
        self.look_again_s = look_again_s
        self.look_unready_s = look_unready_s
        self._emit = emit
        self._new_admin = admin or (lambda: AdminClient(kafka.admin_config(settings, client_id)))
        self._admin: Any = None
        self._clock = clock
        self._kafka_failing = kafka_failing  # the producer's outage: no look then
        self._admitted: set[str] = set()  # looked at: checked, or its configuration unreadable
        self._partitions: dict[str, int] = {}  # as last recorded
        self._durability: dict[str, str] = {}  # the state said for each topic
        self._tried: set[str] = set()  # topics whose metadata a look already waited for
        self._next_look = 0.0
        self._last_look = 0.0
        # What is not sent now; a partition able again goes to `on_ready` (KeptBack).
        self.kept = KeptBack(on_ready, clock)

    def admit(self, messages: Sequence[Any]) -> Unsendable:
        """Before a batch goes to the producer: look at each of its topics not looked at yet;
        raises UndurableTopicError for one that may lose what it acknowledges. A topic whose
        metadata cannot be read now (unreachable, not created yet) is looked at again at the
        next batch: its deliveries fail meanwhile, so nothing of it is acknowledged unchecked.
        Returns the rows not to send (`unsendable`)."""
        topics = {m.topic for m in messages}
        for topic in sorted(topics - self._admitted):
            if self._kafka_failing():
                continue  # the batch's deliveries fail too: a look would only slow the outage
            timeout = RETRY_LOOK_TIMEOUT_S if topic in self._tried else FIRST_LOOK_TIMEOUT_S
            self._tried.add(topic)
            if self._look(topic, timeout):
                self._admitted.add(topic)
        if self._next_look == 0.0:
            self._next_look = self._clock() + self._look_interval()
        return self.unsendable(messages) if self.kept else {}

    @property
    def holding_back(self) -> bool:
        """Some partition's rows are not sent now (a look, or an answer in time, lifts them)."""
        return bool(self.kept)

    @property
    def suspecting(self) -> bool:  # a broker suspected of holding up a late partition
        return bool(self.kept.late)

    def _look_interval(self) -> float:
        """Until the next look: sooner while a partition cannot take records."""
        return self.look_unready_s if self.holding_back else self.look_again_s

    def unsendable(self, messages: Sequence[Any]) -> Unsendable:
        """The rows of `messages` bound for a partition kept back now (its partition from the
        key, as the producer's murmur2 partitioner computes it): not sent, so no copy can come
        of them, and no delivery timeout is waited for."""
        found: Unsendable = {}
        for message in messages:
            count = self._partitions.get(message.topic)
            if not count:
                continue
            partition = partition_of(message.key, count)
            error = self.kept.error_for(message.topic, partition)
            if error is not None:
                found[message.key] = (partition, error)
        return found

    def others_answer(self, topic: str, late: Collection[int], timeout: float) -> bool | None:
        """Whether a leader of none of the `late` partitions answers a ListOffsets request sent
        to it (a metadata request goes to the broker the client used last, often the one that
        does not answer); None if no other leader is known (the caller asks otherwise)."""
        leaders = self.kept.leaders.get(topic, {})
        suspects = {leaders.get(p, -1) for p in late}
        asked: dict[int, int] = {}
        for number, leader in sorted(leaders.items()):
            if leader >= 0 and leader not in suspects:
                asked.setdefault(leader, number)
        if not asked:
            return None
        try:
            return any_answers(self._client().list_offsets(
                {TopicPartition(topic, number): OffsetSpec.latest() for number in asked.values()},
                request_timeout=timeout), timeout)
        except KafkaException:
            return False

    def sends_to_some(self, topic: str) -> bool:
        """Some partition of `topic` is not kept back now (the metadata, a time-out, a late
        broker): a row kept back is then its partition's trouble, not the cluster's."""
        count = self._partitions.get(topic)
        return bool(count) and self.kept.sends_to_some(topic, count or 0)

    def partition_of(self, topic: str, key: str) -> int:
        """The partition the producer puts `key` on (-1 before a look read the topic)."""
        count = self._partitions.get(topic)
        return partition_of(key, count) if count else -1

    def partitions_late(self, topic: str, late: Iterable[int],
                        answered: Iterable[int] = ()) -> None:
        """Rows of the `late` partitions timed out in the client while the cluster answered
        (rows of the `answered` ones were acknowledged in the same batch, or another broker
        answered): each is kept back like an unable one, one row at a time going as its probe
        (outbox.producer), until it answers in time again or a look shows another leader; and
        so is every partition that waits on a broker they waited on (`LateBrokers`), until that
        broker is vouched for (docs/outbox-relay.md, "A slow leader")."""
        if topic not in self._partitions:
            return
        self.kept.partitions_late(topic, late, answered)
        self._next_look = min(self._next_look, self._clock() + self.look_unready_s)

    def answered_in_time(self, topic: str, partition: int) -> None:
        """A row of the partition was acknowledged within the delivery timeout: if it was kept
        back as slow, it is able again (its deferred rows are due at once); the brokers it
        waited on are vouched for."""
        self.kept.answered_in_time(topic, partition)

    def partition_failed(self, topic: str, partition: int, error: KafkaError) -> None:
        """A delivery report's error (RelayProducer): NOT_ENOUGH_REPLICAS_AFTER_APPEND means the
        leader appended the record and the in-sync replicas fell short; nothing more is sent to
        that partition until a later look shows its in-sync replicas back, so a retry adds no
        copy meanwhile."""
        if (error.code() != KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND or partition < 0
                or topic not in self._partitions):
            return
        self.kept.fell_short(topic, partition)
        self._next_look = min(self._next_look, self._clock() + self.look_unready_s)

    def look_again_if_due(self) -> None:
        """Every `look_again_s`, and every `look_unready_s` while a partition is kept back or
        the producer finds Kafka failing: the topics' metadata and configuration again (a
        partition count that changed is said and recorded; a configuration that no longer keeps
        what it acknowledges raises UndurableTopicError; the partitions that cannot take a
        record now are kept back: a topic whose every partition is short of in-sync replicas is
        kept back whole, and the stream stops instead of waiting out a time-out per batch). A
        look at a Kafka that does not answer costs RETRY_LOOK_TIMEOUT_S."""
        now = self._clock()
        due = self._next_look
        if self._kafka_failing():
            due = min(due, self._last_look + self.look_unready_s)
        if not self._admitted or now < due:
            return
        for topic in sorted(self._admitted):
            self._look(topic, RETRY_LOOK_TIMEOUT_S)
        self._next_look = self._clock() + self._look_interval()

    def _look(self, topic: str, timeout: float) -> bool:
        """Read, record and check `topic`; False if its metadata could not be read."""
        self._last_look = self._clock()
        try:
            cluster = self._client().list_topics(topic, timeout=timeout)
        except KafkaException:
            self.kept.unready.pop(topic, None)  # not known now: its rows are sent as usual
            return False  # Kafka unreachable: the outage log says it
        found = cluster.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            self.kept.unready.pop(topic, None)
            return False  # not created yet, or being created
        self._record_partitions(topic, len(found.partitions))
        self._see_partitions(topic, found.partitions,
                             self._check_durability(topic, cluster, found, timeout))
        return True

    def _see_partitions(self, topic: str, partitions: Mapping[int, Any],
                        min_insync: int | None) -> None:
        """Which partitions of `topic` cannot take a record now, by their metadata
        (`partition_problem`), and whom each waits for (a suspect broker in none is forgotten);
        one that could not at the previous look and can now is said to `on_ready`."""
        unready: dict[int, KafkaError] = {}
        for number, partition in partitions.items():
            problem = partition_problem(partition.leader, partition.isrs, min_insync)
            if problem is not None:
                code = (KafkaError.LEADER_NOT_AVAILABLE if partition.leader < 0
                        else KafkaError.NOT_ENOUGH_REPLICAS)
                unready[number] = KafkaError(code, f"not sent: the metadata shows {problem}")
        self.kept.seen(topic, partitions, unready)

    def _check_durability(self, topic: str, cluster: Any, found: Any,
                          timeout: float) -> int | None:
        """Check the topic's configuration (UndurableTopicError if it may lose what it
        acknowledges); its `min.insync.replicas`, None where it could not be read."""
        partitions = len(found.partitions)
        if cluster.controller_id not in cluster.brokers:
            # DescribeConfigs goes to the controller; librdkafka's mock cluster names none.
            self._say_durability(topic, "unverified", {"reason": "the cluster names no controller"})
            return None
        try:
            entries = self._describe(topic, timeout)
        except KafkaException as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            reason = ("not allowed to describe the topic's configuration (DescribeConfigs)"
                      if error is not None and error.code() in NOT_ALLOWED
                      else redact(describe(error) if error else str(exc), self.settings))
            self._say_durability(topic, "unverified", {"reason": reason})
            return None
        config = topic_config(topic, partitions, replicas_of(found.partitions), entries)
        problem = durability_problem(config)
        fields = {"replicas": config.replicas, "min_insync_replicas": config.min_insync_replicas,
                  "unclean_leader_election": config.unclean_leader_election}
        if problem is None:
            self._say_durability(topic, "verified", fields)
        elif self.settings.allow_undurable_topic:
            self._say_durability(topic, "allowed", {**fields, "problem": problem})
        else:
            raise UndurableTopicError(topic, problem)
        return config.min_insync_replicas

    def _client(self) -> Any:
        if self._admin is None:
            self._admin = self._new_admin()
        return self._admin

    def _describe(self, topic: str, timeout: float) -> dict[str, str | None]:
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        future = self._client().describe_configs([resource], request_timeout=timeout)[resource]
        return {name: entry.value for name, entry in future.result().items()}

    def _record_partitions(self, topic: str, partitions: int) -> None:
        """Record the count (outbox_topics); a change from the one recorded, by this relay or
        another before it, is an ERROR line and a metric (and the alert
        OutboxTopicPartitionsChanged)."""
        if self._partitions.get(topic) == partitions:
            return
        recorded = store.record_topic_partitions(self.using, topic, partitions)
        self._partitions[topic] = partitions
        metrics.set_topic_partitions(topic, partitions, recorded.changed_at_s)
        if recorded.previous is not None:
            self._emit(logging.ERROR, "topic partition count changed", {
                "topic": topic, "partitions": partitions, "previous": recorded.previous,
                "consequence": "order per key does not hold across the change: a key's "
                               "records before it and after it may be on two partitions"})

    def _say_durability(self, topic: str, state: str, fields: dict[str, Any]) -> None:
        """The state's metric, and its line once (again only if the state changes)."""
        metrics.set_topic_durability(topic, state)
        if self._durability.get(topic) == state:
            return
        self._durability[topic] = state
        level, event = DURABILITY_LINES[state]
        self._emit(level, event, {"topic": topic, **fields})

    def close(self) -> None:
        self._admin = None  # confluent-kafka's AdminClient ends with its last reference
