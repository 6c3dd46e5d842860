"""The last line of a manual cycle that did not go well: which failure it was, and the owners."""

import uuid
from datetime import UTC, datetime

import pytest

from core.exit_codes import ExitCode
from core.failures import DatabaseFailure, FailureKind
from reminders.result import CycleResult

GRANT = DatabaseFailure(FailureKind.MISSING, "InsufficientPrivilege: permission denied for table t",
                        "role r lacks a privilege on t: as the schema owner, grant it "
                        "(manage.py apply_db_roles)")
LOST = DatabaseFailure(FailureKind.UNREACHABLE, "ConnectionLostError: database connection lost")


def _result(status: str, failed_owners: int = 0, **fields: object) -> CycleResult:
    result = CycleResult(run_id=uuid.uuid4(), as_of=datetime(2026, 11, 29, tzinfo=UTC),
                         status=status, failed_owners=failed_owners)
    for name, value in fields.items():
        setattr(result, name, value)
    return result


def test_a_clean_cycle_has_no_failure_line() -> None:
    assert _result("succeeded").failure_line() is None
    assert _result("timed_out").failure_line() is None


def test_a_failed_cycle_says_which_failure_and_the_owners_failed_before_it() -> None:
    assert _result("failed", failure=GRANT).failure_line() == f"cycle failed: {GRANT.reason}"
    assert _result("failed", 3, failure=LOST).failure_line() == (
        "cycle failed: database unreachable: ConnectionLostError: database connection lost; "
        "3 owner(s) failed, they are retried next cycle")


def test_owners_failed_name_the_first_owners_failure() -> None:
    assert _result("partial", 2, owner_failure=GRANT).failure_line() == (
        f"cycle partial: 2 owner(s) failed ({GRANT.reason}); they are retried next cycle")
    assert _result("timed_out", 1).failure_line() == (
        "cycle timed_out: 1 owner(s) failed; they are retried next cycle")


@pytest.mark.parametrize(("status", "failed_owners", "fields", "code"), [
    ("succeeded", 0, {}, ExitCode.OK),
    ("timed_out", 0, {}, ExitCode.OK),
    ("stopped", 0, {}, ExitCode.OK),
    ("partial", 2, {"owner_failure": GRANT}, ExitCode.FAILED),
    ("failed", 0, {"failure": LOST}, ExitCode.UNAVAILABLE),
    ("failed", 3, {"failure": GRANT}, ExitCode.REFUSED),
    ("failed", 0, {"failure": DatabaseFailure(FailureKind.OTHER, "QueryCanceled: timeout")},
     ExitCode.FAILED),
])
def test_a_manual_runs_exit_code_is_its_failures(
    status: str, failed_owners: int, fields: dict[str, object], code: ExitCode,
) -> None:
    assert _result(status, failed_owners, **fields).exit_code is code
