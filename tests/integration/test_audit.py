"""manage.py audit_reminders (audit/): each check finds the fault it is for, made by a real
fault on real PostgreSQL and a real broker process (Tansu), and a clean database finds
nothing. The library runs as the audit's read-only role; the command as a subprocess."""

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from django.db import connection, transaction
from prometheus_client.parser import text_string_to_metric_families

from audit.against_topic import TopicReader
from audit.checks import AuditOptions, run_audit
from audit.report import AuditReport, Status, render_text
from audit.window import WindowError
from core.roles import AUDITOR_ROLE
from devtools.demo_data import PersonDocument
from devtools.mock_kafka import MockKafkaCluster
from outbox.relay import Relay
from reminders import events
from tests.acceptance.test_kafka_security import tls_env
from tests.acceptance.test_relay_process import run_relay
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import CycleRunner, as_role
from tests.support.exported_metrics import scrape_process
from tests.support.factories import Documents
from tests.support.ledger import AS_OF, day, expiring_in
from tests.support.processes import command_env, run_command
from tests.support.relay_support import as_relay, insert_outbox, relay_settings
from tests.support.tansu_support import Certificates, TansuBroker


@pytest.fixture(autouse=True)
def position_restored(transactional_db: None) -> Iterator[None]:
    """The relay's position row outlives a test (the flush between tests empties only the
    model's tables), and some tests here move it: each gets it back as it found it."""
    [saved] = sql("select txid, seq, system_identifier, txid_offset from outbox_relay_position")
    yield
    sql("update outbox_relay_position set (txid, seq, system_identifier, txid_offset,"
        " previous_system_identifier, cluster_changed_at) = (%s, %s, %s, %s, null, null)",
        tuple(saved))


def audit(*, topic: TansuBroker | None = None, as_of: datetime | None = None,
          **options: Any) -> AuditReport:
    """The audit as of now (or `as_of`), as the auditor's role."""
    reader = TopicReader(relay_settings(topic.bootstrap_servers), timeout_s=30) if topic else None
    with as_role(AUDITOR_ROLE):
        return run_audit(AuditOptions(as_of=as_of or datetime.now(UTC), topic_reader=reader,
                                      **options))


def found(report: AuditReport) -> dict[str, int]:
    return {f.code: f.count for c in report.checks for f in c.findings}


def ids(report: AuditReport, code: str, key: str) -> set[str]:
    return {str(i[key]) for c in report.checks for f in [*c.findings, *c.noted]
            if f.code == code for i in f.ids}


def noted(report: AuditReport) -> dict[str, int]:
    """What the audit counted apart from its findings (informational codes)."""
    return {f.code: f.count for c in report.checks for f in c.noted}


def owners_already_queued() -> int:
    """The run history's count of owners whose reminder the outbox already held."""
    [(total,)] = sql("select coalesce(sum(owners_already_queued), 0)::int"
                     " from document_expiry_reminder_runs")
    return int(total)


def sql(statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """As the table owner: the faults are made by hand, as an operator's mistake would."""
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return list(cursor.fetchall()) if cursor.description else []


def loop_cycle(run: CycleRunner, as_of: datetime = AS_OF) -> Any:
    return run(as_of, tick=as_of)


def some_documents(documents: Documents) -> list[PersonDocument]:
    made = [documents(expires_at=expiring_in(days)) for days in (29, 6, 0, -3)]
    shared = documents(expires_at=expiring_in(3))
    made += [shared, documents(expires_at=expiring_in(1), owner_user_id=shared.owner_user_id)]
    documents(expires_at=expiring_in(200))  # not due
    return made


def publish(tansu: TansuBroker, **overrides: Any) -> Any:
    with as_relay():
        return Relay(relay_settings(tansu.bootstrap_servers, **overrides)).run_pass()


def move_position_to_end() -> None:
    """The stream position past every row, as a position from another cluster would be:
    the table says published, nothing was sent."""
    sql("update outbox_relay_position set (txid, seq) ="
        " (select max(txid), max(seq) from outbox_messages)")
    sql("insert into outbox_relay_batches (upto_txid, upto_seq, messages)"
        " select txid, seq, 1 from outbox_relay_position")


@pytest.mark.slow
def test_a_clean_database_and_topic_have_no_findings(
    run: CycleRunner, documents: Documents, tansu: TansuBroker
) -> None:
    some_documents(documents)
    loop_cycle(run)
    publish(tansu)

    report = audit(topic=tansu)

    assert found(report) == {}, report.as_dict()
    assert [c.status for c in report.checks] == [Status.CLEAN] * 6
    ledger = report.check("ledger_outbox").examined
    assert ledger == {"runs": 1, "events": 5, "event_items": 6, "notified_markers": 6}
    assert report.check("topic").examined["records"] == 5
    assert report.check("left_behind").examined == {"due_unmarked": 0, "changed_since": 0}
    assert_outbox_matches_contract()


def test_a_deleted_event_leaves_its_markers_without_an_event(
    run: CycleRunner, documents: Documents
) -> None:
    made = some_documents(documents)
    loop_cycle(run)
    victim = made[0]
    sql("delete from outbox_messages where aggregate_id = %s", (str(victim.owner_user_id),))

    report = audit()

    assert found(report) == {"marker_without_event": 1}
    assert ids(report, "marker_without_event", "document") == {str(victim.id)}
    assert_outbox_matches_contract()


def test_a_deleted_marker_leaves_its_event_without_a_marker_and_the_document_due(
    run: CycleRunner, documents: Documents
) -> None:
    made = some_documents(documents)
    loop_cycle(run)
    victim = made[1]
    sql("delete from document_expiry_reminders where document_id = %s and notified", (victim.id,))

    report = audit()

    assert found(report) == {"event_without_marker": 1, "left_behind": 1}
    assert ids(report, "event_without_marker", "document") == {str(victim.id)}
    assert ids(report, "left_behind", "document") == {str(victim.id)}
    assert_outbox_matches_contract()


def test_a_second_run_that_notifies_again_is_a_duplicate(
    run: CycleRunner, documents: Documents
) -> None:
    made = some_documents(documents)
    loop_cycle(run)
    victim = made[4]
    # the ledger loses one of an owner's two reminded documents' markers (a ledger restored by
    # hand, in part): the next run reminds that document again, in an event of its own (its
    # own message id: a ledger that lost the owner's whole reminder writes the same one again,
    # under the same id, and the outbox keeps one row: docs/design.md §2.6)
    sql("delete from document_expiry_reminders where document_id = %s", (victim.id,))
    run(AS_OF + timedelta(hours=1))

    report = audit()

    assert found(report) == {"notified_twice": 1, "event_without_marker": 1}
    assert ids(report, "notified_twice", "document") == {str(victim.id)}
    # a reminder of its own (a new id), not the one the outbox held: not already queued
    assert noted(report) == {} and owners_already_queued() == 0
    assert_outbox_matches_contract()


def test_a_whole_reminder_claimed_again_after_its_markers_were_lost_is_already_queued(
    run: CycleRunner, documents: Documents
) -> None:
    made = some_documents(documents)
    first = loop_cycle(run)
    # two owners' markers lost, their outbox rows kept (the ledger restored from before the
    # cycle, the outbox not): one of them has two documents in its reminder
    lost = [str(made[0].owner_user_id), str(made[4].owner_user_id)]
    queued = dict(sql("select aggregate_id, id::text from outbox_messages"
                      " where aggregate_id = any(%s)", (lost,)))
    sql("delete from document_expiry_reminders where owner_user_id::text = any(%s)", (lost,))
    again = run(AS_OF + timedelta(hours=1))
    assert (again.owners_already_queued, again.owners_notified) == (2, 0)

    report = audit()

    assert found(report) == {}, report.as_dict()  # no marker_without_event, event_without_marker
    assert report.check("ledger_outbox").status is Status.CLEAN
    assert noted(report) == {"already_queued": owners_already_queued()} == {"already_queued": 2}
    [listed] = report.check("ledger_outbox").noted
    assert {(i["run"], i["queued_by"], i["event"]) for i in listed.ids} == {
        (str(again.run_id), str(first.run_id), queued[owner]) for owner in lost}
    assert report.findings == 0 and "audit found nothing in 5 of 6 checks" in report.verdict
    assert "already_queued: 2 (noted): " in render_text(report)
    assert_outbox_matches_contract()


def test_an_audit_before_the_run_that_queued_a_reminder_again_finds_nothing_either(
    run: CycleRunner, documents: Documents
) -> None:
    made = some_documents(documents)
    loop_cycle(run)
    lost = str(made[4].owner_user_id)
    sql("delete from document_expiry_reminders where owner_user_id::text = %s", (lost,))
    before_it = datetime.now(UTC)
    assert run(AS_OF + timedelta(hours=1)).owners_already_queued == 1

    # the run that holds the markers now is after the window: the first event's items keep no
    # marker of their run, and still are no finding; nothing is counted for the window
    report = audit(as_of=before_it)

    assert (found(report), noted(report)) == ({}, {}), report.as_dict()
    assert_outbox_matches_contract()


def test_a_due_document_an_unfinished_cycle_left_unmarked_is_left_behind(
    run: CycleRunner, documents: Documents
) -> None:
    made = some_documents(documents)
    changed = documents(expires_at=expiring_in(5))
    loop_cycle(run)
    victim = made[3]
    # an owner the cycle never reached: no marker and no event, as a cycle stopped before it
    # would leave it (here the cycle recorded success all the same)
    for table, column in (("document_expiry_reminders", "owner_user_id"),
                          ("outbox_messages", "aggregate_id")):
        sql(f"delete from {table} where {column}::text = %s", (str(victim.owner_user_id),))
    # a document changed since the cycle started: excepted, counted apart
    sql("delete from document_expiry_reminders where document_id = %s", (changed.id,))
    sql("delete from outbox_messages where aggregate_id = %s", (str(changed.owner_user_id),))
    sql("update person_documents set updated_at = now() where id = %s", (changed.id,))

    report = audit()

    assert found(report) == {"left_behind": 1}
    assert ids(report, "left_behind", "document") == {str(victim.id)}
    assert report.check("left_behind").examined == {"due_unmarked": 1, "changed_since": 1}
    assert_outbox_matches_contract()


def test_left_behind_is_not_checked_without_a_succeeded_loop_cycle(
    run: CycleRunner, documents: Documents
) -> None:
    some_documents(documents)
    run(AS_OF)  # a manual run

    assert audit().check("left_behind").status is Status.NOT_CHECKED
    assert_outbox_matches_contract()


def test_an_event_that_waited_past_the_bound_is_found(
    run: CycleRunner, documents: Documents, tansu: TansuBroker
) -> None:
    made = some_documents(documents)
    loop_cycle(run)
    late = str(made[0].owner_user_id)
    # the relay was down for 30 hours when this event was written
    sql("update outbox_messages set created_at = now() - interval '30 hours'"
        " where aggregate_id = %s", (late,))

    report = audit()
    assert found(report) == {"waited_too_long": 1}
    assert ids(report, "waited_too_long", "key") == {late}
    # published late is as late
    publish(tansu)
    assert found(audit()) == {"waited_too_long": 1}
    assert found(audit(max_wait=timedelta(hours=31))) == {}
    assert_outbox_matches_contract()


@pytest.mark.slow
def test_a_parked_event_is_listed_with_its_error(
    transactional_db: None, tansu: TansuBroker
) -> None:
    # an event the broker refuses (Tansu validates the contract): the relay parks it
    bad = insert_outbox("owner-with-a-bad-event", created_at=datetime.now(UTC),
                        payload={"ownerUserId": 12})
    publish(tansu, max_attempts=1)

    report = audit()

    assert found(report) == {"parked": 1}
    [parked] = report.check("parked").findings[0].ids
    assert parked["event"] == str(bad.id) and parked["error"].startswith("INVALID_RECORD")


def test_a_parked_event_off_the_topic_allowlist_is_a_finding_of_its_own(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    """A row naming a topic OUTBOX_TOPICS does not (written with the worker's credentials) is
    parked by the relay and listed as `parked_off_allowlist`, with its topic, by the command
    that reads the relay's OUTBOX_TOPICS; on the allowlist, it would be a plain `parked`."""
    other = "pin.payments.transfers.v1"
    row = insert_outbox("owner-writing-elsewhere", created_at=datetime.now(UTC), topic=other,
                        payload={"ownerUserId": "owner-writing-elsewhere"})
    with as_relay():
        assert Relay(relay_settings(kafka.bootstrap_servers)).run_pass().parked == 1

    done = audit_command("--format", "json")
    off_list = audit_command("--format", "json", OUTBOX_TOPICS=f"{events.TOPIC},{other}")

    assert done.returncode == 1, done.stderr
    [parked] = [c for c in json.loads(done.stdout)["checks"] if c["name"] == "parked"]
    assert parked["examined"] == {"parked": 1}
    assert [(f["code"], f["count"]) for f in parked["findings"]] == [("parked_off_allowlist", 1)]
    [listed] = parked["findings"][0]["ids"]
    assert (listed["event"], listed["topic"]) == (str(row.id), other)
    assert listed["error"].startswith(f"topic {other!r} is not on OUTBOX_TOPICS")
    [allowed] = [c for c in json.loads(off_list.stdout)["checks"] if c["name"] == "parked"]
    assert [(f["code"], f["count"]) for f in allowed["findings"]] == [("parked", 1)]


@pytest.mark.slow
def test_events_the_table_says_published_but_never_sent_are_missing_from_the_topic(
    run: CycleRunner, documents: Documents, tansu: TansuBroker
) -> None:
    some_documents(documents)
    loop_cycle(run)
    publish(tansu)
    documents(expires_at=expiring_in(2))
    later = loop_cycle(run, day(1))
    move_position_to_end()  # the position says published; the relay never sent them

    report = audit(topic=tansu)

    never_sent = {r[0] for r in sql("select id::text from outbox_messages where"
                                    " headers ->> 'correlation_id' = %s", (str(later.run_id),))}
    assert found(report) == {"missing_from_topic": len(never_sent)}
    assert ids(report, "missing_from_topic", "event") == never_sent
    assert_outbox_matches_contract()


@pytest.mark.slow
def test_a_topic_recreated_empty_misses_every_event(
    run: CycleRunner, documents: Documents, tansu: TansuBroker
) -> None:
    some_documents(documents)
    loop_cycle(run)
    publish(tansu)
    tansu.kill()
    tansu.start()  # memory storage: the broker comes back with no topic at all

    report = audit(topic=tansu)

    assert found(report) == {"missing_from_topic": 5}
    assert_outbox_matches_contract()


@pytest.mark.slow
def test_records_on_the_topic_the_table_does_not_hold_and_duplicates_and_disorder(
    run: CycleRunner, documents: Documents, tansu: TansuBroker
) -> None:
    made = some_documents(documents)
    loop_cycle(run)
    owner = str(made[0].owner_user_id)
    documents(expires_at=expiring_in(8), owner_user_id=made[0].owner_user_id)
    loop_cycle(run, day(1))  # a second event for the owner: 8 days left crosses 7 on day 1
    rows = sql("select id::text, payload::text, headers::text from outbox_messages"
               " where message_key = %s order by txid, seq", (owner,))
    assert len(rows) == 2
    # the relay's partitioner (outbox.kafka), so that the owner's records share its partition
    producer = Producer({"bootstrap.servers": tansu.bootstrap_servers,
                         "partitioner": "murmur2_random"})
    # the owner's second event sent ahead of the first (a second relay on another database)
    second_id, second_payload, second_headers = rows[1]
    producer.produce(events.TOPIC, key=owner, value=second_payload,
                     headers={k: str(v) for k, v in json.loads(second_headers).items()})
    # and a record no outbox row is behind
    stranger = str(uuid.uuid4())
    producer.produce(events.TOPIC, key=owner, value=rows[0][1],
                     headers={**{k: str(v) for k, v in json.loads(rows[0][2]).items()},
                              "message_id": stranger})
    assert producer.flush(10) == 0
    publish(tansu)

    report = audit(topic=tansu)

    assert found(report) == {"unknown_on_topic": 1, "duplicated_on_topic": 1, "out_of_order": 1}
    assert ids(report, "unknown_on_topic", "event") == {stranger}
    assert ids(report, "duplicated_on_topic", "event") == {second_id}
    assert ids(report, "out_of_order", "key") == {owner}
    assert_outbox_matches_contract()


@pytest.mark.slow
def test_a_position_moved_back_duplicates_every_event_on_the_topic(
    run: CycleRunner, documents: Documents, tansu: TansuBroker
) -> None:
    some_documents(documents)
    loop_cycle(run)
    publish(tansu)
    # the relay's state restored from before its batches (the rows were sent already)
    sql("update outbox_relay_position set (txid, seq) = ('0'::xid8, 0)")
    sql("delete from outbox_relay_batches")
    publish(tansu)

    assert found(audit(topic=tansu)) == {"duplicated_on_topic": 5}
    assert_outbox_matches_contract()


def test_a_position_stamped_on_another_cluster_is_found(
    run: CycleRunner, documents: Documents
) -> None:
    some_documents(documents)
    loop_cycle(run)
    # as a dump/restore into a new cluster leaves it before the relay runs there
    sql("update outbox_relay_position set system_identifier = 42")

    report = audit()

    assert found(report) == {"position_of_another_cluster": 1}
    [shown] = report.check("relay_position").findings[0].ids
    assert shown["recorded_system"] == 42 and shown["this_system"] != 42
    assert_outbox_matches_contract()


def test_a_position_ahead_of_the_clusters_ids_is_found(
    run: CycleRunner, documents: Documents
) -> None:
    some_documents(documents)
    loop_cycle(run)
    # ids far ahead of this cluster's (a restore of another cluster's rows over this one)
    sql("update outbox_relay_position set txid = (txid::text::numeric + 1e12)::text::xid8")

    assert found(audit()) == {"position_ahead": 1}
    assert_outbox_matches_contract()


# --- what the audit could not check -------------------------------------------------------

@pytest.mark.parametrize(("as_of_ago", "since", "why"), [
    (timedelta(days=10), timedelta(days=7), "is at or before"),  # starts after it ends
    (timedelta(days=8), timedelta(days=1), "is at or before"),  # wholly older than retention
    (timedelta(0), timedelta(0), "is empty"),
], ids=["inverted", "wholly-pruned", "empty"])
def test_a_window_with_nothing_left_to_audit_is_refused_not_clean(
    run: CycleRunner, documents: Documents, as_of_ago: timedelta, since: timedelta, why: str
) -> None:
    some_documents(documents)
    loop_cycle(run)

    with pytest.raises(WindowError, match=f"nothing to audit: .*{why}.*; pass an? --"):
        audit(as_of=datetime.now(UTC) - as_of_ago, since=since,
              outbox_retention=timedelta(days=7))
    assert_outbox_matches_contract()


def test_a_window_partly_older_than_the_retention_is_cut_and_says_so(
    run: CycleRunner, documents: Documents
) -> None:
    some_documents(documents)
    loop_cycle(run)

    report = audit(since=timedelta(days=30), outbox_retention=timedelta(days=7))

    [note] = report.notes
    assert note.startswith(f"window starts at {report.since.isoformat()}")
    assert report.database_now - report.since == timedelta(days=7)
    assert report.check("ledger_outbox").status is Status.CLEAN
    assert_outbox_matches_contract()


def test_checks_with_nothing_to_examine_are_not_checked_with_their_reason(
    transactional_db: None
) -> None:
    report = audit()

    not_checked = {c.name: c.note for c in report.checks if c.status is Status.NOT_CHECKED}
    assert not_checked == {
        "ledger_outbox": "no run notified a marker or wrote an event in the window",
        "left_behind": "no succeeded loop cycle in the run history",
        "relay_waits": "no event in the window and none waiting for the relay",
        "topic": "not asked (--against-topic)",
    }
    assert report.check("ledger_outbox").examined["runs"] == 0
    assert report.findings == 0
    assert report.verdict == ("audit found nothing in 2 of 6 checks; not checked: "
                              "ledger_outbox, left_behind, relay_waits, topic")
    assert "clean" not in report.verdict


@pytest.mark.slow
def test_the_topic_is_not_checked_when_neither_side_has_anything_in_the_window(
    transactional_db: None, tansu: TansuBroker
) -> None:
    topic = audit(topic=tansu).check("topic")

    assert topic.status is Status.NOT_CHECKED
    assert topic.note == "no event published in the window and no record in it on the topic"
    assert topic.examined["records"] == 0 and topic.examined["published_events"] == 0


# --- the command ---------------------------------------------------------------------------

def audit_command(*args: str, **env: str) -> Any:
    return run_command("audit_reminders", *args,
                       env=command_env(AUDITOR_ROLE, **env), timeout=120)


@pytest.mark.slow
def test_the_command_exits_0_clean_1_with_findings_and_prints_json(
    run: CycleRunner, documents: Documents, tansu: TansuBroker
) -> None:
    made = some_documents(documents)
    loop_cycle(run)
    publish(tansu)

    clean = audit_command("--against-topic", KAFKA_BOOTSTRAP_SERVERS=tansu.bootstrap_servers)
    assert clean.returncode == 0, clean.stderr
    assert "audit clean: no findings" in clean.stdout

    sql("delete from outbox_messages where aggregate_id = %s", (str(made[0].owner_user_id),))
    dirty = audit_command("--format", "json")
    assert dirty.returncode == 1, dirty.stderr
    body = json.loads(dirty.stdout)
    assert body["findings"] == 1 and body["not_checked"] == ["topic"]
    assert body["verdict"] == "audit found 1 finding(s)"
    [ledger] = [c for c in body["checks"] if c["name"] == "ledger_outbox"]
    [finding] = ledger["findings"]
    assert finding["code"] == "marker_without_event"
    assert finding["ids"][0]["document"] == str(made[0].id)
    assert finding["runbook"] == "docs/operations.md#audit-marker-without-event"
    assert "audit found 1 finding(s)" in dirty.stderr

    text = audit_command()
    assert text.returncode == 1
    assert "marker_without_event: 1" in text.stdout and "do: " in text.stdout
    assert_outbox_matches_contract()


def test_the_command_refuses_an_as_of_older_than_the_retention_with_exit_2_and_one_line(
    run: CycleRunner, documents: Documents
) -> None:
    some_documents(documents)
    loop_cycle(run)
    as_of = (datetime.now(UTC) - timedelta(days=30)).date().isoformat()

    refused = audit_command("--as-of", as_of, OUTBOX_RETENTION="7d")

    assert refused.returncode == 2, refused.stderr
    assert refused.stdout == ""  # no report, no verdict: nothing was audited
    [line] = refused.stderr.strip().splitlines()
    assert f"nothing to audit: --as-of {as_of}T00:00:00+00:00 is at or before" in line
    assert "OUTBOX_RETENTION (7 days, 0:00:00)" in line and "pass an --as-of after" in line
    assert_outbox_matches_contract()


def test_the_command_with_nothing_to_examine_exits_0_and_never_says_clean(
    transactional_db: None
) -> None:
    done = audit_command()

    assert done.returncode == 0, done.stderr
    assert "[not checked] ledger and outbox agree: 0 runs" in done.stdout
    assert "no run notified a marker or wrote an event in the window" in done.stdout
    assert done.stdout.splitlines()[-1].startswith("audit found nothing in 2 of 6 checks;")
    assert "clean: no findings" not in done.stdout


def test_the_command_exits_2_on_bad_configuration(transactional_db: None) -> None:
    bad = audit_command("--since", "forever")
    assert bad.returncode == 2 and "--since" in bad.stderr
    no_kafka = audit_command("--against-topic")
    assert no_kafka.returncode == 2 and "KAFKA_BOOTSTRAP_SERVERS" in no_kafka.stderr


def test_the_command_exits_3_when_the_database_or_the_broker_is_unavailable(
    transactional_db: None
) -> None:
    env = command_env(AUDITOR_ROLE)
    env["DATABASE_URL"] = "postgres://pin_reminder_auditor@127.0.0.1:1/nowhere"
    down = run_command("audit_reminders", env=env, timeout=60)
    assert down.returncode == 3 and "database unreachable" in down.stderr

    broker = audit_command("--against-topic", "--kafka-timeout", "3s",
                           KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1")
    assert broker.returncode == 3 and "kafka unavailable" in broker.stderr


def test_the_auditor_role_cannot_write_or_read_the_cipher(transactional_db: None) -> None:
    with transaction.atomic(), as_role(AUDITOR_ROLE), connection.cursor() as cursor:
        for statement in ("select payload_cipher from person_documents",
                          "select number_mask from person_documents",
                          "delete from document_expiry_reminders",
                          "update outbox_relay_position set seq = 0"):
            cursor.execute("savepoint probe")
            with pytest.raises(Exception, match="permission denied"):
                cursor.execute(statement)
            cursor.execute("rollback to savepoint probe")


@pytest.mark.slow
def test_the_loop_serves_the_last_audits_findings_per_check(
    run: CycleRunner, documents: Documents, tmp_path: Path
) -> None:
    made = some_documents(documents)
    loop_cycle(run)
    sql("delete from outbox_messages where aggregate_id = %s", (str(made[0].owner_user_id),))

    text = scrape_process(
        ["audit_reminders", "--loop"], command_env(AUDITOR_ROLE), tmp_path / "audit.log",
        lambda text, log: '"event":"audit completed"' in log
        and "profile_document_expiry_reminder_audit_findings{" in text)

    findings = {(s.labels["check"], s.labels["finding"]): s.value
                for family in text_string_to_metric_families(text)
                if family.name == "profile_document_expiry_reminder_audit_findings"
                for s in family.samples}
    assert findings[("ledger_outbox", "marker_without_event")] == 1
    assert findings[("ledger_outbox", "notified_twice")] == 0
    assert findings[("parked", "parked")] == 0
    assert not any(check == "topic" for check, _ in findings)  # not asked: no series
    assert "profile_document_expiry_reminder_audit_last_completed_timestamp_seconds " in text
    completed = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()
                 if '"event":"audit completed"' in line]
    assert completed[0]["findings"] == 1 and completed[0]["by_check"]["ledger_outbox"] == 1
    assert_outbox_matches_contract()


@pytest.mark.slow
def test_against_the_topic_over_tls_with_the_relays_settings_and_a_refusal_exits_2(
    run: CycleRunner, documents: Documents, tansu_tls: TansuBroker, certificates: Certificates
) -> None:
    some_documents(documents)
    loop_cycle(run)
    env = tls_env(tansu_tls.bootstrap_servers, certificates)
    assert run_relay(env).returncode == 0
    audit_env = {**env, "DATABASE_URL": command_env(AUDITOR_ROLE)["DATABASE_URL"]}

    done = run_command("audit_reminders", "--against-topic", "--format", "json", env=audit_env)
    assert done.returncode == 0, done.stderr  # clean: nothing found, the topic read
    body = json.loads(done.stdout)
    [topic] = [c for c in body["checks"] if c["name"] == "topic"]
    assert topic["status"] == "clean" and topic["examined"]["records"] == 5, done.stderr

    refused = run_command("audit_reminders", "--against-topic", "--kafka-timeout", "20s",
                          env={**audit_env, "KAFKA_SSL_CA_LOCATION": str(certificates.other_ca)})
    assert refused.returncode == 4, refused.stderr
    assert "kafka refused the audit" in refused.stderr
    assert_outbox_matches_contract()


def test_an_expiry_corrected_back_and_forth_is_each_arming_told_once_no_finding(
    run: CycleRunner, documents: Documents
) -> None:
    doc = documents(expires_at=expiring_in(5))
    for offset, days in enumerate((5, 6, 5, 6)):  # A, B, A, B: four armings, each told once
        sql("update person_documents set expires_at = %s where id = %s",
            (expiring_in(days), doc.id))
        loop_cycle(run, day(offset))

    report = audit()

    # (document, 7, A) and (document, 7, B) are each in two events, of two armings: the marker
    # has had four, so no arming was told twice; the first events' items lost their marker to
    # the later armings, rewritten after them
    assert found(report) == {}, report.as_dict()
    assert report.check("ledger_outbox").examined["events"] == 4
    # the last arming told again (its marker lost, and with it the count of its armings): a
    # duplicate, found
    sql("delete from document_expiry_reminders where document_id = %s", (doc.id,))
    run(day(3) + timedelta(hours=1))
    report = audit()
    assert set(found(report)) == {"notified_twice", "event_without_marker"}
    assert expiring_in(6).date().isoformat() in ids(report, "notified_twice", "expires")
    assert_outbox_matches_contract()
