"""The whole path under stress: 4 workers racing while 2 relays run (one leads, one stands by),
the broker going down in the middle of it, the leading relay stopped with SIGTERM while its
batch is produced and not yet marked, the standby taking over, and the stopped one replaced.
Every event reaches the topic (at least once, same message id on a redelivery), in order per
owner, and the database invariants hold. The relay runs under its least-privilege role."""

import json
import signal
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection
from psycopg import errors

from core.roles import RELAY_ROLE
from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import Record, read_topic
from reminders.config import DEFAULT_THRESHOLDS
from tests.support import chaos_report
from tests.support.chaos import Worker, iso, load_spread_documents, outbox_count, scalar, wait_until
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import test_database_url
from tests.support.factories import Documents
from tests.support.invariants import check_invariants, documents_md5, snapshot, tally
from tests.support.ledger import day
from tests.support.processes import command_env, manage_py
from tests.support.reference import ReferenceLedger, documents_from_database
from tests.support.relay_support import HOLD_LOCK, first_seen_order, marking_held

WORKERS = 4
RELAYS = 2
DOCUMENTS = 5_000


def start_relay(bootstrap: str, log: Path) -> subprocess.Popen[str]:
    """A relay (`publish_outbox --loop`) whose JSON log lines go to `log`."""
    env = {k: v for k, v in command_env(RELAY_ROLE).items() if not k.startswith("OUTBOX_")}
    env.update(KAFKA_BOOTSTRAP_SERVERS=bootstrap, OUTBOX_DELIVERY_TIMEOUT="2s",
               OUTBOX_POLL_INTERVAL="200ms",
               OUTBOX_BACKOFF_INITIAL="100ms", OUTBOX_BACKOFF_MAX="500ms",
               OUTBOX_SHUTDOWN_GRACE="2s", OUTBOX_BATCH_SIZE="50")
    with log.open("w") as stderr:
        return subprocess.Popen([*manage_py(), "publish_outbox", "--loop"], env=env, text=True,
                                stdout=subprocess.DEVNULL, stderr=stderr)


def stop(relay: subprocess.Popen[str]) -> int:
    relay.send_signal(signal.SIGTERM)
    return relay.wait(timeout=60)


def logged(log: Path, event: str) -> list[dict[str, Any]]:
    """A relay's log lines of `event`."""
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == event]


def relay_id(log: Path) -> str:
    wait_until(lambda: bool(logged(log, "relay started")), timeout=60, what="the relay to start")
    return str(logged(log, "relay started")[0]["relay_id"])


def unpublished() -> int:
    return int(scalar("select count(*) from outbox_messages m where outbox_published_at(m) is null"))


def published() -> int:
    return int(scalar("select count(*) from outbox_messages m"
                      " where outbox_published_at(m) is not null"))


def relays_waiting_on_their_mark() -> int:
    """Relay sessions on the test database that wait on `marking_held`'s lock."""
    return int(scalar("select count(*) from pg_locks l join pg_stat_activity a using (pid)"
                      " where not l.granted and l.locktype = 'advisory' and l.classid = 0"
                      " and l.objid = %s and a.usename = %s and a.datname = %s",
                      (HOLD_LOCK, RELAY_ROLE, connection.settings_dict["NAME"])))


def race(as_of_offset: int) -> None:
    workers = [Worker.start("--as-of", iso(day(as_of_offset)), REMINDER_BATCH_SIZE="100")
               for _ in range(WORKERS)]
    codes = [w.finish(timeout=300)[0] for w in workers]
    assert codes == [0] * WORKERS, [w.lines[-3:] for w in workers]


@dataclass
class Relays:
    """The relay processes (the stopped leader replaced by a third), their logs (one a process
    started) and the exit codes of those stopped with SIGTERM."""

    bootstrap: str
    logs: list[Path]
    processes: list[subprocess.Popen[str]]
    sigterm_codes: list[int] = field(default_factory=list)

    @classmethod
    def start(cls, bootstrap: str, tmp_path: Path) -> "Relays":
        logs = [tmp_path / f"relay-{n}.log" for n in range(RELAYS + 1)]
        return cls(bootstrap, logs, [start_relay(bootstrap, logs[n]) for n in range(RELAYS)])

    def stop_all(self) -> None:
        self.sigterm_codes += [stop(relay) for relay in self.processes]

    def published(self) -> list[int]:
        """What each relay process said it published when it stopped."""
        return [sum(int(e["published"]) for e in logged(log, "relay stopped"))
                for log in self.logs]


@dataclass
class Outage:
    """What the broker outage and the SIGTERM left: the rows that waited for the broker, and
    what the stopped leader published."""

    rows_waiting: int
    leader_published: int = 0


@pytest.mark.slow
def test_workers_and_relays_racing_through_a_broker_outage_and_a_sigterm_lose_nothing(
    documents: Documents, kafka: MockKafkaCluster, tmp_path: Path,
) -> None:
    loaded = load_spread_documents(DOCUMENTS, around=day(-2), seed=41)
    before = documents_md5()
    docs = documents_from_database()
    model = ReferenceLedger()
    relays = Relays.start(kafka.bootstrap_servers, tmp_path)
    try:
        # Day 1: the broker goes down while the relays publish what the workers write.
        outage = race_while_the_broker_goes_down(kafka)
        outage.leader_published = sigterm_the_leader_with_its_batch_in_flight(kafka, relays)
        wait_until(lambda: unpublished() == 0, timeout=180, what="the outbox to drain")
        model.run(docs, day(-2), DEFAULT_THRESHOLDS)

        # Day 2: racing again, relays running.
        race(-1)
        wait_until(lambda: unpublished() == 0, timeout=180, what="the outbox to drain")
        model.run(docs, day(-1), DEFAULT_THRESHOLDS)
    finally:
        relays.stop_all()

    assert relays.sigterm_codes == [0] * (RELAYS + 1)
    snap = snapshot()
    figures = tally(snap, model)
    rows = outbox_rows()
    records = read_topic(kafka.bootstrap_servers, timeout=60)
    record_the_race(loaded, outage, relays, rows, records, figures=figures)
    check_invariants(documents_before=before, model=model, snap=snap)
    # Both first relays published: the leader until its SIGTERM, the standby once it took over.
    published_per_relay = relays.published()
    assert all(n > 0 for n in published_per_relay[:RELAYS]), published_per_relay
    check_every_event_on_the_topic_as_written_in_order_per_owner(rows, records)
    assert_outbox_matches_contract()


def race_while_the_broker_goes_down(kafka: MockKafkaCluster) -> Outage:
    """The workers race while the relays publish; the broker goes down in the middle of it."""
    workers = [Worker.start("--as-of", iso(day(-2)), REMINDER_BATCH_SIZE="100")
               for _ in range(WORKERS)]
    wait_until(lambda: published() >= 50, timeout=120, what="the relays to publish")
    kafka.set_down()
    codes = [w.finish(timeout=300)[0] for w in workers]
    assert codes == [0] * WORKERS, [w.lines[-3:] for w in workers]
    waiting = unpublished()
    assert waiting > 0  # the rows wait for the broker
    return Outage(rows_waiting=waiting)


def sigterm_the_leader_with_its_batch_in_flight(kafka: MockKafkaCluster, relays: Relays) -> int:
    """The broker comes back; the leading relay's marks wait on a lock this test holds, so it
    is stopped with SIGTERM while its batch is produced and not marked. The standby takes over
    and a new relay replaces the stopped one. What the stopped leader published."""
    logs = relays.logs
    with marking_held():
        kafka.set_up()
        wait_until(lambda: relays_waiting_on_their_mark() == 1, timeout=120,
                   what="the leading relay to wait on its mark")
        [leader] = [n for n in range(RELAYS) if logged(logs[n], "relay leading")]
        standby = RELAYS - 1 - leader
        assert logged(logs[standby], "another relay leads, standing by")
        marked_before = published()  # all by the leader: the standby has not led yet
        relays.processes[leader].send_signal(signal.SIGTERM)
        wait_until(lambda: bool(logged(logs[leader], "stop requested")), timeout=30,
                   what="the relay to take the signal with its batch in flight")
    # a second SIGTERM would kill it
    relays.sigterm_codes.append(relays.processes[leader].wait(timeout=60))
    # Its batch in flight was recorded before it stopped, and the standby took over.
    leader_published = int(logged(logs[leader], "relay stopped")[0]["published"])
    assert leader_published > marked_before
    wait_until(lambda: bool(logged(logs[standby], "relay leading")), timeout=60,
               what="the standby to take over")
    relays.processes[leader] = start_relay(relays.bootstrap, logs[RELAYS])
    return leader_published


def stream_order(rows: dict[str, tuple[str, object]]) -> dict[str, list[str]]:
    """Per key, its message ids in the order the workers wrote them."""
    expected_order: dict[str, list[str]] = {}
    for message_id, (key, _payload) in rows.items():  # rows are in stream order
        expected_order.setdefault(key, []).append(message_id)
    return expected_order


def record_the_race(loaded: int, outage: Outage, relays: Relays,
                    rows: dict[str, tuple[str, object]], records: list[Record], *,
                    figures: dict[str, int]) -> None:
    """The chaos report's figures (before any assertion on them, so a failure has them too)."""
    copies = Counter(r.message_id for r in records)
    expected_order = stream_order(rows)
    seen_order = first_seen_order(records)
    chaos_report.record(
        "relay: 4 workers + 2 relays, broker down, SIGTERM", documents=loaded, days=2,
        worker_runs=2 * WORKERS, relay_processes=RELAYS + 1, broker_outages=1,
        rows_waiting_during_outage=outage.rows_waiting,
        relay_sigterms=len(relays.sigterm_codes),
        published_by_the_stopped_leader=outage.leader_published,
        published_per_relay=relays.published(), events=len(rows), records_on_topic=len(records),
        redelivered=sum(n - 1 for n in copies.values()),
        lost=len(set(rows) - set(copies)), unknown_on_topic=len(set(copies) - set(rows)),
        out_of_order_keys=sum(1 for k in expected_order if seen_order.get(k) != expected_order[k]),
        **{f"ledger_{name}": value for name, value in figures.items()})


def check_every_event_on_the_topic_as_written_in_order_per_owner(
    rows: dict[str, tuple[str, object]], records: list[Record]
) -> None:
    """At least once, the same message id on a redelivery, in the stream's order per key."""
    copies = Counter(r.message_id for r in records)
    assert set(copies) == set(rows), "lost or unknown messages on the topic"
    for record in records:
        assert record.json() == rows[record.message_id][1]
    assert first_seen_order(records) == stream_order(rows)


def outbox_rows() -> dict[str, tuple[str, object]]:
    """message id -> (key, payload), in the order the workers wrote them (the stream's)."""
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        cursor.execute("select id, message_key, payload from outbox_messages"
                       " order by txid, seq")
        return {str(i): (k, json.loads(p) if isinstance(p, str) else p)
                for i, k, p in cursor.fetchall()}


def test_relay_role_reads_no_document_and_writes_no_ledger_or_event(documents: Documents) -> None:
    documents(expires_at=day(3))
    refused = 0
    with psycopg.connect(test_database_url(RELAY_ROLE), autocommit=True) as conn:
        for sql in (
            "select id from profile.person_documents limit 1",
            "select payload_cipher from profile.person_documents limit 1",
            "update profile.person_documents set type = type",
            "select * from profile.document_expiry_reminders limit 1",
            "delete from profile.document_expiry_reminders",
            "insert into profile.outbox_messages (id) values (gen_random_uuid())",
        ):
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(sql)
            refused += 1
        assert conn.execute("select count(*) from profile.outbox_messages").fetchone() == (0,)
    assert outbox_count() == 0
    chaos_report.record("security (least-privilege relay role)", statements_refused=refused)
