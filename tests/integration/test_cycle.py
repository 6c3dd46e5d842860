"""The seed's test table (docs/design.md §3), one named test each, on real PostgreSQL as the worker role."""

import logging
import threading
import uuid
from datetime import UTC, datetime, time, timedelta, timezone

import pytest
from django.db import connection

from reminders.models import ReminderRun
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import CycleRunner
from tests.support.factories import Documents
from tests.support.ledger import (
    AS_OF,
    TODAY,
    Marker,
    database_now,
    day,
    documents_checksum,
    events,
    events_for,
    expiring_in,
    markers,
    notified_pairs,
    outbox_refusing,
)


def test_empty_window_is_a_successful_no_op(run: CycleRunner, documents: Documents) -> None:
    documents(expires_at=expiring_in(31))
    documents(expires_at=expiring_in(-91))

    result = run(AS_OF)

    assert result.status == ReminderRun.Status.SUCCEEDED
    assert (result.reminders_sent, result.owners_notified, result.markers_written) == (0, 0, 0)
    assert markers() == set() and events() == []


def test_threshold_crossed_at_seven_days(run: CycleRunner, documents: Documents) -> None:
    doc = documents(expires_at=expiring_in(7))

    result = run(AS_OF)

    assert Marker(doc.id, 7, True) in markers(doc.id)
    [event] = events()
    assert event["ownerUserId"] == str(doc.owner_user_id)
    assert event["remindedAt"] == "2026-11-29T03:00:00Z"
    assert event["documents"] == [{
        "documentId": str(doc.id), "type": "Passport", "numberMask": doc.number_mask,
        "expiresAt": "2026-12-06", "thresholdDays": 7, "daysLeft": 7,
    }]
    assert (result.reminders_sent, result.owners_notified) == (1, 1)
    assert_outbox_matches_contract()


def test_expired_document_is_reminded_at_threshold_zero_once(
    run: CycleRunner, documents: Documents
) -> None:
    doc = documents(expires_at=expiring_in(-3))

    run(AS_OF)
    run(day(1))

    assert markers(doc.id) == {Marker(doc.id, t, t == 0) for t in (30, 7, 1, 0)}
    [event] = events()
    assert event["documents"][0]["thresholdDays"] == 0
    assert event["documents"][0]["daysLeft"] == -3
    assert_outbox_matches_contract()


def test_document_expiring_today_has_zero_days_left(
    run: CycleRunner, documents: Documents
) -> None:
    documents(expires_at=expiring_in(0, at=time(23, 59)))

    run(AS_OF)

    assert [(d["thresholdDays"], d["daysLeft"]) for d in events()[0]["documents"]] == [(0, 0)]
    assert_outbox_matches_contract()


def test_fresh_almost_expired_document_marks_30_and_7_and_notifies_7_only(
    run: CycleRunner, documents: Documents
) -> None:
    doc = documents(expires_at=expiring_in(5))

    result = run(AS_OF)

    assert markers(doc.id) == {Marker(doc.id, 30, False), Marker(doc.id, 7, True)}
    assert notified_pairs() == [(str(doc.id), 7)]
    assert (result.markers_written, result.reminders_sent) == (2, 1)
    assert_outbox_matches_contract()


def test_rerun_on_the_same_data_inserts_nothing_and_sends_nothing(
    run: CycleRunner, documents: Documents
) -> None:
    for days in (30, 7, 1, 0, -5):
        documents(expires_at=expiring_in(days))
    run(AS_OF)
    before = (markers(), events())

    again = run(AS_OF)

    assert (markers(), events()) == before
    assert (again.markers_written, again.reminders_sent, again.owners_notified) == (0, 0, 0)
    assert again.skipped_already_marked == 5
    assert_outbox_matches_contract()


def test_owner_with_three_documents_gets_one_event_listing_three(
    run: CycleRunner, documents: Documents
) -> None:
    owner = uuid.uuid4()
    docs = [documents(owner_user_id=owner, expires_at=expiring_in(d), type=t)
            for d, t in ((25, "Visa"), (6, "Passport"), (-1, "DriverLicense"))]

    run(AS_OF)

    [event] = events()
    assert [d["documentId"] for d in event["documents"]] == [str(docs[2].id), str(docs[1].id),
                                                             str(docs[0].id)]
    assert [d["thresholdDays"] for d in event["documents"]] == [0, 7, 30]
    assert_outbox_matches_contract()


def test_worker_leaves_documents_unchanged_and_logs_no_document_data(
    run: CycleRunner, documents: Documents, caplog: pytest.LogCaptureFixture
) -> None:
    docs = [documents(expires_at=expiring_in(d), number_mask=f"77 ** ****{d:02d}",
                      payload_cipher=f"SECRET-PAYLOAD-{d}".encode()) for d in (1, 7, 20)]
    before = documents_checksum()

    with caplog.at_level(logging.DEBUG, logger="reminders"):
        run(AS_OF)

    assert documents_checksum() == before
    # a record's fields, and the items of a record that stands for a line per item (core.logs)
    logged = caplog.text + "".join(str(getattr(r, "fields", "")) + str(getattr(r, "items", ""))
                                   for r in caplog.records)
    assert "reminder queued" in logged
    for doc in docs:
        assert doc.number_mask is not None and doc.number_mask not in logged
        assert doc.payload_cipher.decode() not in logged
        assert str(doc.id) in logged  # ids are fine, and prove the lines were captured
    for event in events():
        for item in event["documents"]:
            assert set(item) == {"documentId", "type", "numberMask", "expiresAt",
                                 "thresholdDays", "daysLeft"}
    assert_outbox_matches_contract()


def test_document_without_expiry_is_never_reminded(
    run: CycleRunner, documents: Documents
) -> None:
    documents(type="Inn", expires_at=None)
    documents(type="Passport", expires_at=None)

    result = run(AS_OF)

    assert result.window_documents == 0 and markers() == set() and events() == []


def test_archived_and_deleted_documents_are_not_reminded(
    run: CycleRunner, documents: Documents
) -> None:
    documents(expires_at=expiring_in(3), status="Archived")
    documents(expires_at=expiring_in(3), deleted_at=AS_OF - timedelta(days=1))

    run(AS_OF)

    assert markers() == set() and events() == []


def test_prune_deletes_markers_past_retention_and_keeps_active_windows(
    run: CycleRunner, documents: Documents
) -> None:
    old = documents(expires_at=expiring_in(-80))
    live = documents(expires_at=expiring_in(25))
    run(AS_OF)
    assert markers(old.id) and markers(live.id)

    result = run(day(11))  # old expired 91 days before: past the 90-day retention

    assert markers(old.id) == set()
    assert markers(live.id) == {Marker(live.id, 30, True)}
    assert result.pruned == 4
    assert_outbox_matches_contract()


def test_added_threshold_fires_only_where_not_yet_marked(
    run: CycleRunner, documents: Documents
) -> None:
    fresh = documents(expires_at=expiring_in(20))
    run(AS_OF)  # 30 notified
    assert notified_pairs() == [(str(fresh.id), 30)]

    run(day(7), thresholds=(30, 14, 7, 1, 0))  # 13 days left: the new 14 fires

    assert notified_pairs() == [(str(fresh.id), 30), (str(fresh.id), 14)]
    run(day(7), thresholds=(30, 14, 7, 1, 0))
    assert len(notified_pairs()) == 2
    assert_outbox_matches_contract()


def test_stale_threshold_is_marked_silently(run: CycleRunner, documents: Documents) -> None:
    doc = documents(expires_at=expiring_in(5))
    run(AS_OF)  # 30 silent, 7 notified

    result = run(day(1), thresholds=(30, 14, 7, 1, 0))  # 14 crossed, unmarked, but 7 was sent

    assert Marker(doc.id, 14, False) in markers(doc.id)
    assert notified_pairs() == [(str(doc.id), 7)]
    assert (result.markers_written, result.reminders_sent) == (1, 0)
    assert_outbox_matches_contract()


def test_removed_threshold_keeps_its_markers_and_fires_no_more(
    run: CycleRunner, documents: Documents
) -> None:
    doc = documents(expires_at=expiring_in(2))
    run(AS_OF)  # 30, 7 marked; 7 notified
    run(day(1))  # 1 notified

    run(day(2), thresholds=(30, 7))  # 0 removed from the config: expiry day passes silently

    assert Marker(doc.id, 1, True) in markers(doc.id)
    assert {m.threshold_days for m in markers(doc.id)} == {30, 7, 1}
    assert notified_pairs() == [(str(doc.id), 7), (str(doc.id), 1)]
    assert_outbox_matches_contract()


def test_extended_document_leaves_the_window(run: CycleRunner, documents: Documents) -> None:
    doc = documents(expires_at=expiring_in(7))
    run(AS_OF)
    with connection.cursor() as cursor:
        cursor.execute("update person_documents set expires_at = %s where id = %s",
                       (expiring_in(5 * 365), doc.id))

    result = run(day(1))

    assert result.window_documents == 0
    assert notified_pairs() == [(str(doc.id), 7)]
    assert {m.threshold_days for m in markers(doc.id)} == {30, 7}
    assert_outbox_matches_contract()


# --- refinements ----------------------------------------------------------------------------


def test_expired_active_document_stays_quiet_through_and_after_the_prune(
    run: CycleRunner, documents: Documents
) -> None:
    doc = documents(expires_at=expiring_in(-1))
    run(AS_OF)
    assert notified_pairs() == [(str(doc.id), 0)]

    for offset in (1, 2, 30, 88, 89, 90, 91, 92, 120, 400):
        result = run(day(offset))
        assert result.reminders_sent == 0, f"reminded again {offset} days later"
        in_window = offset <= 89  # 90 days of retention after the UTC expiry date
        assert result.window_documents == (1 if in_window else 0), offset
        # The cycle in which the document leaves the scan (offset 90) prunes its markers.
        assert bool(markers(doc.id)) == in_window, offset
    assert notified_pairs() == [(str(doc.id), 0)]
    assert_outbox_matches_contract()


def test_owner_spread_over_the_window_gets_one_event_with_batch_size_two(
    run: CycleRunner, documents: Documents
) -> None:
    owner = uuid.uuid4()
    spread = [documents(owner_user_id=owner, expires_at=expiring_in(d)) for d in (-10, 2, 6, 20, 29)]
    others = [documents(expires_at=expiring_in(d)) for d in (1, 3, 15, 28)]

    result = run(AS_OF, batch_size=2)

    [event] = events_for(owner)
    assert {d["documentId"] for d in event["documents"]} == {str(d.id) for d in spread}
    assert len(events()) == 1 + len(others)
    assert result.owners_notified == 5
    assert_outbox_matches_contract()


def test_events_are_written_most_urgent_owner_first(
    run: CycleRunner, documents: Documents
) -> None:
    later = documents(expires_at=expiring_in(25))
    sooner = documents(expires_at=expiring_in(-2))
    middle = documents(expires_at=expiring_in(6))

    run(AS_OF, batch_size=1, claim_connections=1)

    assert [e["ownerUserId"] for e in events()] == [
        str(sooner.owner_user_id), str(middle.owner_user_id), str(later.owner_user_id)]
    assert_outbox_matches_contract()


def test_on_two_claim_connections_events_are_most_urgent_first_pair_by_pair(
    run: CycleRunner, documents: Documents
) -> None:
    """A pair's two batches run side by side and commit in either order (docs/design.md
    §3.8); the pairs follow the urgency order."""
    later = documents(expires_at=expiring_in(25))
    sooner = documents(expires_at=expiring_in(-2))
    middle = documents(expires_at=expiring_in(6))
    latest = documents(expires_at=expiring_in(28))

    run(AS_OF, batch_size=1, claim_connections=2)

    owners = [e["ownerUserId"] for e in events()]
    assert set(owners[:2]) == {str(sooner.owner_user_id), str(middle.owner_user_id)}
    assert set(owners[2:]) == {str(later.owner_user_id), str(latest.owner_user_id)}
    assert_outbox_matches_contract()


def test_utc_date_decides_days_left_at_midnight_plus_three(
    run: CycleRunner, documents: Documents
) -> None:
    moscow = timezone(timedelta(hours=3))
    doc = documents(expires_at=datetime(2026, 12, 7, 0, 0, tzinfo=moscow))  # 2026-12-06 UTC

    run(AS_OF)

    [item] = events()[0]["documents"]
    assert (item["expiresAt"], item["daysLeft"], item["thresholdDays"]) == ("2026-12-06", 7, 7)
    assert Marker(doc.id, 7, True) in markers(doc.id)
    assert_outbox_matches_contract()


def test_window_edges_are_inclusive_to_the_day(
    run: CycleRunner, documents: Documents
) -> None:
    first = documents(expires_at=datetime.combine(TODAY - timedelta(days=90), time(0), tzinfo=UTC))
    last = documents(expires_at=datetime.combine(TODAY + timedelta(days=30), time(23, 59, 59),
                                                 tzinfo=UTC))
    documents(expires_at=datetime.combine(TODAY - timedelta(days=91), time(23, 59, 59), tzinfo=UTC))
    documents(expires_at=datetime.combine(TODAY + timedelta(days=31), time(0), tzinfo=UTC))

    result = run(AS_OF)

    assert result.window_documents == 2
    assert sorted(notified_pairs()) == sorted([(str(first.id), 0), (str(last.id), 30)])
    assert_outbox_matches_contract()


# Each batch starts only before the deadline. On one connection the 3rd batch is the last
# (counted at 10, 20, 30 s); on two, batches start in pairs (the 3rd and 4th both at 20 s).
@pytest.mark.parametrize(("claim_connections", "started"), [(1, 3), (2, 4)])
def test_run_over_its_time_budget_stops_cleanly_and_the_next_run_finishes(
    run: CycleRunner, documents: Documents, claim_connections: int, started: int
) -> None:
    docs = [documents(expires_at=expiring_in(d)) for d in (2, 3, 4, 5, 6)]
    fake_now = [0.0]

    def tick(_done: int, _total: int) -> None:
        fake_now[0] += 10.0  # each batch "takes" ten seconds

    first = run(AS_OF, batch_size=1, max_run_duration=timedelta(seconds=25),
                clock=lambda: fake_now[0], progress=tick, claim_connections=claim_connections)

    assert first.status == ReminderRun.Status.TIMED_OUT
    assert first.owners_notified == started
    second = run(AS_OF)
    assert second.status == ReminderRun.Status.SUCCEEDED
    assert second.owners_notified == 5 - started
    assert sorted(notified_pairs()) == sorted((str(d.id), 7) for d in docs)
    assert_outbox_matches_contract()


def _expired_markers(count: int) -> None:
    """`count` markers of long-gone documents (expiring 2026-01-01), straight into the ledger."""
    with connection.cursor() as cursor:
        cursor.execute(
            "insert into document_expiry_reminders (id, document_id, owner_user_id, type,"
            " threshold_days, expires_at, reminded_at, notified, run_id)"
            " select gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Visa', 0,"
            " date '2026-01-01', now(), true, gen_random_uuid() from generate_series(1, %s)",
            (count,))


def _expired_left() -> int:
    with connection.cursor() as cursor:
        cursor.execute("select count(*) from document_expiry_reminders"
                       " where expires_at = date '2026-01-01'")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def test_a_timed_out_cycle_prunes_within_a_budget_of_its_own(
    run: CycleRunner, documents: Documents
) -> None:
    _expired_markers(12_000)  # more than two chunks of the prune
    documents(expires_at=expiring_in(3))  # due: the cycle has a batch to run out of time on
    seconds = [0.0]

    def clock() -> float:
        seconds[0] += 1.0  # every look at the clock finds a second gone
        return seconds[0]

    first = run(AS_OF, max_run_duration=timedelta(milliseconds=1),
                prune_budget=timedelta(seconds=1.5), clock=clock)

    assert first.status == ReminderRun.Status.TIMED_OUT and first.reminders_sent == 0
    assert first.pruned == 5_000  # one chunk in its budget; the rest waits
    assert _expired_left() == 7_000
    second = run(AS_OF)
    assert (second.status, second.pruned, _expired_left()) == ("succeeded", 7_000, 0)
    assert_outbox_matches_contract()


# The stop is set once the first batch is counted; on two connections the batch sent to the
# second one was already in flight, and commits.
@pytest.mark.parametrize(("claim_connections", "done"), [(1, 1), (2, 2)])
def test_a_cycle_stopped_by_a_signal_leaves_the_prune_to_the_next(
    run: CycleRunner, documents: Documents, claim_connections: int, done: int
) -> None:
    _expired_markers(10)
    for days in (2, 3, 4):
        documents(expires_at=expiring_in(days))
    stop = threading.Event()

    stopped = run(AS_OF, batch_size=1, stop=stop, progress=lambda _done, _total: stop.set(),
                  claim_connections=claim_connections)

    assert (stopped.status, stopped.pruned, _expired_left()) == ("stopped", 0, 10)
    assert stopped.owners_notified == done
    assert run(AS_OF).pruned == 10
    assert_outbox_matches_contract()


def test_failing_owner_loses_nothing_for_the_others_and_is_retried_next_cycle(
    run: CycleRunner, documents: Documents
) -> None:
    good = [documents(expires_at=expiring_in(d)) for d in (2, 3, 4)]
    bad = documents(expires_at=expiring_in(3))
    with outbox_refusing(bad.owner_user_id):  # a real failure, for one owner only
        first = run(AS_OF, batch_size=100)

    assert (first.status, first.failed_owners, first.owners_notified) == ("partial", 1, 3)
    assert markers(bad.id) == set()
    assert {e["ownerUserId"] for e in events()} == {str(d.owner_user_id) for d in good}

    second = run(AS_OF)

    assert (second.status, second.owners_notified) == ("succeeded", 1)
    assert events_for(bad.owner_user_id)[0]["documents"][0]["documentId"] == str(bad.id)
    assert_outbox_matches_contract()


def test_dry_run_writes_nothing_and_reports_what_it_would_send(
    run: CycleRunner, documents: Documents
) -> None:
    for d in (29, 6, 0, -4):
        documents(expires_at=expiring_in(d))

    result = run(AS_OF, dry_run=True)

    assert markers() == set() and events() == []
    assert dict(result.reminders_by_threshold) == {30: 1, 7: 1, 0: 2}
    assert result.owners_notified == 4


def test_every_run_is_recorded_with_its_counters(
    run: CycleRunner, documents: Documents
) -> None:
    documents(expires_at=expiring_in(3))

    result = run(AS_OF)

    row = ReminderRun.objects.get(run_id=result.run_id)
    assert (row.status, row.reminders_sent, row.owners_notified, row.markers_written) == (
        "succeeded", 1, 1, 2)
    assert row.finished_at is not None and row.as_of == AS_OF
    assert row.finished_at >= row.started_at and row.started_at <= database_now()  # now() stamps it
    assert_outbox_matches_contract()


def test_a_run_left_running_by_a_killed_process_is_closed_as_failed(
    run: CycleRunner, documents: Documents
) -> None:
    killed, recent = uuid.uuid4(), uuid.uuid4()
    now = database_now()  # the cycle ages runs with the database's now()
    ReminderRun.objects.create(run_id=killed, as_of=AS_OF, status="running", thresholds="30",
                               started_at=now - timedelta(hours=3))
    ReminderRun.objects.create(run_id=recent, as_of=AS_OF, status="running", thresholds="30",
                               started_at=now - timedelta(minutes=5))

    run(AS_OF)

    closed = ReminderRun.objects.get(run_id=killed)
    assert closed.status == "failed" and closed.error is not None and "abandoned" in closed.error
    assert ReminderRun.objects.get(run_id=recent).status == "running"  # may still be going
