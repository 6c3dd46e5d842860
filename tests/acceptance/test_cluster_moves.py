"""The outbox stream across the moves a database makes in its life, with real clusters and the
real commands: a dump restored into a new cluster, a logical-replication cut-over, pg_upgrade,
a promoted standby and a point-in-time restore.
The old cluster's transaction ids are far ahead of the new one's (its xid epoch is raised, as
years of traffic raise it): every event written after the move must reach the topic all the
same, and nothing delivered before it is sent again (docs/outbox-relay.md, "The stream on a new
cluster")."""

import json
import os
import shutil
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

import pytest

from core.roles import AUDITOR_ROLE, RELAY_ROLE, WORKER_ROLE
from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import Record, read_topic
from tests.support.clusters import Cluster, clusters, manage, new_database
from tests.support.pg_binaries import bindir
from tests.support.relay_support import wait_for
from tests.support.tansu_support import TansuBroker

pytestmark = pytest.mark.slow

DATABASE = "pin_moves"


class Broker(Protocol):
    """The mock cluster or a Tansu process: what the commands bootstrap from."""

    @property
    def bootstrap_servers(self) -> str: ...

OWNERS = 300


def days_ago(days: int) -> str:
    return (datetime.now(UTC) - timedelta(days=days)).date().isoformat()


def remind(cluster: Cluster, as_of: str) -> None:
    """One cycle as the worker's role, at a past as-of (the data is seeded from today)."""
    manage(cluster.url(DATABASE, WORKER_ROLE), "run_expiry_reminders", "--as-of", as_of)


def publish(cluster: Cluster, kafka: Broker) -> str:
    """One relay pass as the relay's role; its output (exit 0 asserted)."""
    done = manage(cluster.url(DATABASE, RELAY_ROLE), "publish_outbox", "--held-bound", "0",
                  env={"KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
                       "OUTBOX_DELIVERY_TIMEOUT": "10s",
                       "OUTBOX_ALLOW_UNDURABLE_TOPIC": "on"})  # Tansu: one broker
    return done.stdout + done.stderr


def audit(cluster: Cluster, kafka: Broker, *args: str) -> tuple[int, dict[str, int]]:
    """`audit_reminders --format json` as the auditor's role: its exit code, and the findings
    it counted, by name (only those found)."""
    done = manage(cluster.url(DATABASE, AUDITOR_ROLE), "audit_reminders", "--format", "json",
                  *args, env={"KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers},
                  check=False)
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    return done.returncode, {f["code"]: f["count"] for c in report["checks"]
                             for f in c["findings"] if f["count"]}


def event_ids(cluster: Cluster) -> set[str]:
    return {r[0] for r in cluster.sql(DATABASE, "select id::text from profile.outbox_messages")}


def unpublished(cluster: Cluster) -> int:
    return int(cluster.sql(DATABASE, "select count(*) from profile.outbox_messages m"
                                     " where profile.outbox_published_at(m) is null")[0][0])


def on_topic(kafka: Broker) -> Counter[str]:
    return Counter(r.message_id for r in read_topic(kafka.bootstrap_servers))


def position_system(cluster: Cluster) -> int:
    return int(cluster.sql(DATABASE, "select system_identifier from"
                                     " profile.outbox_relay_position")[0][0])


def assert_delivered_once(kafka: Broker, ids: set[str]) -> None:
    seen = on_topic(kafka)
    missing = ids - set(seen)
    assert not missing, f"{len(missing)} of {len(ids)} events never reached the topic"
    assert all(seen[i] == 1 for i in ids), "an event was sent twice"


def test_after_a_dump_and_restore_into_a_new_cluster_every_later_event_is_delivered(
    tansu: TansuBroker,
) -> None:
    kafka = tansu  # a broker process: the audit reads the topic by time (offsets_for_times)
    with clusters("old", "new") as (old, new):
        old.init(xid_epoch=3).start()
        new.init().start()
        new_database(old, DATABASE, owners=OWNERS)
        remind(old, days_ago(20))
        publish(old, kafka)
        before = event_ids(old)
        assert before and unpublished(old) == 0

        dump = old.dir / "pin.dump"
        old.run("pg_dump", "--no-owner", "--no-acl", "-Fc", "-f", str(dump), old.url(DATABASE))
        new.sql("postgres", f"create database {DATABASE}")
        new.run("pg_restore", "-d", new.url(DATABASE), str(dump))
        manage(new.url(DATABASE), "apply_db_roles")
        moved = audit(new, kafka)  # before anything ran here: the move is seen
        remind(new, days_ago(10))
        remind(new, days_ago(0))
        after = event_ids(new) - before
        assert after, "the cycles after the move wrote no event: the test proves nothing"
        said = publish(new, kafka)

        assert unpublished(new) == 0
        assert_delivered_once(kafka, before | after)  # the old ones not sent again
        assert position_system(new) == new.system_identifier() != old.system_identifier()
        assert "Relay pass:" in said
        assert moved == (1, {"position_of_another_cluster": 1})
        assert audit(new, kafka, "--against-topic") == (0, {})


def test_after_a_logical_replication_cut_over_every_waiting_and_later_event_is_delivered(
    kafka: MockKafkaCluster,
) -> None:
    with clusters("publisher", "subscriber", settings=["wal_level=logical"]) as (old, new):
        old.init(xid_epoch=3).start()
        new.init().start()
        new_database(old, DATABASE, owners=OWNERS)
        remind(old, days_ago(20))
        publish(old, kafka)
        delivered_on_old = event_ids(old)

        # The schema first (logical replication copies rows, not definitions), then the rows.
        schema = old.dir / "schema.sql"
        old.run("pg_dump", "--schema-only", "--no-owner", "--no-acl", "-f", str(schema),
                old.url(DATABASE))
        new.sql("postgres", f"create database {DATABASE}")
        new.run("psql", "-q", "-v", "ON_ERROR_STOP=1", "-d", new.url(DATABASE), "-f", str(schema))
        old.sql(DATABASE, "create publication pin_move for all tables")
        new.sql(DATABASE, "create subscription pin_move connection"
                          f" 'host=127.0.0.1 port={old.port} dbname={DATABASE} user=postgres'"
                          " publication pin_move")
        remind(old, days_ago(15))  # written on the old cluster, left for the new one to send
        waiting_at_cut_over = event_ids(old) - delivered_on_old
        assert waiting_at_cut_over

        def caught_up() -> bool:
            ready = new.sql(DATABASE, "select bool_and(srsubstate = 'r') from pg_subscription_rel")
            return bool(ready[0][0]) and event_ids(new) == event_ids(old) and (
                new.sql(DATABASE, "select txid::text, seq from profile.outbox_relay_position")
                == old.sql(DATABASE, "select txid::text, seq from profile.outbox_relay_position"))

        wait_for(caught_up, timeout=120, what="the subscriber caught up")
        new.sql(DATABASE, "alter subscription pin_move disable")
        new.sql(DATABASE, "drop subscription pin_move")
        manage(new.url(DATABASE), "apply_db_roles")
        remind(new, days_ago(10))
        remind(new, days_ago(0))
        written_on_new = event_ids(new) - event_ids(old)
        assert written_on_new
        publish(new, kafka)

        assert unpublished(new) == 0
        assert_delivered_once(kafka, delivered_on_old | waiting_at_cut_over | written_on_new)
        assert position_system(new) == new.system_identifier()


def test_pg_upgrade_keeps_the_ids_and_the_stream_goes_on_without_a_re_base(
    kafka: MockKafkaCluster,
) -> None:
    with clusters("before", "after") as (old, new):
        old.init(xid_epoch=3).start()
        new_database(old, DATABASE, owners=OWNERS)
        remind(old, days_ago(20))
        publish(old, kafka)
        delivered = event_ids(old)
        remind(old, days_ago(15))  # left waiting across the upgrade
        old_system = old.system_identifier()
        old.stop()
        new.init()
        new.run("pg_upgrade", "-b", str(bindir()), "-B", str(bindir()), "-d", str(old.data),
                "-D", str(new.data), "-p", str(old.port), "-P", str(new.port))
        new.start()
        remind(new, days_ago(0))
        said = publish(new, kafka)

        assert unpublished(new) == 0
        assert event_ids(new) > delivered
        assert_delivered_once(kafka, event_ids(new))
        # A new cluster (pg_upgrade runs initdb) that carries the old one's transaction ids on:
        # the move is recorded, and nothing is re-based.
        assert new.system_identifier() != old_system
        assert position_system(new) == new.system_identifier()
        assert new.sql(DATABASE, "select txid_offset, previous_system_identifier"
                                 " from profile.outbox_relay_position") == [(0, old_system)]
        assert "Relay pass: " in said


def test_a_promoted_standby_goes_on_with_the_stream_as_its_primary_left_it(
    kafka: MockKafkaCluster,
) -> None:
    with clusters("primary", "standby", settings=["wal_level=replica"]) as (primary, standby):
        primary.init(xid_epoch=3).start()
        new_database(primary, DATABASE, owners=OWNERS)
        remind(primary, days_ago(20))
        publish(primary, kafka)
        standby.run("pg_basebackup", "-D", str(standby.data), "-R", "-X", "stream",
                    "-d", primary.url())
        standby.start()
        remind(primary, days_ago(15))  # replicated, not yet published
        written = event_ids(primary)
        wait_for(lambda: event_ids(standby) == written, timeout=60, what="the standby to replay")
        primary.run("pg_ctl", "-D", str(primary.data), "-m", "immediate", "-w", "stop")
        standby.run("pg_ctl", "-D", str(standby.data), "-w", "promote")
        remind(standby, days_ago(0))
        publish(standby, kafka)

        assert unpublished(standby) == 0
        assert_delivered_once(kafka, event_ids(standby))
        assert event_ids(standby) > written
        assert standby.sql(DATABASE, "select txid_offset, previous_system_identifier"
                                     " from profile.outbox_relay_position") == [(0, None)]


def test_a_point_in_time_restore_sends_again_what_came_after_that_point_and_loses_nothing(
    kafka: MockKafkaCluster,
) -> None:
    with clusters("live", "restored") as (live, restored):
        archive = archive_the_wal_of(live)
        live.init(xid_epoch=3).start()
        new_database(live, DATABASE, owners=OWNERS)
        remind(live, days_ago(20))
        publish(live, kafka)
        published_before_the_point = event_ids(live)
        restored.run("pg_basebackup", "-D", str(restored.data), "-X", "stream", "-d", live.url())
        remind(live, days_ago(15))
        written_before_the_point = event_ids(live)
        live.sql(DATABASE, "select pg_create_restore_point('before_the_relay_pass')")
        publish(live, kafka)  # delivered after the point: the restore forgets that it was
        remind(live, days_ago(10))  # written after the point: lost with the restore
        lost_day = event_ids(live) - written_before_the_point
        publish(live, kafka)  # and delivered: its reminders reach the topic before the restore
        assert lost_day and unpublished(live) == 0
        archive_the_last_wal_and_stop(live)
        restore_to_the_point(restored, archive)
        assert event_ids(restored) == written_before_the_point
        remind(restored, days_ago(10))  # the lost day, written again
        publish(restored, kafka)

        assert unpublished(restored) == 0
        records = read_topic(kafka.bootstrap_servers)
        check_the_lost_day_written_again_under_its_ids(restored, records, lost_day,
                                                       written_before_the_point)
        check_sent_again_once_what_the_restore_forgot(restored, records,
                                                      published_before_the_point)
        assert restored.sql(DATABASE, "select txid_offset from"
                                      " profile.outbox_relay_position") == [(0,)]


def archive_the_wal_of(cluster: Cluster) -> Path:
    """Archive mode on (before the cluster starts); the archive's directory."""
    archive = cluster.dir / "archive"
    archive.mkdir()
    if os.geteuid() == 0:
        shutil.chown(archive, "postgres")
    cluster.settings += ["wal_level=replica", "archive_mode=on",
                         f"archive_command='cp %p {archive}/%f'"]
    return archive


def archive_the_last_wal_and_stop(cluster: Cluster) -> None:
    cluster.sql(DATABASE, "select pg_switch_wal()")
    wait_for(lambda: not cluster.sql("postgres", "select 1 from pg_stat_archiver"
                                                 " where last_archived_wal is null"
                                                 " or last_failed_time > last_archived_time"),
             timeout=60, what="the WAL archived")
    cluster.stop()


def restore_to_the_point(restored: Cluster, archive: Path) -> None:
    """The base backup recovered from the archive up to the restore point, then promoted."""
    (restored.data / "recovery.signal").touch()
    with (restored.data / "postgresql.auto.conf").open("a") as conf:
        conf.write(f"restore_command = 'cp {archive}/%f %p'\n"
                   "recovery_target_name = 'before_the_relay_pass'\n"
                   "recovery_target_action = 'promote'\n")
    restored.start()
    wait_for(lambda: not restored.sql("postgres", "select pg_is_in_recovery()")[0][0],
             timeout=60, what="the restore to end")


def check_the_lost_day_written_again_under_its_ids(
    restored: Cluster, records: list[Record], lost_day: set[str],
    written_before_the_point: set[str],
) -> None:
    """The lost day's reminders are written again under the ids they had (docs/design.md,
    "One arming, one message id"): on the topic, each reminder has one message_id."""
    assert event_ids(restored) - written_before_the_point == lost_day
    ids_by_reminder: dict[tuple[str, frozenset[tuple[str, int, str]]], set[str]] = {}
    for record in records:
        reminder = frozenset((d["documentId"], d["thresholdDays"], d["expiresAt"])
                             for d in record.json()["documents"])
        ids_by_reminder.setdefault((record.key, reminder), set()).add(record.message_id)
    assert len(ids_by_reminder) == len(event_ids(restored))
    assert all(len(ids) == 1 for ids in ids_by_reminder.values())


def check_sent_again_once_what_the_restore_forgot(
    restored: Cluster, records: list[Record], published_before_the_point: set[str],
) -> None:
    """What the restore forgot it had delivered is sent again, once; the rest once."""
    seen = Counter(r.message_id for r in records)
    sent_again = event_ids(restored) - published_before_the_point
    assert {i: seen[i] for i in sent_again} == dict.fromkeys(sent_again, 2)
    assert {i: seen[i] for i in published_before_the_point} == dict.fromkeys(
        published_before_the_point, 1)
    assert set(seen) == event_ids(restored)
