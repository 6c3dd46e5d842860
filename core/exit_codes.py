"""The exit codes of every management command, in one place (docs/commands.md, "Exit codes"):
what each means, the lines every `--help` ends with, and the code a database failure exits
with. A command says only which codes it uses and, where it helps, what a code means for it."""

from collections.abc import Iterable, Mapping
from enum import IntEnum

from core.failures import DatabaseFailure, FailureKind


class ExitCode(IntEnum):
    """How a command ended, as a script or an orchestrator reads it."""

    OK = 0
    FAILED = 1
    USAGE = 2
    UNAVAILABLE = 3
    REFUSED = 4

    @property
    def meaning(self) -> str:
        """What the code tells the operator, whatever the command."""
        return MEANINGS[self]


MEANINGS = {
    ExitCode.OK: "done",
    ExitCode.FAILED: "failed, try again",
    ExitCode.USAGE: "bad configuration or usage",
    ExitCode.UNAVAILABLE: "database unavailable",
    ExitCode.REFUSED: "refused: a person must act",
}

ALL = tuple(ExitCode)

# A database failure's kind (core.failures) as an exit code: a server that does not answer is
# waited out, a table or grant missing needs its owner (migrate, apply_db_roles), and any other
# error (a timeout, a conflict) is worth another try.
_FOR_FAILURE = {
    FailureKind.UNREACHABLE: ExitCode.UNAVAILABLE,
    FailureKind.MISSING: ExitCode.REFUSED,
    FailureKind.OTHER: ExitCode.FAILED,
}


def for_database_failure(failure: DatabaseFailure) -> ExitCode:
    """The code a command exits with when the database failed it."""
    return _FOR_FAILURE[failure.kind]


def epilog(codes: Iterable[ExitCode] = ALL, notes: Mapping[ExitCode, str] | None = None) -> str:
    """The end of a command's `--help`: its codes, one a line, each with its meaning and, when
    the command gives one, what it means there."""
    notes = notes or {}
    lines = ["exit codes (docs/commands.md):"]
    for code in sorted(set(codes)):
        note = f": {notes[code]}" if code in notes else ""
        lines.append(f"  {code.value}  {code.meaning}{note}")
    return "\n".join(lines)
