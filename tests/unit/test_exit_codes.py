"""The exit codes in one place (core/exit_codes.py): a database failure's code, and the lines
every `--help` ends with."""

import pytest

from core.exit_codes import ExitCode, epilog, for_database_failure
from core.failures import DatabaseFailure, FailureKind


@pytest.mark.parametrize(("kind", "code"), [
    (FailureKind.UNREACHABLE, ExitCode.UNAVAILABLE),
    (FailureKind.MISSING, ExitCode.REFUSED),
    (FailureKind.OTHER, ExitCode.FAILED),
])
def test_a_database_failure_exits_by_its_kind(kind: FailureKind, code: ExitCode) -> None:
    assert for_database_failure(DatabaseFailure(kind, "E: e")) is code


def test_the_codes_are_the_contract() -> None:
    assert [(c.value, c.meaning) for c in ExitCode] == [
        (0, "done"), (1, "failed, try again"), (2, "bad configuration or usage"),
        (3, "database unavailable"), (4, "refused: a person must act")]


def test_the_epilog_lists_the_commands_codes_in_order_each_with_its_note() -> None:
    text = epilog((ExitCode.USAGE, ExitCode.OK, ExitCode.FAILED),
                  {ExitCode.FAILED: "findings"})
    assert text.splitlines() == [
        "exit codes (docs/commands.md):",
        "  0  done",
        "  1  failed, try again: findings",
        "  2  bad configuration or usage",
    ]
