"""One arming, one message id, across a restore (docs/design.md §2.6): last night's dump
restored into a new database, the same cycle run there and published to the same topic, puts
every investor's reminder on the topic under the one message_id it had; the ledger alone restored
then is reminded again without a second event, and the audit notes it as already queued. Expiry
dates corrected and corrected back after the dump are replayed on the restored database: each
arming again under the message_id it had, a date told again in a new arming under a new one."""

import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest

from core.roles import AUDITOR_ROLE, RELAY_ROLE, WORKER_ROLE
from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import read_topic
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

        # the first database's ledger alone restored from the dump (the outbox kept): the same
        # cycle writes the markers again and no event; the audit notes each reminder as
        # already queued, finds nothing, and exits 0
        cluster.sql("pin_night", "truncate profile.document_expiry_reminders")
        cluster.run("pg_restore", "--data-only", "-t", "document_expiry_reminders",
                    "-d", cluster.url("pin_night"), str(dump))
        queued = remind(cluster, "pin_night", as_of)
        assert queued["owners_already_queued"] == first["owners_notified"]
        assert event_ids(cluster, "pin_night") == written
        audited = json.loads(manage(cluster.url("pin_night", AUDITOR_ROLE), "audit_reminders",
                                    "--format", "json").stdout)
        [ledger] = [c for c in audited["checks"] if c["name"] == "ledger_outbox"]
        assert (ledger["status"], audited["findings"]) == ("clean", 0), audited
        assert [(f["code"], f["count"]) for f in ledger["noted"]] == [
            ("already_queued", queued["owners_already_queued"])]


def correct_expiries(cluster: Cluster, database: str, documents: list[str], days: int) -> None:
    """The profile service moves the documents' expiry by `days` (a correction)."""
    cluster.sql(database, "update profile.person_documents set expires_at = expires_at"
                          " + make_interval(days => %s) where id::text = any(%s)",
                (days, documents))


def events_in_order(cluster: Cluster, database: str) -> list[tuple[str, str]]:
    """(message id, owner) of every event, in the order written."""
    return [(r[0], r[1]) for r in cluster.sql(
        database, "select id::text, aggregate_id from profile.outbox_messages"
                  " order by created_at, id")]


def test_corrections_back_and_forth_replayed_after_a_restore_keep_each_armings_id(
    kafka: MockKafkaCluster,
) -> None:
    day0 = datetime.now(UTC) - timedelta(days=10)  # the demo documents are seeded around now
    days = [(day0 + timedelta(days=n)).isoformat() for n in range(4)]
    with clusters("corrected") as (cluster,):
        cluster.init().start()
        new_database(cluster, "pin_night", owners=40)
        remind(cluster, "pin_night", days[0])
        # ten documents told on day 0 (7 days ahead or less: told again each day they move)
        corrected = [r[0] for r in cluster.sql(
            "pin_night", "select r.document_id::text from profile.document_expiry_reminders r"
                         " where r.notified and r.threshold_days <= 7 order by r.document_id"
                         " limit 10")]
        assert corrected
        dump = cluster.dir / "night.dump"  # last night's backup: day 0 done
        cluster.run("pg_dump", "--no-owner", "--no-acl", "-Fc", "-f", str(dump),
                    cluster.url("pin_night"))
        # day 1 a day later (B), day 2 back (A), day 3 a day later again (B)
        moves = [1, -1, 1]
        for database in ("pin_night", "pin_restored"):
            if database == "pin_restored":
                cluster.sql("postgres", "create database pin_restored")
                cluster.run("pg_restore", "-d", cluster.url("pin_restored"), str(dump))
                manage(cluster.url("pin_restored"), "apply_db_roles")
            for day, move in zip(days[1:], moves, strict=True):
                correct_expiries(cluster, database, corrected, move)
                done = remind(cluster, database, day)
                assert (done["owners_already_queued"], done["failed_owners"]) == (0, 0)
            publish(cluster, database, kafka)

        written = events_in_order(cluster, "pin_night")
        # the restored database wrote every arming again under the id it had, and no other
        assert events_in_order(cluster, "pin_restored") == written
        # each corrected document told on each of the four days, under four ids
        told = cluster.sql("pin_night", """
            select d ->> 'documentId', d ->> 'expiresAt', m.id::text
            from profile.outbox_messages m, jsonb_array_elements(m.payload -> 'documents') d
            where d ->> 'documentId' = any(%s) order by m.created_at""", (corrected,))
        by_document: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for document, expires, message_id in told:
            by_document[document].append((expires, message_id))
        for document in corrected:
            dates = [expires for expires, _ in by_document[document]]
            assert len(dates) == 4 and dates[0] == dates[2] and dates[1] == dates[3] != dates[0]
            assert len({message_id for _, message_id in by_document[document]}) == 4
        # on the topic: every id twice (sent by both databases: a redelivery), no other id
        copies: dict[str, int] = defaultdict(int)
        for record in read_topic(kafka.bootstrap_servers):
            copies[record.message_id] += 1
        assert set(copies) == {message_id for message_id, _ in written}
        assert set(copies.values()) == {2}
        audited = json.loads(manage(cluster.url("pin_night", AUDITOR_ROLE), "audit_reminders",
                                    "--format", "json").stdout)
        assert audited["findings"] == 0, audited
