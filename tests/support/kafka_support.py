"""The real-cluster tier: Apache Kafka itself, three KRaft nodes on loopback
(devtools/kafka_cluster.py), for the tests under tests/kafka.

`kafka_cluster` is one cluster for the whole pytest process. scripts/test.sh starts it in the
background while the linters run and names its directory in TEST_KAFKA_CLUSTER_DIR, so both
xdist workers share it; without that variable the fixture starts a cluster of its own and
removes it at the end. Either way a cluster that cannot start fails the test: no silent skip.
Tests share the cluster by topic: each takes a fresh one (`real_topic`), created as
production's should be (6 partitions, replication factor 3, min.insync.replicas=2, unclean
leader election off). A test that kills, stops or cuts off brokers takes `own_kafka_cluster`
instead, a cluster of its own for that test alone."""

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from devtools.kafka_cluster import KafkaCluster

SHARED_DIR_VAR = "TEST_KAFKA_CLUSTER_DIR"
DURABLE_TOPIC = {"min.insync.replicas": "2", "unclean.leader.election.enable": "false"}
PARTITIONS = 6


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """The real cluster of this pytest process (shared through TEST_KAFKA_CLUSTER_DIR)."""
    shared = os.environ.get(SHARED_DIR_VAR)
    if shared:
        cluster = KafkaCluster.load(Path(shared))
        cluster.wait_ready()
        yield cluster
        return
    cluster = KafkaCluster.create(tmp_path_factory.mktemp("kafka"))
    try:
        yield cluster.start()
    finally:
        cluster.remove()


@pytest.fixture
def own_kafka_cluster(tmp_path: Path) -> Iterator[KafkaCluster]:
    """A three-node cluster for this test alone (a fault test's brokers may be killed)."""
    cluster = KafkaCluster.create(tmp_path / "kafka")
    try:
        yield cluster.start()
    finally:
        cluster.remove()


TopicMaker = Callable[..., str]


def create_topic(cluster: KafkaCluster, name: str, *, partitions: int = PARTITIONS,
                 replication: int = 3, config: dict[str, str] | None = None) -> str:
    """Create `name` (durable by default) and wait until every partition has a leader."""
    admin = AdminClient(cluster.client_config())
    settings = {**DURABLE_TOPIC, **(config or {})}
    admin.create_topics([NewTopic(name, partitions, replication, config=settings)])[name].result(
        timeout=60)
    deadline_tries = 200
    for _ in range(deadline_tries):
        topic = admin.list_topics(name, timeout=5).topics.get(name)
        if (topic is not None and topic.error is None and len(topic.partitions) == partitions
                and all(p.leader >= 0 for p in topic.partitions.values())):
            return name
        # a condition with a bound, not a sleep: the metadata call itself waits
        admin.poll(0.05)
    raise AssertionError(f"topic {name}: partitions without a leader after creation")


@pytest.fixture
def real_topic(kafka_cluster: KafkaCluster) -> TopicMaker:
    """real_topic(**create_topic options) -> a fresh topic's name on the shared cluster."""

    def make(**options: object) -> str:
        name = f"pin.test.{uuid.uuid4().hex[:12]}"
        return create_topic(kafka_cluster, name, **options)  # type: ignore[arg-type]

    return make
