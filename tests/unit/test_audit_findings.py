"""audit.findings: the one table of finding codes; each code is unique and its runbook anchor
is in docs/operations.md, "Reading the findings"."""

from pathlib import Path

from audit import findings

OPERATIONS = Path(__file__).parents[2] / "docs" / "operations.md"


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
