"""What an audit found, check by check: the shapes the checks return and the command prints
(text for a person, JSON for a script)."""

import json
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from audit.findings import Code
from core.logs import printable


class Status(StrEnum):
    CLEAN = "clean"
    FINDINGS = "findings"
    NOT_CHECKED = "not checked"


@dataclass(frozen=True, slots=True)
class Finding:
    """One kind of disagreement (its code says what it means and what to do): how many, and
    the ids of the first few."""

    kind: Code
    count: int
    ids: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def listed(cls, kind: Code, found: list[dict[str, Any]], limit: int) -> "Finding":
        """All that was found, counted, the first `limit` of them listed."""
        return cls(kind, len(found), found[:limit])

    @property
    def code(self) -> str:
        return self.kind.code

    @property
    def what(self) -> str:
        return self.kind.what

    @property
    def action(self) -> str:
        return self.kind.action

    @property
    def runbook(self) -> str:
        return self.kind.runbook


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check: what it examined (row counts by name), what it found, and what it noted
    (informational codes: listed, never a finding)."""

    name: str
    title: str
    status: Status
    examined: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    note: str = ""
    seconds: float = 0.0  # how long the check took (set by run_audit)
    noted: list[Finding] = field(default_factory=list)

    @classmethod
    def of(cls, name: str, title: str, examined: dict[str, int], findings: list[Finding],
           note: str = "") -> "CheckResult":
        found = [f for f in findings if f.count and not f.kind.informational]
        noted = [f for f in findings if f.count and f.kind.informational]
        return cls(name, title, Status.FINDINGS if found else Status.CLEAN, examined, found, note,
                   noted=noted)

    @classmethod
    def not_checked(cls, name: str, title: str, examined: dict[str, int],
                    reason: str) -> "CheckResult":
        """A check with nothing to examine: it says why, and is never clean."""
        return cls(name, title, Status.NOT_CHECKED, examined, note=reason)


@dataclass(frozen=True, slots=True)
class AuditReport:
    as_of: datetime
    since: datetime
    database_now: datetime
    checks: list[CheckResult]
    notes: list[str] = field(default_factory=list)

    @property
    def findings(self) -> int:
        return sum(f.count for c in self.checks for f in c.findings)

    @property
    def not_checked(self) -> list[str]:
        return [c.name for c in self.checks if c.status is Status.NOT_CHECKED]

    @property
    def verdict(self) -> str:
        """The last line: clean only when every check ran and found nothing."""
        if self.findings:
            return f"audit found {self.findings} finding(s)"
        if self.not_checked:
            return (f"audit found nothing in {len(self.checks) - len(self.not_checked)} of "
                    f"{len(self.checks)} checks; not checked: {', '.join(self.not_checked)}")
        return "audit clean: no findings"

    def check(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)

    def as_dict(self) -> dict[str, Any]:
        def finding(f: Finding) -> dict[str, Any]:
            return {"code": f.code, "count": f.count, "what": f.what, "action": f.action,
                    "ids": f.ids, "runbook": f.runbook}

        return {
            "as_of": self.as_of.isoformat(),
            "since": self.since.isoformat(),
            "database_now": self.database_now.isoformat(),
            "findings": self.findings,
            "not_checked": self.not_checked,
            "verdict": self.verdict,
            "notes": self.notes,
            "checks": [{"name": c.name, "title": c.title, "status": str(c.status),
                        "examined": c.examined, "note": c.note, "seconds": round(c.seconds, 3),
                        "findings": [finding(f) for f in c.findings],
                        "noted": [finding(f) for f in c.noted]} for c in self.checks],
        }


def render_json(report: AuditReport) -> str:
    return json.dumps(report.as_dict(), default=str, sort_keys=False)


def _ids(ids: list[dict[str, Any]]) -> str:
    return "; ".join(" ".join(f"{k}={v}" for k, v in item.items()) for item in ids)


def render_text(report: AuditReport) -> str:
    """A short summary: the window, each check with what it read, each finding with its ids and
    what to do; the last line is the verdict."""
    lines = [f"audit of {report.since.isoformat()} .. {report.as_of.isoformat()} "
             f"(database clock {report.database_now.isoformat()})"]
    lines += [f"  note: {note}" for note in report.notes]
    for check in report.checks:
        examined = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in check.examined.items())
        lines.append(f"[{check.status}] {check.title}" + (f": {examined}" if examined else ""))
        if check.note:
            lines.append(f"    {check.note}")
        for f in [*check.findings, *check.noted]:
            shown = f" (first {len(f.ids)})" if f.ids and len(f.ids) < f.count else ""
            lines.append(f"    {f.code}: {f.count}{' (noted)' if f.kind.informational else ''}: "
                         f"{f.what}")
            if f.ids:
                lines.append(f"      ids{shown}: {_ids(f.ids)}")
            lines.append(f"      do: {f.action} ({f.runbook})")
    lines.append(report.verdict)
    # Ids, notes and errors come from the database and Kafka: each line shown as one line.
    return "\n".join(map(printable, lines))
