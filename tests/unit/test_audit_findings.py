"""audit.findings: the one table of finding codes; each code is unique and its runbook anchor
is in docs/operations.md, "Reading the findings"; an informational code is noted, never a
finding."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

from audit import findings
from audit.report import AuditReport, CheckResult, Finding, Status, render_text

OPERATIONS = Path(__file__).parents[2] / "docs" / "operations.md"
NOW = datetime(2030, 1, 1, tzinfo=UTC)


def test_every_code_is_unique_and_its_runbook_anchor_exists() -> None:
    codes = [c.code for c in findings.CODES]
    assert len(codes) == len(set(codes))
    page = OPERATIONS.read_text()
    for kind in findings.CODES:
        path, anchor = kind.runbook.split("#")
        assert path == "docs/operations.md"
        assert f'<a id="{anchor}"></a>**`{kind.code}`**' in page, kind.code


def test_the_checks_are_in_the_order_they_run_each_with_its_codes() -> None:
    checks = list(dict.fromkeys(c.check for c in findings.CODES))
    assert checks == ["ledger_outbox", "left_behind", "relay_position", "relay_waits", "parked",
                      "topic"]
    assert [c.code for c in findings.codes_of("relay_position")] == [
        "position_of_another_cluster", "position_ahead"]


def test_a_noted_code_is_listed_but_fails_nothing() -> None:
    queued = [{"run": "r2", "queued_by": "r1", "event": "e1"}]
    check = CheckResult.of("ledger_outbox", "ledger and outbox agree", {"runs": 2}, [
        Finding.listed(findings.NOTIFIED_TWICE, [], 20),
        Finding.listed(findings.ALREADY_QUEUED, queued, 20),
    ])
    report = AuditReport(as_of=NOW, since=NOW - timedelta(days=7), database_now=NOW,
                         checks=[check])

    assert (check.status, check.findings) == (Status.CLEAN, [])
    assert [(f.code, f.count) for f in check.noted] == [("already_queued", 1)]
    assert (report.findings, report.verdict) == (0, "audit clean: no findings")
    [shown] = report.as_dict()["checks"]
    assert shown["findings"] == [] and shown["noted"][0]["ids"] == queued
    assert "    already_queued: 1 (noted): " in render_text(report)
    assert [c.code for c in findings.codes_of("ledger_outbox", informational=False)] == [
        "marker_without_event", "event_without_marker", "notified_twice"]


def test_the_text_report_shows_values_from_outside_on_one_line_each() -> None:
    forged = "Passport\n[clean] forged check\x1b[2J"
    check = CheckResult.of("ledger_outbox", "ledger and outbox agree", {"runs": 1}, [
        Finding.listed(findings.ALREADY_QUEUED, [{"run": "r2", "type": forged}], 20),
    ], note=f"topic {forged} examined")
    report = AuditReport(as_of=NOW, since=NOW - timedelta(days=7), database_now=NOW,
                         checks=[check], notes=[forged])

    text = render_text(report)

    assert "\x1b" not in text
    assert not any(line.startswith("[clean] forged") for line in text.splitlines())
    assert text.count("Passport\\n[clean] forged check\\x1b[2J") == 3
