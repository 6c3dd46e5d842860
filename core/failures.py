"""What a database failure means to an operator: the database unreachable, a table or a grant
missing, or some other error; with a one-line reason that names the SQLSTATE's class and the
object, and never a secret (docs/runbooks/document-expiry-reminder.md,
"What the software prints when something is wrong").

`classify` reads the exception only (psycopg's, or Django's wrapping one), so it is cheap and
safe to call on any failure path; the messages come from libpq and the server, which never
quote a password, and a password-looking part of a DSN is blanked all the same.
"""

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import psycopg
from django.db import InterfaceError as DjangoInterfaceError
from django.db import OperationalError as DjangoOperationalError
from django.db import connections

UNREACHABLE_STATES = {"57P01", "57P02", "57P03"}  # admin/crash shutdown, cannot connect now
UNREACHABLE_CLASSES = {"08", "28", "3D"}  # connection exception, bad authorization, no database
MISSING_STATES = {"42501", "42P01", "42703", "3F000", "42883"}
REASON_MAX = 400

_DSN_PASSWORD = re.compile(r"(://[^:/@\s]+:)[^@\s]+@|(password\s*=\s*)\S+", re.IGNORECASE)
_PERMISSION_DENIED = re.compile(r"permission denied for (?:table|relation|sequence|schema) (\S+)")
_DOES_NOT_EXIST = re.compile(r'(?:relation|column|schema|function) ("[^"]+"|\S+) does not exist')


class FailureKind(StrEnum):
    """What went wrong, as the operator's first question: where do I look?"""

    UNREACHABLE = "database unreachable"
    MISSING = "missing table or grant"
    OTHER = "database error"


@dataclass(frozen=True, slots=True)
class DatabaseFailure:
    """A classified database failure: its kind, the error's one line, and what to do."""

    kind: FailureKind
    error: str  # `<SQLSTATE class name>: <the server's or libpq's first message>`
    hint: str = ""

    def fields(self) -> dict[str, Any]:
        """The log line's fields: `cause` (the kind), `error`, and `hint` when there is one."""
        fields: dict[str, Any] = {"cause": str(self.kind), "error": self.error}
        return {**fields, "hint": self.hint} if self.hint else fields

    @property
    def reason(self) -> str:
        """One line: the kind, the error, and the fix when there is one."""
        text = f"{self.kind}: {self.error}"
        return f"{text}; {self.hint}" if self.hint else text


RETRY_EVENTS = {
    FailureKind.UNREACHABLE: "database unavailable, retrying",
    FailureKind.MISSING: "missing table or grant, retrying",
    FailureKind.OTHER: "database error, retrying",
}


def retry_event(failure: DatabaseFailure) -> str:
    """The event a loop logs when it backs off after `failure`."""
    return RETRY_EVENTS[failure.kind]


def one_line(text: str, limit: int = REASON_MAX) -> str:
    """`text` on one line (a libpq message spans several), blanked DSN passwords, bounded."""
    text = _DSN_PASSWORD.sub(lambda m: f"{m.group(1)}***@" if m.group(1) else f"{m.group(2)}***",
                             text)
    return " ".join(text.split())[:limit]


def _psycopg_error(exc: BaseException) -> BaseException:
    """The driver's error behind Django's wrapper (`raise ... from` the psycopg error)."""
    cause = exc.__cause__
    return cause if isinstance(cause, psycopg.Error) else exc


def _message(exc: BaseException) -> str:
    if isinstance(exc, psycopg.Error) and exc.sqlstate and exc.diag.message_primary:
        return exc.diag.message_primary  # without the "LINE 1: <statement>" that follows
    return str(exc)


def classify(exc: BaseException, *, role: str | None = None) -> DatabaseFailure:
    """The kind of `exc`, and its one-line reason; `role` (the connection's user) is named in
    the hint of a missing grant."""
    error = _psycopg_error(exc)
    sqlstate = getattr(error, "sqlstate", None) or ""
    text = one_line(f"{type(error).__name__}: {_message(error)}")
    as_role = f"role {role}" if role else "the connection's role"
    if sqlstate in MISSING_STATES:
        if denied := _PERMISSION_DENIED.search(text):
            hint = (f"{as_role} lacks a privilege on {denied.group(1)}: as the schema owner, "
                    "grant it (manage.py apply_db_roles)")
        else:
            missing = _DOES_NOT_EXIST.search(text)
            what = missing.group(1) if missing else "an object"
            hint = (f"{what} is missing or invisible to {as_role}: as the schema owner, create "
                    "it (manage.py migrate) and grant it (manage.py apply_db_roles)")
        return DatabaseFailure(FailureKind.MISSING, text, hint)
    if (isinstance(error, psycopg.OperationalError | ConnectionError)
            and (not sqlstate or sqlstate in UNREACHABLE_STATES
                 or sqlstate[:2] in UNREACHABLE_CLASSES)):
        return DatabaseFailure(FailureKind.UNREACHABLE, text)
    if isinstance(error, psycopg.InterfaceError | DjangoInterfaceError) or (
            isinstance(error, DjangoOperationalError) and not sqlstate):
        return DatabaseFailure(FailureKind.UNREACHABLE, text)  # a closed or lost connection
    return DatabaseFailure(FailureKind.OTHER, text)


def role_of(using: str) -> str | None:
    """The user a Django alias connects as (never its password)."""
    return connections[using].settings_dict.get("USER") or None


def classify_on(exc: BaseException, using: str) -> DatabaseFailure:
    """`classify` with the alias's role named."""
    return classify(exc, role=role_of(using))
