"""The development cluster itself (devtools/kafka_cluster.py, scripts/kafka.sh): three brokers,
production's topic defaults, SCRAM over TLS, ACLs enforced; a node killed and restarted."""

import signal
import subprocess
import sys

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from devtools.kafka_cluster import ROOT, KafkaCluster
from tests.support.kafka_support import TopicMaker


def test_three_brokers_with_production_topic_defaults(kafka_cluster: KafkaCluster,
                                                      real_topic: TopicMaker) -> None:
    topic = real_topic()
    admin = AdminClient(kafka_cluster.client_config())
    metadata = admin.list_topics(topic, timeout=10)
    assert sorted(metadata.brokers) == [1, 2, 3]
    partitions = metadata.topics[topic].partitions
    assert len(partitions) == 6
    assert all(sorted(p.replicas) == [1, 2, 3] for p in partitions.values())
    config = admin.describe_configs([ConfigResource("topic", topic)])
    entries = next(iter(config.values())).result(timeout=10)
    assert entries["min.insync.replicas"].value == "2"
    assert entries["unclean.leader.election.enable"].value == "false"


def test_scram_over_tls_logs_in_and_acls_are_enforced(kafka_cluster: KafkaCluster,
                                                      real_topic: TopicMaker) -> None:
    topic = real_topic()
    # The super user lists the brokers' SASL_SSL addresses.
    admin = AdminClient(kafka_cluster.client_config("admin"))
    assert sorted(admin.list_topics(timeout=15).brokers) == [1, 2, 3]
    # The relay's principal, with no ACL, may not write.
    errors: list[KafkaError | None] = []
    producer = Producer({**kafka_cluster.client_config("pin_outbox_relay"), "acks": "all"})
    producer.produce(topic, b"v", b"k", on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(30)
    assert [e.code() if e else None for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]


def test_a_killed_node_restarts_and_rejoins(own_kafka_cluster: KafkaCluster) -> None:
    own_kafka_cluster.signal_node(2, signal.SIGKILL)
    assert not own_kafka_cluster.running(2)
    own_kafka_cluster.start_node(2)
    assert own_kafka_cluster.registered_brokers() == {1, 2, 3}


def test_script_status_names_a_missing_cluster() -> None:
    done = subprocess.run([sys.executable, "-m", "devtools.kafka_cluster", "status",
                           "--dir", "/nonexistent/pin-kafka"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "no cluster in /nonexistent/pin-kafka" in done.stderr
