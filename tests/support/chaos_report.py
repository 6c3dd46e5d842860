"""What each chaos scenario tried (runs, kills, inputs), printed at the end of the pytest
session (conftest's `pytest_terminal_summary`) and written to artifacts/chaos-report.txt, so
the CI log shows it without `pytest -s`."""

from pathlib import Path

REPORT_FILE = Path(__file__).resolve().parents[2] / "artifacts" / "chaos-report.txt"

LINES: list[str] = []
COUNTS: dict[str, dict[str, int]] = {}


def record(scenario: str, **counts: object) -> None:
    """One line for `scenario`: what it tried and what it found."""
    LINES.append(f"{scenario}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))


def shown(scenario: str, **counts: object) -> None:
    """`record`, and print the line at once (a fault test's figures, seen with `pytest -s` as
    the test runs, and in the session summary)."""
    record(scenario, **counts)
    print(f"\n{LINES[-1]}")  # noqa: T201


def count(scenario: str, **increments: int) -> None:
    """Add to `scenario`'s running totals (for tests that run many examples)."""
    totals = COUNTS.setdefault(scenario, {})
    for key, value in increments.items():
        totals[key] = totals.get(key, 0) + value


def lines() -> list[str]:
    return LINES + [f"{scenario}: " + ", ".join(f"{k}={v}" for k, v in totals.items())
                    for scenario, totals in COUNTS.items()]


def write() -> None:
    if lines():
        REPORT_FILE.parent.mkdir(parents=True, exist_ok=True)
        REPORT_FILE.write_text("\n".join(lines()) + "\n", encoding="utf-8")
