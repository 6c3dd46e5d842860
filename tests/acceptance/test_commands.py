"""The management commands as an operator runs them: real subprocesses on the test database,
as the worker's least-privilege role."""

import json
import signal
import uuid
from collections import Counter
from datetime import UTC, datetime
from itertools import pairwise

import pytest
from django.db import connection

from devtools.demo_data import PersonDocument
from tests.support.chaos import all_running_at_once, cycles_start_together
from tests.support.chaos_proxy import refused_port
from tests.support.contract import assert_outbox_matches_contract
from tests.support.factories import Documents, insert_documents
from tests.support.faketime import skewed_env
from tests.support.ledger import events, expiring_in, markers, real_today, run_statuses
from tests.support.processes import Command, command_env, run_command

AS_OF_ARG = "2026-11-29T03:00:00Z"


def _owners_with_documents(owners: int, per_owner: int, days: tuple[int, ...]) -> list[PersonDocument]:
    specs = []
    for index in range(owners):
        owner = uuid.uuid4()
        for n in range(per_owner):
            specs.append(PersonDocument(
                id=uuid.uuid4(), owner_user_id=owner, person_id=owner, type="Visa",
                number_mask=f"12 ** ****{n:02d}",
                expires_at=expiring_in(days[(index + n) % len(days)]),
            ))
    insert_documents(specs)
    return specs


def _assert_owners_whole() -> None:
    """No owner has markers without its event, nor a notified marker missing from it."""
    notified = {(m.document_id, m.threshold_days) for m in markers() if m.notified}
    in_events = Counter((uuid.UUID(d["documentId"]), d["thresholdDays"])
                        for e in events() for d in e["documents"])
    assert set(in_events) == notified
    assert all(count == 1 for count in in_events.values())
    owners_in_events = Counter(e["ownerUserId"] for e in events())
    assert all(count == 1 for count in owners_in_events.values())
    with connection.cursor() as cursor:
        cursor.execute("select distinct owner_user_id::text from document_expiry_reminders")
        owners_marked = {r[0] for r in cursor.fetchall()}
    assert owners_marked == set(owners_in_events)


def test_one_cycle_prints_its_summary(documents: Documents) -> None:
    documents(expires_at=expiring_in(7))
    documents(expires_at=expiring_in(-2))

    done = run_command("run_expiry_reminders", "--as-of", AS_OF_ARG)

    assert done.returncode == 0, done.stderr
    assert "reminders sent           2" in done.stdout
    assert "threshold   7 days       1" in done.stdout
    assert run_statuses() == ["succeeded"]
    assert_outbox_matches_contract()


def test_each_batch_is_logged_at_the_default_level_with_its_owners_and_documents(
    documents: Documents,
) -> None:
    first, second, third = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    documents(owner_user_id=first, expires_at=expiring_in(-3))
    documents(owner_user_id=second, expires_at=expiring_in(0))
    documents(owner_user_id=second, expires_at=expiring_in(5))
    documents(owner_user_id=third, expires_at=expiring_in(10))

    done = run_command("run_expiry_reminders", "--as-of", AS_OF_ARG, "--batch-size", "2")

    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    batches = [line for line in lines if line["event"] == "batch selected"]
    assert [(b["level"], b["owners"], b["documents"]) for b in batches] == [
        ("info", 1, 1), ("info", 1, 2), ("info", 1, 1)]
    assert_outbox_matches_contract()


def test_dry_run_prints_what_it_would_remind_and_writes_nothing(documents: Documents) -> None:
    documents(expires_at=expiring_in(30))
    documents(expires_at=expiring_in(1))

    done = run_command("run_expiry_reminders", "--dry-run", "--as-of", "2027-01-01")
    assert done.returncode == 0, done.stderr
    assert "Dry run: would remind" in done.stdout
    done = run_command("run_expiry_reminders", "--dry-run", "--as-of", AS_OF_ARG)

    assert "owners notified          2" in done.stdout
    assert "threshold  30 days       1" in done.stdout and "threshold   1 days       1" in done.stdout
    assert markers() == set() and events() == [] and run_statuses() == []


@pytest.mark.parametrize(("args", "problem"), [
    (["--as-of", "2999-01-01"], "in the future"),
    (["--as-of", "yesterday"], "--as-of: expected an ISO date"),
    (["--batch-size", "0"], "--batch-size: must be > 0"),
    (["--max-run-duration", "soon"], "--max-run-duration: expected a duration"),
    (["--loop", "--dry-run"], "--loop takes neither"),
])
def test_bad_usage_exits_2_with_a_clear_message(documents: Documents, args: list[str],
                                                problem: str) -> None:
    done = run_command("run_expiry_reminders", *args)

    assert done.returncode == 2
    assert problem in done.stderr
    assert run_statuses() == []


@pytest.mark.parametrize(("name", "value"), [
    ("REMINDER_THRESHOLDS_DAYS", "7,30"), ("REMINDER_BATCH_SIZE", "0"),
    ("REMINDER_POLLING_INTERVAL", "0s"), ("REMINDER_RUN_AT_UTC", "25:00"),
    ("REMINDER_MAX_RUN_DURATION", "forever"), ("REMINDER_RETENTION_DAYS", "-3"),
])
def test_bad_configuration_exits_2_naming_the_variable(documents: Documents, name: str,
                                                        value: str) -> None:
    documents(expires_at=expiring_in(3))

    done = run_command("run_expiry_reminders", env=command_env(**{name: value}))

    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert name in line
    assert markers() == set() and run_statuses() == []


def test_malformed_database_url_exits_2(documents: Documents) -> None:
    env = command_env()
    env["DATABASE_URL"] = "mysql://nobody@nowhere/db"

    done = run_command("run_expiry_reminders", env=env)

    assert done.returncode == 2
    assert "DATABASE_URL" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_prune_command(documents: Documents) -> None:
    documents(expires_at=expiring_in(-80))
    assert run_command("run_expiry_reminders", "--as-of", AS_OF_ARG).returncode == 0

    # The worker's clock on the as-of's day (a future --as-of is refused); 4 of 4 markers is
    # more than a tenth of the ledger: --yes.
    on_the_day = skewed_env(command_env(), datetime(2026, 12, 20, 12, tzinfo=UTC) - datetime.now(UTC))
    dry = run_command("prune_reminders", "--dry-run", "--as-of", "2026-12-20", env=on_the_day)
    real = run_command("prune_reminders", "--as-of", "2026-12-20", "--yes", env=on_the_day)

    assert "would prune 4 marker(s)" in dry.stdout
    assert "pruned 4 marker(s)" in real.stdout
    assert markers() == set()
    assert_outbox_matches_contract()


def test_a_timed_out_cycle_still_prunes(documents: Documents) -> None:
    # The repro: markers expiring 2026-01-01, then a cycle that runs out of time at once.
    old = documents(expires_at=datetime(2026, 1, 1, 12, 0, tzinfo=UTC))
    assert run_command("run_expiry_reminders", "--as-of", "2026-01-02T03:00:00Z").returncode == 0
    assert len(markers(old.id)) == 4
    due = documents(expires_at=datetime(2026, 11, 5, 12, 0, tzinfo=UTC))

    done = run_command("run_expiry_reminders", "--as-of", "2026-11-01T03:00:00Z",
                       "--max-run-duration", "1ms")

    assert done.returncode == 0, done.stderr
    assert ": timed_out" in done.stdout and "pruned markers           4" in done.stdout
    assert markers(old.id) == set() and markers(due.id) == set()  # pruned; due left for later
    with connection.cursor() as cursor:
        cursor.execute("select status, pruned from document_expiry_reminder_runs"
                       " order by started_at desc limit 1")
        assert cursor.fetchone() == ("timed_out", 4)
    assert_outbox_matches_contract()


def test_sigterm_mid_cycle_exits_0_and_leaves_no_owner_half_written(documents: Documents) -> None:
    _owners_with_documents(owners=1500, per_owner=2, days=(-3, 0, 1, 5, 12, 29))
    worker = Command("run_expiry_reminders", "--as-of", AS_OF_ARG, "--batch-size", "2")

    worker.wait_for_event("reminder queued")
    worker.process.send_signal(signal.SIGTERM)
    code, stdout, stderr = worker.finish()

    assert code == 0, stderr
    assert "stop requested" in stderr and ": stopped" in stdout
    assert run_statuses() == ["stopped"]
    assert 0 < len(events()) < 1500  # really stopped mid-cycle
    _assert_owners_whole()
    again = run_command("run_expiry_reminders", "--as-of", AS_OF_ARG)  # the next run finishes
    assert again.returncode == 0
    assert len(events()) == 1500
    _assert_owners_whole()
    assert_outbox_matches_contract()


def test_parallel_instances_write_one_marker_and_one_event_per_document(
    documents: Documents,
) -> None:
    specs = _owners_with_documents(owners=600, per_owner=3, days=(-1, 0, 3, 6, 20))
    with cycles_start_together(4):
        workers = [
            Command("run_expiry_reminders", "--as-of", AS_OF_ARG, "--batch-size", "7")
            for _ in range(4)
        ]
    results = [w.finish() for w in workers]

    assert [code for code, _, _ in results] == [0, 0, 0, 0], [err[-2000:] for _, _, err in results]
    _assert_owners_whole()
    assert len({d["documentId"] for e in events() for d in e["documents"]}) == len(specs)
    assert len(events()) == 600

    def per_instance(counter: str) -> list[int]:
        return [int(line.split()[-1]) for _, out, _ in results for line in out.splitlines()
                if line.strip().startswith(counter)]

    assert sum(per_instance("reminders sent")) == len(specs)  # they split the work; none sent twice
    # They really ran at once: every run started before any finished, and each found documents
    # due at its start (so claimed owners the others claimed too). Which of them won the owners
    # is the scheduler's: one ahead of the others can win them all.
    run_ids = [line.split()[1] for _, out, _ in results for line in out.splitlines()
               if line.startswith("Cycle ")]
    assert len(run_ids) == 4 and all_running_at_once(run_ids), run_ids
    assert all(due > 0 for due in per_instance("due documents")), per_instance("due documents")
    assert_outbox_matches_contract()


@pytest.mark.real_clock
def test_loop_runs_a_missed_cycle_at_once_then_sleeps_until_sigterm(documents: Documents) -> None:
    documents(expires_at=expiring_in(3, base=real_today()))  # --loop runs as of the real clock
    worker = Command("run_expiry_reminders", "--loop",
                     env=command_env(REMINDER_RUN_AT_UTC="03:00", REMINDER_POLLING_INTERVAL="24h"))
    try:
        worker.wait_for_event("cycle completed")
        worker.wait_for_event("sleeping until next tick")
        worker.process.send_signal(signal.SIGTERM)
        code, _, stderr = worker.finish()
    finally:
        if worker.process.poll() is None:  # a failed wait leaves no loop running cycles
            worker.process.kill()
            worker.finish()

    assert code == 0, stderr
    assert run_statuses() == ["succeeded"] and len(events()) == 1
    assert "loop stopped" in stderr
    assert_outbox_matches_contract()


def test_loop_survives_an_unreachable_database_with_backoff() -> None:
    with refused_port() as port:
        env = command_env()
        env["DATABASE_URL"] = f"postgres://pin_reminder_worker@127.0.0.1:{port}/nowhere"
        env["DB_CONNECT_TIMEOUT_S"] = "2"
        worker = Command("run_expiry_reminders", "--loop", env=env)

        retries = [worker.wait_for_event("database unavailable, retrying") for _ in range(3)]
        worker.process.send_signal(signal.SIGTERM)
        code, _, _ = worker.finish()

    assert [r["attempt"] for r in retries] == [1, 2, 3]
    delays = [r["retry_in_s"] for r in retries]
    # Doubling with jitter over the upper half: attempt n waits within [2^(n-2), 2^(n-1)] s, so
    # the third delay is at least twice the first; a constant or shrinking delay is not.
    assert 0 < delays[0] <= delays[1] <= delays[2] and delays[2] >= 2 * delays[0], delays
    gaps = [(datetime.fromisoformat(b["ts"]) - datetime.fromisoformat(a["ts"])).total_seconds()
            for a, b in pairwise(retries)]
    # It really waited that long (the delay is logged rounded to 0.1 s, the time to 1 ms).
    assert all(gap >= delay - 0.06 for gap, delay in zip(gaps, delays, strict=False)), (gaps, delays)
    assert code == 0
