"""What each chaos scenario tried (runs, kills, inputs), printed at the end of the pytest
session (conftest's `pytest_terminal_summary`) and written to artifacts/chaos-report.txt, so
the CI log shows it without `pytest -s`."""

from pathlib import Path

REPORT_FILE = Path(__file__).resolve().parent.parent / "artifacts" / "chaos-report.txt"

LINES: list[str] = []


def record(scenario: str, **counts: object) -> None:
    """One line for `scenario`: what it tried and what it found."""
    LINES.append(f"{scenario}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))


def write() -> None:
    if LINES:
        REPORT_FILE.parent.mkdir(parents=True, exist_ok=True)
        REPORT_FILE.write_text("\n".join(LINES) + "\n", encoding="utf-8")
