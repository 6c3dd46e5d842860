"""One reminder, one message id, across a restore (docs/design.md §2.6): last night's dump
restored into a new database, the same cycle run there and published to the same topic, puts
every investor's reminder on the topic under the one message_id it had."""

import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest

from core.roles import RELAY_ROLE, WORKER_ROLE
from devtools.mock_kafka import MockKafkaCluster
from devtools.topic import read_topic
from tests.support.clusters import Cluster, clusters, manage, new_database

pytestmark = pytest.mark.slow

OWNERS = 120


def remind(cluster: Cluster, database: str, as_of: str) -> dict[str, object]:
    """One cycle as the worker's role; its `cycle completed` line."""
    done = manage(cluster.url(database, WORKER_ROLE), "run_expiry_reminders", "--as-of", as_of)
    lines = [json.loads(line) for line in (done.stderr + done.stdout).splitlines()
             if line.startswith("{")]
    [completed] = [line for line in lines if line.get("event") == "cycle completed"]
    assert isinstance(completed, dict)
    return completed


def publish(cluster: Cluster, database: str, kafka: MockKafkaCluster) -> None:
    manage(cluster.url(database, RELAY_ROLE), "publish_outbox", "--held-bound", "0",
           env={"KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
                "OUTBOX_DELIVERY_TIMEOUT": "10s"})


def event_ids(cluster: Cluster, database: str) -> set[str]:
    return {r[0] for r in cluster.sql(database, "select id::text from profile.outbox_messages")}


def test_a_dump_restored_and_reminded_again_sends_each_investor_one_message_id(
    kafka: MockKafkaCluster,
) -> None:
    as_of = (datetime.now(UTC) - timedelta(days=10)).date().isoformat()
    with clusters("dumped") as (cluster,):
        cluster.init().start()
        new_database(cluster, "pin_night", owners=OWNERS)
        dump = cluster.dir / "night.dump"
        cluster.run("pg_dump", "--no-owner", "--no-acl", "-Fc", "-f", str(dump),
                    cluster.url("pin_night"))
        first = remind(cluster, "pin_night", as_of)
        publish(cluster, "pin_night", kafka)
        cluster.sql("postgres", "create database pin_restored")
        cluster.run("pg_restore", "-d", cluster.url("pin_restored"), str(dump))
        manage(cluster.url("pin_restored"), "apply_db_roles")
        again = remind(cluster, "pin_restored", as_of)  # the same cycle, on last night's data
        publish(cluster, "pin_restored", kafka)

        written = event_ids(cluster, "pin_night")
        assert written and event_ids(cluster, "pin_restored") == written
        records = read_topic(kafka.bootstrap_servers)
        ids_by_investor: dict[str, set[str]] = defaultdict(set)
        for record in records:
            ids_by_investor[record.key].add(record.message_id)
        assert first["owners_notified"] == again["owners_notified"] == len(ids_by_investor)
        assert all(len(ids) == 1 for ids in ids_by_investor.values())
        assert len(records) == 2 * len(written)  # each sent by both databases: a redelivery
