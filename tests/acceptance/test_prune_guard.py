"""prune_reminders guarded, as an operator runs it: a future --as-of is refused as the cycle
refuses one, and a prune of markers of documents not expired yet (on the database's clock) or of
more than a tenth of the ledger deletes nothing without --yes. The worker's clock is pinned
(libfaketime); PostgreSQL keeps the real one."""

import subprocess
from datetime import UTC, date, datetime, timedelta

import pytest
from django.db import connection

from tests.support.faketime import skewed_env
from tests.support.processes import command_env, run_command

pytestmark = pytest.mark.django_db(transaction=True)

PINNED = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)  # the worker's clock in these tests
CUTOFF = date(2026, 8, 31)  # PINNED's UTC date minus the default retention (90 days)


def _prune(*args: str, now: datetime = PINNED) -> subprocess.CompletedProcess[str]:
    """prune_reminders with the worker's clock at `now`."""
    return run_command("prune_reminders", *args,
                       env=skewed_env(command_env(), now - datetime.now(UTC)))


def _add_markers(count: int, expires_on: date | int) -> None:
    """`count` markers expiring on a date, or (an int) that many days after the database's UTC
    date today."""
    expiry = ("(now() at time zone 'UTC')::date + %s::int" if isinstance(expires_on, int)
              else "%s::date")
    with connection.cursor() as cursor:
        cursor.execute(
            "insert into document_expiry_reminders (id, document_id, owner_user_id, type,"
            " threshold_days, expires_at, reminded_at, notified, run_id)"
            f" select gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Visa', 7, {expiry},"
            " now(), true, gen_random_uuid() from generate_series(1, %s)", [expires_on, count])


def _ledger() -> int:
    with connection.cursor() as cursor:
        cursor.execute("select count(*) from document_expiry_reminders")
        [(count,)] = cursor.fetchall()
    return int(count)


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    [line] = done.stderr.strip().splitlines()
    return line


def test_a_future_as_of_is_refused_and_deletes_nothing() -> None:
    # The typo: the year one ahead would have deleted every live marker.
    _add_markers(9, date(2026, 11, 20))

    done = _prune("--as-of", "2027-11-29")

    assert done.returncode == 2, done.stderr
    line = _one_line(done)
    assert "--as-of 2027-11-29T00:00:00+00:00 is in the future" in line
    assert "only --dry-run may look ahead" in line
    assert _ledger() == 9
    looked_ahead = _prune("--dry-run", "--as-of", "2027-11-29")
    assert looked_ahead.returncode == 0, looked_ahead.stderr
    assert "would prune 9 marker(s) expiring before 2027-08-31" in looked_ahead.stdout
    assert _ledger() == 9
    assert _prune("--as-of", "2026-11-29").returncode == 0  # today on the pinned clock: not ahead


def test_a_prune_of_more_than_a_tenth_of_the_ledger_needs_yes_and_a_tenth_does_not() -> None:
    _add_markers(11, CUTOFF - timedelta(days=1))  # left the retention
    _add_markers(89, CUTOFF)  # still kept

    dry = _prune("--dry-run")
    refused = _prune()

    assert dry.returncode == 0, dry.stderr
    assert "would prune 11 marker(s) expiring before 2026-08-31 (the ledger holds 100)" in dry.stdout
    assert "without --dry-run it needs --yes: 11 of the ledger's 100 markers (11%" in dry.stdout
    assert refused.returncode == 2, refused.stderr
    line = _one_line(refused)
    assert "prune refused, nothing deleted: the markers expiring before 2026-08-31 are" in line
    assert "11 of the ledger's 100 markers (11%, more than 10%)" in line and "--yes" in line
    assert _ledger() == 100

    confirmed = _prune("--yes")
    assert confirmed.returncode == 0, confirmed.stderr
    assert "pruned 11 marker(s) expiring before 2026-08-31" in confirmed.stdout
    assert _ledger() == 89
    _add_markers(9, CUTOFF - timedelta(days=1))  # 9 of 98: a tenth or less is not asked about
    done = _prune()
    assert done.returncode == 0, done.stderr
    assert "pruned 9 marker(s)" in done.stdout
    assert _ledger() == 89


def test_markers_of_documents_not_expired_on_the_databases_clock_need_yes() -> None:
    # A worker whose clock runs two years ahead prunes "now": by its clock the markers left the
    # retention long ago; by the database's their documents expire in ten days.
    _add_markers(1, 10)
    _add_markers(99, 1000)  # beyond the skewed cutoff too: a small share of the ledger goes
    ahead = datetime.now(UTC) + timedelta(days=730)

    refused = _prune(now=ahead)

    assert refused.returncode == 2, refused.stderr
    line = _one_line(refused)
    assert "1 marker(s) of documents not expired yet" in line, line
    assert "today on the database's clock" in line and "--yes" in line
    assert "of the ledger's" not in line  # 1%: the share alone would not ask
    assert _ledger() == 100
    assert _prune("--yes", now=ahead).returncode == 0
    assert _ledger() == 99
