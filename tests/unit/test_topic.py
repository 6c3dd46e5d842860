"""The topic's durability rule (outbox.topic_watch.durability_problem), its switch, and the partitioner
the relay pins (docs/outbox-relay.md, "A topic that keeps what it acknowledged")."""

import pytest

from core.config import ConfigError
from outbox import kafka
from outbox.config import load_relay_settings
from outbox.topic_watch import (
    KAFKA_DEFAULTS,
    LateBrokers,
    Replicas,
    TopicConfig,
    durability_problem,
    replicas_of,
    topic_config,
)

BOOT = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092"}
TOPIC = "pin.profile.document-expiry-reminders.v1"


def config(replicas: int = 3, min_insync: int = 2, unclean: bool = False) -> TopicConfig:
    return TopicConfig(TOPIC, 6, replicas, min_insync, unclean)


@pytest.mark.parametrize(("replicas", "min_insync"), [(3, 2), (5, 3), (2, 2), (1, 2)])
def test_a_topic_whose_acknowledgement_needs_two_copies_keeps_what_it_acknowledged(
    replicas: int, min_insync: int
) -> None:
    # With one replica and min.insync.replicas 2 the broker refuses every write: nothing is
    # acknowledged, so nothing acknowledged is lost.
    assert durability_problem(config(replicas, min_insync)) is None


@pytest.mark.parametrize(("replicas", "min_insync"), [(3, 1), (5, 1), (2, 1), (1, 1), (3, 0)])
def test_min_insync_replicas_below_two_is_refused_naming_the_setting_and_the_fix(
    replicas: int, min_insync: int
) -> None:
    problem = durability_problem(config(replicas, min_insync))
    assert problem is not None and "\n" not in problem
    assert problem.startswith(f"min.insync.replicas={min_insync} (replicas: {replicas})")
    assert f"--entity-name {TOPIC} --add-config min.insync.replicas=2" in problem
    assert "OUTBOX_ALLOW_UNDURABLE_TOPIC=on" in problem


def test_unclean_leader_election_is_refused_whatever_the_replication() -> None:
    problem = durability_problem(config(replicas=3, min_insync=2, unclean=True))
    assert problem is not None and problem.startswith("unclean.leader.election.enable=true")
    assert "--add-config unclean.leader.election.enable=false" in problem


def test_a_setting_the_broker_does_not_report_is_kafkas_default() -> None:
    # Tansu reports only what was set on the topic; Kafka's default min.insync.replicas is 1.
    assert KAFKA_DEFAULTS == {"min.insync.replicas": "1", "unclean.leader.election.enable": "false"}
    assert topic_config(TOPIC, 3, 3, {}) == TopicConfig(TOPIC, 3, 3, 1, False)
    assert topic_config(TOPIC, 3, 3, {"min.insync.replicas": " 2 ",
                                      "unclean.leader.election.enable": "TRUE"}) == \
        TopicConfig(TOPIC, 3, 3, 2, True)
    assert durability_problem(topic_config(TOPIC, 3, 3, {})) is not None


class _Partition:
    def __init__(self, *replicas: int) -> None:
        self.replicas = list(replicas)


def test_replicas_count_distinct_brokers_of_the_least_replicated_partition() -> None:
    # Tansu names its one broker three times for a topic created with replication factor 3.
    assert replicas_of({0: _Partition(1, 2, 3), 1: _Partition(2, 3)}) == 2
    assert replicas_of({0: _Partition(111, 111, 111)}) == 1
    assert replicas_of({}) == 0


@pytest.mark.parametrize(("raw", "allowed"), [("on", True), ("off", False), ("TRUE", True),
                                              ("0", False)])
def test_the_switch_reads_like_every_other(raw: str, allowed: bool) -> None:
    assert not load_relay_settings(BOOT).allow_undurable_topic
    settings = load_relay_settings({**BOOT, "OUTBOX_ALLOW_UNDURABLE_TOPIC": raw})
    assert settings.allow_undurable_topic is allowed


@pytest.mark.parametrize("raw", ["", "maybe", "2"])
def test_a_bad_switch_value_names_the_variable(raw: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_relay_settings({**BOOT, "OUTBOX_ALLOW_UNDURABLE_TOPIC": raw})
    assert raised.value.name == "OUTBOX_ALLOW_UNDURABLE_TOPIC"


def test_the_producer_partitions_as_the_java_client_and_no_one_may_change_it() -> None:
    settings = load_relay_settings(BOOT)
    assert kafka.producer_config(settings, "relay-x")["partitioner"] == "murmur2_random"
    for prop in ("partitioner", "Partitioner"):
        guarded = load_relay_settings({**BOOT, "KAFKA_PRODUCER_CONFIG": f'{{"{prop}": "random"}}'})
        with pytest.raises(ConfigError) as raised:
            kafka.producer_config(guarded, "relay-x")
        assert raised.value.name == "KAFKA_PRODUCER_CONFIG" and "murmur2_random" in str(raised.value)


# --- the brokers a late partition waited on (LateBrokers) ------------------------------------

# Broker 3 leads 0 and follows 2; broker 1 leads 2 and follows 0 and 4; broker 2 leads 4.
P0, P2, P4 = Replicas(3, frozenset({1})), Replicas(1, frozenset({3})), Replicas(2, frozenset({1}))


def test_a_late_partition_suspects_its_leader_and_followers_and_an_answer_vouches_for_them() -> None:
    late = LateBrokers()
    late.late([P0])
    assert [late.waited_on(p) for p in (P0, P2, P4)] == [3, 1, 1] and late

    late.vouch([P4])  # broker 2 answered as a leader, broker 1 as a follower

    assert [late.waited_on(p) for p in (P0, P2, P4)] == [3, 1, None]
    late.vouch([P2])  # broker 1 as a leader, broker 3 as a follower
    assert [late.waited_on(p) for p in (P0, P2, P4)] == [3, None, None]


def test_partitions_answered_beside_the_late_one_vouch_at_once_and_a_look_forgets() -> None:
    late = LateBrokers()
    late.late([P0, P2], answered=[P4])
    assert [late.waited_on(p) for p in (P0, P2, P4)] == [3, 1, None]

    late.forget_all_but({1, 2})  # broker 3 fenced: in no partition's replicas any more

    assert late.waited_on(P0) is None and late.waited_on(P2) == 1
    late.forget_all_but(set())
    assert not late
