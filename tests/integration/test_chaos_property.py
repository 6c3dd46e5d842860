"""Property: for random document sets and random sequences of daily runs, with the thresholds,
the batch size and the per-event cap changing between runs, and documents' expiry dates
changing between runs (renewed, or corrected either way: refinement 5), the worker leaves
exactly what the reference model (tests/support/reference.py) says, each event under the
message id the model names (its markers' armings: one arming, one id), and the invariants
hold. A second property corrects expiries back and forth between two dates, so that a
document is told again for a date it was told before, in a new arming, under a new id.

The retention is drawn once per example: raising it after a prune lets an expired document
re-enter the window unmarked and be reminded again (the seed's accepted trade-off)."""

import os
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, time, timedelta, timezone

from django.db import connection
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from devtools.demo_data import PersonDocument
from tests.support import chaos_report
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import CycleRunner
from tests.support.factories import Documents, insert_documents
from tests.support.invariants import check_invariants, documents_md5, snapshot, tally
from tests.support.ledger import AS_OF
from tests.support.reference import ReferenceLedger, documents_from_database

OWNERS = [uuid.UUID(int=i + 1, version=4) for i in range(4)]

document_specs = st.builds(
    lambda owner, days, minute, offset_h, status, deleted, no_expiry, mask: PersonDocument(
        id=uuid.uuid4(), owner_user_id=OWNERS[owner], person_id=uuid.uuid4(), type="Visa",
        number_mask=mask,
        expires_at=None if no_expiry else datetime.combine(
            AS_OF.date() + timedelta(days=days), time(0), tzinfo=timezone(timedelta(hours=offset_h))
        ) + timedelta(minutes=minute),
        status=status, deleted_at=AS_OF if deleted else None),
    owner=st.integers(0, len(OWNERS) - 1),
    days=st.integers(-100, 70),
    minute=st.integers(0, 1439),
    offset_h=st.integers(-12, 14),
    status=st.sampled_from(["Active", "Active", "Active", "Archived"]),
    deleted=st.sampled_from([False, False, False, True]),
    no_expiry=st.sampled_from([False] * 9 + [True]),
    mask=st.none() | st.text(max_size=32).filter(lambda t: "\x00" not in t),
)
thresholds = st.sets(st.sampled_from([60, 30, 14, 7, 3, 1, 0]), min_size=1).map(
    lambda s: tuple(sorted(s, reverse=True)))
# before a run: (which document, days and minutes its expiry moves by: renewed, corrected
# either way, or moved within its UTC day)
expiry_changes = st.lists(
    st.tuples(st.integers(0, 19), st.integers(-20, 40), st.integers(-720, 720)), max_size=3)
daily_runs = st.lists(
    st.tuples(st.integers(1, 25), thresholds, st.integers(1, 4), st.sampled_from([500, 500, 1, 2]),
              expiry_changes),
    min_size=1, max_size=5)


def change_expiries(specs: list[PersonDocument], changes: list[tuple[int, int, int]]) -> int:
    """Move the chosen documents' expiry (as the profile service would; one without an
    expiry gets one near AS_OF); how many changes."""
    if not specs:
        return 0
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        for index, days, minutes in changes:
            cursor.execute(
                "update person_documents"
                " set expires_at = coalesce(expires_at, %s) + make_interval(days => %s, mins => %s)"
                " where id = %s",
                (AS_OF, days, minutes, specs[index % len(specs)].id))
    return len(changes)


def reset_tables() -> None:
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        cursor.execute("truncate person_documents, document_expiry_reminders, outbox_messages,"
                       " document_expiry_reminder_runs")


# PROPERTY_PROFILE=ci (the default, and CI's): the same 150 examples on every run, so a red CI
# is the code's doing: those derandomize=True drew from this test's source as it was when the seed was
# fixed (the seed below), whatever the source says now. PROPERTY_PROFILE=random: 1000 new examples a run,
# for a longer hunt (docs/testing.md); a failure prints the @reproduce_failure line.
PROFILE = os.environ.get("PROPERTY_PROFILE", "ci")
PROFILES = {"ci": settings(max_examples=150, derandomize=True, database=None),
            "random": settings(max_examples=1000)}
CI_SEED = int(
    "34308883858419037099597729413223978483625795203634572036859745351839258169682411476799"
    "581084984794040078072925613915")


def property_profile(test: Callable[..., None]) -> Callable[..., None]:
    return seed(CI_SEED)(test) if PROFILE == "ci" else test


@property_profile
@settings(PROFILES[PROFILE], deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(specs=st.lists(document_specs, max_size=20), runs=daily_runs,
       retention=st.sampled_from([90, 10]))
def test_random_documents_and_daily_runs_match_the_reference_model(
    run: CycleRunner, documents: Documents, specs: list[PersonDocument],
    runs: list[tuple[int, tuple[int, ...], int, int, list[tuple[int, int, int]]]],
    retention: int,
) -> None:
    reset_tables()
    insert_documents(specs)
    model = ReferenceLedger()
    as_of = AS_OF - timedelta(days=60)
    changed = 0
    for gap, config, batch_size, cap, changes in runs:
        changed += change_expiries(specs, changes)
        before = documents_md5()
        reference = documents_from_database()
        rearmed = model.rearmed
        as_of += timedelta(days=gap)
        result = run(as_of, thresholds=config, batch_size=batch_size, retention_days=retention,
                     max_documents_per_event=cap, tick=as_of)
        assert result.ok
        model.run(reference, as_of, config, retention_days=retention, cap=cap)
        # one audit: (a) and (b), and its left-behind check agrees that after a finished
        # loop cycle nothing is due
        check_invariants(documents_before=before, model=model, retention_days=retention,
                         audit_checks=("ledger_outbox", "left_behind"),
                         max_documents_per_event=cap)
        assert result.markers_rearmed == model.rearmed - rearmed
    # every example's events against the JSON Schema (its masks are arbitrary unicode), not only
    # the last one's (the documents fixture checks after the test)
    assert_outbox_matches_contract()
    figures = tally(snapshot(retention), model)
    chaos_report.count("property (hypothesis vs reference model)", examples=1,
                       documents=len(specs), runs=len(runs), expiry_changes=changed,
                       rearmed=model.rearmed,
                       mismatches=figures["lost"] + figures["unexpected"] + figures["duplicated"])
    assert_outbox_matches_contract()



# Corrections back and forth: each document's expiry is one of two dates, its first (A) or A
# moved by its `delta` days (B); before a run some documents are set to one or the other, so
# A-B-A, A-B-A-B and longer come often (and setting the date a document has changes nothing).
corrected_documents = st.lists(
    st.tuples(st.integers(0, len(OWNERS) - 1), st.integers(-3, 35),
              st.integers(-12, 12).filter(bool)),
    min_size=1, max_size=6)
corrections = st.lists(st.tuples(st.integers(0, 5), st.booleans()), max_size=3)
correcting_runs = st.lists(st.tuples(st.integers(1, 3), corrections), min_size=2, max_size=8)
CORRECTIONS_PROFILES = {"ci": settings(max_examples=60, derandomize=True, database=None),
                        "random": settings(max_examples=400)}


@settings(CORRECTIONS_PROFILES[PROFILE], deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(documents_=corrected_documents, runs=correcting_runs)
def test_expiries_corrected_back_and_forth_tell_each_arming_once_under_its_own_id(
    run: CycleRunner, documents: Documents, documents_: list[tuple[int, int, int]],
    runs: list[tuple[int, list[tuple[int, bool]]]],
) -> None:
    reset_tables()
    noon = time(12, 0, tzinfo=UTC)
    dates = [(datetime.combine(AS_OF.date() + timedelta(days=days), noon),
              datetime.combine(AS_OF.date() + timedelta(days=days + delta), noon))
             for _owner, days, delta in documents_]
    specs = [PersonDocument(id=uuid.uuid4(), owner_user_id=OWNERS[owner], person_id=uuid.uuid4(),
                            type="Passport", number_mask="45 ** ****12", expires_at=first,
                            status="Active", deleted_at=None)
             for (owner, _days, _delta), (first, _) in zip(documents_, dates, strict=True)]
    insert_documents(specs)
    model = ReferenceLedger()
    as_of = AS_OF
    for gap, flips in runs:
        with connection.cursor() as cursor:
            cursor.execute("reset role")
            for index, to_b in flips:
                cursor.execute("update person_documents set expires_at = %s where id = %s",
                               (dates[index % len(specs)][to_b], specs[index % len(specs)].id))
        before = documents_md5()
        reference = documents_from_database()
        as_of += timedelta(days=gap)
        result = run(as_of, tick=as_of)
        # a new arming never meets an id of an earlier one: nothing is already queued
        assert (result.ok, result.owners_already_queued) == (True, 0)
        model.run(reference, as_of, (30, 7, 1, 0))
        check_invariants(documents_before=before, model=model,
                         audit_checks=("ledger_outbox", "left_behind"))
    chaos_report.count("property (expiries corrected back and forth)", examples=1,
                       documents=len(specs), runs=len(runs),
                       told_again=sum(len(items) for items in model.events.values()),
                       rearmed=model.rearmed)
    assert_outbox_matches_contract()
