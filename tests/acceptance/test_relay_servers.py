"""The relay works only on the primary it leads on, with real clusters and the real
commands: a relay pointed at a hot standby (pg_basebackup -R) sends nothing and says why, and a
`--loop` there stands by, not ready, until the standby is promoted; a logical subscriber still
applying the outbox refuses its worker's writes and its relay (nothing re-based); a relay whose
reader reaches another server than the one it leads on (a promoted copy of it: the same cluster
id) stops before reading there (docs/outbox-relay.md, "The relay and its servers")."""

import json
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connections
from pytest_django import DjangoDbBlocker

from core.roles import RELAY_ROLE, WORKER_ROLE
from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import read_topic
from outbox import store
from outbox.relay import Relay
from tests.acceptance.test_cluster_moves import (
    DATABASE,
    assert_delivered_once,
    days_ago,
    event_ids,
    publish,
    remind,
    unpublished,
)
from tests.support.chaos_proxy import Proxy
from tests.support.clusters import Cluster, clusters, manage, new_database, start_manage
from tests.support.relay_support import relay_settings, wait_for

pytestmark = pytest.mark.slow

OWNERS = 60


def relay_pass(cluster: Cluster, kafka: MockKafkaCluster) -> tuple[int, str]:
    """One relay pass as the relay's role: its exit code and its last line."""
    done = manage(cluster.url(DATABASE, RELAY_ROLE), "publish_outbox", "--held-bound", "0",
                  env={"KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
                       "OUTBOX_DELIVERY_TIMEOUT": "10s"}, check=False)
    return done.returncode, (done.stderr.strip().splitlines() or [""])[-1]


def run_ids(cluster: Cluster) -> set[str]:
    """The runs that wrote the outbox's rows on `cluster` (their correlation ids)."""
    return {r[0] for r in cluster.sql(
        DATABASE, "select headers->>'correlation_id' from profile.outbox_messages")}


def topic_ids(kafka: MockKafkaCluster) -> list[str]:
    return [r.message_id for r in read_topic(kafka.bootstrap_servers, timeout=10)]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback
            return response.status, response.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def logged(log: Path, event: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()
            if line.startswith("{") and f'"event":"{event}"' in line]


def test_a_relay_on_a_hot_standby_sends_nothing_and_leads_once_it_is_promoted(
    kafka: MockKafkaCluster, tmp_path: Path
) -> None:
    with clusters("primary", "standby", settings=["wal_level=replica"]) as (primary, standby):
        primary.init().start()
        new_database(primary, DATABASE, owners=OWNERS)
        remind(primary, days_ago(0))
        waiting = event_ids(primary)
        assert waiting
        standby.run("pg_basebackup", "-D", str(standby.data), "-R", "-X", "stream",
                    "-d", primary.url())
        standby.start()
        wait_for(lambda: event_ids(standby) == waiting, timeout=60, what="the standby to replay")

        code, line = relay_pass(standby, kafka)
        assert code == 1
        assert line.startswith(f"CommandError: the database server 127.0.0.1:{standby.port}/"
                               f"{DATABASE} (cluster {primary.system_identifier()}, "), line
        assert "in recovery (a standby, or a restore under way)" in line
        assert topic_ids(kafka) == []  # nothing sent

        log = tmp_path / "relay.log"
        relay = start_manage(standby.url(DATABASE, RELAY_ROLE), "publish_outbox", "--loop",
                             log=log, env={"KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
                                           "OUTBOX_POLL_INTERVAL": "200ms",
                                           "METRICS_ADDR": "127.0.0.1:0"})
        try:
            standing_by = "database server in recovery (a standby), standing by until it is promoted"
            wait_for(lambda: relay.poll() is not None or (
                bool(logged(log, "metrics server listening")) and bool(logged(log, standing_by))),
                     timeout=60, what="the loop to stand by")
            assert relay.poll() is None, log.read_text()
            base = f"http://127.0.0.1:{logged(log, 'metrics server listening')[0]['port']}"
            not_ready = get(f"{base}/readyz")
            assert topic_ids(kafka) == []
            primary.stop()
            standby.run("pg_ctl", "-D", str(standby.data), "-w", "promote")
            wait_for(lambda: unpublished(standby) == 0, timeout=60, what="the promoted relay")
            # Readiness is answered from a verdict at most a second old (core.ops_server).
            wait_for(lambda: get(f"{base}/readyz")[0] == 200, timeout=5, what="readiness")
            ready = get(f"{base}/readyz")
        finally:
            relay.send_signal(signal.SIGTERM)
            relay.wait(timeout=60)

        assert relay.returncode == 0, log.read_text()
        assert not_ready[0] == 503 and "is in recovery" in not_ready[1]
        assert ready[0] == 200
        assert len(logged(log, standing_by)) == 1  # said once
        assert logged(log, "database server promoted, looking for the lead")
        assert_delivered_once(kafka, waiting)


def test_a_subscriber_still_applying_the_outbox_refuses_its_writers_and_its_relay(
    kafka: MockKafkaCluster,
) -> None:
    with clusters("publisher", "subscriber", settings=["wal_level=logical"]) as (old, new):
        old.init(xid_epoch=3).start()
        new.init().start()
        new_database(old, DATABASE, owners=OWNERS)
        remind(old, days_ago(20))
        publish(old, kafka)
        schema = old.dir / "schema.sql"
        old.run("pg_dump", "--schema-only", "--no-owner", "--no-acl", "-f", str(schema),
                old.url(DATABASE))
        new.sql("postgres", f"create database {DATABASE}")
        new.run("psql", "-q", "-v", "ON_ERROR_STOP=1", "-d", new.url(DATABASE), "-f", str(schema))
        manage(new.url(DATABASE), "apply_db_roles")
        old.sql(DATABASE, "create publication pin_move for all tables")
        new.sql(DATABASE, "create subscription pin_move connection"
                          f" 'host=127.0.0.1 port={old.port} dbname={DATABASE} user=postgres'"
                          " publication pin_move")

        def caught_up() -> bool:
            ready = new.sql(DATABASE, "select bool_and(srsubstate = 'r') from pg_subscription_rel")
            position = "select txid::text, seq, system_identifier from profile.outbox_relay_position"
            return (bool(ready[0][0]) and event_ids(new) == event_ids(old)
                    and new.sql(DATABASE, position) == old.sql(DATABASE, position))

        wait_for(caught_up, timeout=120, what="the copy")
        position_before = new.sql(DATABASE, "select system_identifier, txid_offset from"
                                            " profile.outbox_relay_position")

        # The subscriber's worker writes while the subscription still applies: refused.
        wrote = manage(new.url(DATABASE, WORKER_ROLE), "run_expiry_reminders", "--as-of",
                       days_ago(10), check=False)
        code, line = relay_pass(new, kafka)

        assert position_before == [(old.system_identifier(), 0)]
        assert new.sql(DATABASE, "select system_identifier, txid_offset from"
                                 " profile.outbox_relay_position") == position_before  # no re-base
        assert event_ids(new) == event_ids(old)  # nothing written here
        assert wrote.returncode == 1, wrote.stdout + wrote.stderr
        assert "still applies the outbox" in wrote.stdout + wrote.stderr
        assert (code, "still applies the outbox" in line) == (4, True), line
        remind(old, days_ago(15))  # the publisher goes on, the subscription still applies it
        wait_for(lambda: event_ids(new) == event_ids(old), timeout=120, what="the apply")

        new.sql(DATABASE, "alter subscription pin_move disable")
        new.sql(DATABASE, "drop subscription pin_move")
        copied = event_ids(new)
        remind(new, days_ago(10))  # now the cut-over is done: re-based, written, delivered
        publish(new, kafka)
        assert event_ids(new) > copied
        assert unpublished(new) == 0
        assert_delivered_once(kafka, event_ids(new))


@contextmanager
def alias_through(proxy: Proxy, name: str) -> Iterator[str]:
    """A database alias of this process, as the relay's role, through `proxy`."""
    settings = {**connections.settings["default"], "HOST": "127.0.0.1", "PORT": str(proxy.port),
                "NAME": name, "USER": RELAY_ROLE, "PASSWORD": ""}
    connections.settings["through_proxy"] = settings
    try:
        yield "through_proxy"
    finally:
        connections["through_proxy"].close()
        del connections["through_proxy"]
        del connections.settings["through_proxy"]


def test_a_reader_that_reaches_another_server_stops_the_pass_before_reading_there(
    kafka: MockKafkaCluster, django_db_blocker: DjangoDbBlocker
) -> None:
    with clusters("a", "b", settings=["wal_level=replica"]) as (a, b):
        a.init().start()
        new_database(a, DATABASE, owners=OWNERS)
        # B is a copy of A started as a primary of its own (a standby promoted while A lives
        # on: split brain): the same cluster id, its own postmaster.
        b.run("pg_basebackup", "-D", str(b.data), "-X", "stream", "-d", a.url())
        b.start()
        remind(a, days_ago(0))  # written on A only
        remind(b, days_ago(1))  # written on B only
        on_a, on_b = event_ids(a), event_ids(b)
        # each server's rows its own run wrote (a reminder's id is the same on both: it is
        # named after the reminder, docs/design.md §2.6)
        assert on_a and on_b and not run_ids(a) & run_ids(b)
        assert a.system_identifier() == b.system_identifier()
        proxy = Proxy(("127.0.0.1", a.port))
        proxy.start()
        try:
            with django_db_blocker.unblock(), alias_through(proxy, DATABASE) as alias:
                relay = Relay(relay_settings(kafka.bootstrap_servers), using=alias)
                try:
                    assert relay.lead()  # its session reached A
                    proxy.upstream = ("127.0.0.1", b.port)  # the address moves to B
                    with pytest.raises(store.ReaderOnAnotherServerError) as stopped:
                        relay.run_pass()
                finally:
                    relay.close()
        finally:
            proxy.close()

        assert f"reached 127.0.0.1:{proxy.port}/{DATABASE}" in str(stopped.value)
        assert "not the server the relay leads on" in str(stopped.value)
        assert topic_ids(kafka) == []  # nothing read on B was sent
        assert unpublished(a) == len(on_a)  # nothing recorded on A: every row still waits
        assert unpublished(b) == len(on_b)
