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
import secrets
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from django.db import connection

from devtools.kafka_cluster import SCRAM, KafkaCluster
from reminders import events
from tests.support.relay_support import wait_for

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
                 replication: int = 3, config: Mapping[str, str | None] | None = None) -> str:
    """Create `name` (durable by default; a setting given as None is not set on the topic, which
    then inherits the brokers') and wait until every broker's metadata gives each partition a
    leader: a broker behind on the metadata log would tell a reader the topic has none."""
    admin = AdminClient(cluster.client_config())
    settings = {k: v for k, v in {**DURABLE_TOPIC, **(config or {})}.items() if v is not None}
    admin.create_topics([NewTopic(name, partitions, replication, config=settings)])[name].result(
        timeout=60)
    for node in cluster.nodes:
        # bootstrapped on the one broker: its metadata request goes there
        one = AdminClient({"bootstrap.servers": f"127.0.0.1:{node.plaintext}"})
        wait_for(partial(_led, one, name, partitions), timeout=60,
                 what=f"broker {node.id} to give every partition of {name} a leader")
    return name


def _led(admin: AdminClient, name: str, partitions: int) -> bool:
    topic = admin.list_topics(name, timeout=5).topics.get(name)
    return (topic is not None and topic.error is None and len(topic.partitions) == partitions
            and all(p.leader >= 0 for p in topic.partitions.values()))


@pytest.fixture
def real_topic(kafka_cluster: KafkaCluster) -> TopicMaker:
    """real_topic(**create_topic options) -> a fresh topic's name on the shared cluster."""

    def make(**options: object) -> str:
        name = f"pin.test.{uuid.uuid4().hex[:12]}"
        return create_topic(kafka_cluster, name, **options)  # type: ignore[arg-type]

    return make


@contextmanager
def rows_sent_to(topic: str) -> Iterator[None]:
    """Within: the outbox's rows bound for `topic`. The worker writes the contract's topic,
    which every test of the shared cluster would share, so a test moves its rows to a fresh
    one, and back after (the `documents` fixture's contract check expects the contract's)."""

    def bound_for(name: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute("update outbox_messages set topic = %s", [name])

    bound_for(topic)
    try:
        yield
    finally:
        bound_for(events.TOPIC)


def broker_setting(cluster: KafkaCluster, name: str) -> list[ConfigEntry]:
    """`name` as each broker reports it (its value and where it comes from)."""
    admin = AdminClient(cluster.client_config())
    found = []
    for node in cluster.nodes:  # DescribeConfigs takes one broker resource per call
        broker = ConfigResource(ConfigResource.Type.BROKER, str(node.id))
        found.append(admin.describe_configs([broker])[broker].result(timeout=30)[name])
    return found


@contextmanager
def broker_default(cluster: KafkaCluster, name: str, value: str) -> Iterator[None]:
    """Within: `name=value` as the cluster-wide dynamic default of the brokers, what a topic
    without a setting of its own inherits; after: the default as it was (none: the brokers'
    server.properties again). Kafka's ConfigCommand sets it: confluent-kafka's admin client
    takes no broker resource without a broker id."""
    dynamic = ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
    before = next((e.value for e in broker_setting(cluster, name)
                   if int(e.source) == dynamic), None)
    config_command(cluster, "--add-config", f"{name}={value}")
    try:
        wait_for(lambda: {e.value for e in broker_setting(cluster, name)} == {value},
                 timeout=30, what=f"every broker to take the default {name}={value}")
        yield
    finally:
        if before is None:
            config_command(cluster, "--delete-config", name)
        elif before != value:
            config_command(cluster, "--add-config", f"{name}={before}")
        wait_for(lambda: value not in {e.value for e in broker_setting(cluster, name)}
                 or before == value, timeout=30, what=f"the default {name} restored")


def config_command(cluster: KafkaCluster, *alter: str) -> None:
    """kafka-configs.sh --entity-type brokers --entity-default --alter `alter`."""
    done = cluster.java("kafka.admin.ConfigCommand", "--bootstrap-server",
                        cluster.bootstrap_servers, "--entity-type", "brokers", "--entity-default",
                        "--alter", *alter)
    assert done.returncode == 0, done.stdout + done.stderr


# The audit's consumer groups (audit/against_topic.py names each reader's group so).
AUDIT_GROUPS = "audit-reminders-"


@dataclass(frozen=True)
class ScramUser:
    """A SCRAM-SHA-512 user of one test on the shared cluster."""

    name: str
    password: str = field(repr=False)


def every_acl_of(name: str) -> AclBindingFilter:
    """Every ACL that names User:`name`, whatever it allows or denies."""
    return AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, f"User:{name}", None,
                            AclOperation.ANY, AclPermissionType.ANY)


@contextmanager
def scram_user(cluster: KafkaCluster) -> Iterator[ScramUser]:
    """Within: a fresh SCRAM-SHA-512 user of `cluster`, with no ACL; after: every ACL naming it
    revoked, then the user removed (even if the revocation failed)."""
    admin = AdminClient(cluster.client_config())
    user = ScramUser(f"pin_test_{uuid.uuid4().hex[:12]}", f"scram-{secrets.token_urlsafe(18)}")
    credential = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
    admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        user.name, credential, user.password.encode())])[user.name].result(timeout=30)
    try:
        yield user
    finally:
        try:
            for future in admin.delete_acls([every_acl_of(user.name)]).values():
                future.result(timeout=30)
        finally:
            admin.alter_user_scram_credentials([UserScramCredentialDeletion(
                user.name, ScramMechanism.SCRAM_SHA_512)])[user.name].result(timeout=30)


@contextmanager
def topic_reader(cluster: KafkaCluster, topic: str) -> Iterator[dict[str, str]]:
    """Within: a SCRAM user of its own (`scram_user`) that may read `topic` and the contract's
    topic and nothing else (READ and DESCRIBE on them, READ on the audit's groups), as KAFKA_*
    settings over SASL_SSL. The audit always reads the contract's topic too, and takes a topic
    its ACLs hide for a refusal; no test of the shared cluster publishes to it (each has a topic
    of its own), so it holds nothing or does not exist. The other topics do not exist for this
    user. Removed after."""
    with scram_user(cluster) as user:
        admin = AdminClient(cluster.client_config())
        allow = [(ResourceType.TOPIC, name, ResourcePatternType.LITERAL, operation)
                 for name in (topic, events.TOPIC)
                 for operation in (AclOperation.READ, AclOperation.DESCRIBE)]
        allow += [(ResourceType.GROUP, AUDIT_GROUPS, ResourcePatternType.PREFIXED,
                   AclOperation.READ)]
        acls = [AclBinding(kind, name, pattern, f"User:{user.name}", "*", operation,
                           AclPermissionType.ALLOW) for kind, name, pattern, operation in allow]
        for future in admin.create_acls(acls).values():
            future.result(timeout=30)
        config = {**cluster.client_config("admin"), "sasl.username": user.name,
                  "sasl.password": user.password}
        for node in cluster.nodes:  # each broker knows the user and its ACLs before it is used
            wait_for(partial(_sees, config, node.sasl_ssl, topic), timeout=30,
                     what=f"broker {node.id} to let the new user describe {topic}")
        yield {"KAFKA_BOOTSTRAP_SERVERS": cluster.sasl_ssl_bootstrap_servers,
               "KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": SCRAM,
               "KAFKA_SASL_USERNAME": user.name, "KAFKA_SASL_PASSWORD": user.password,
               "KAFKA_SSL_CA_LOCATION": str(cluster.ca_location)}


def _sees(config: dict[str, Any], port: int, topic: str) -> bool:
    """Whether a client of `config`, on the broker at `port` alone, may describe `topic`."""
    admin = AdminClient({**config, "bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0})
    try:
        found = admin.list_topics(topic, timeout=2).topics.get(topic)
    except KafkaException:
        return False
    return found is not None and found.error is None
