"""The migration lint (core/migrations_lint.py): squawk with the project's configuration fails a
statement that takes ACCESS EXCLUSIVE without lock_timeout, passes it after what
LockTimeoutMigration emits, and the baseline accepts only what it lists."""

from pathlib import Path

from core.migrations_lint import (
    Finding,
    is_project_app,
    load_baseline,
    project_migrations,
    run_squawk,
    unaccepted,
)

ADD_COLUMN = 'ALTER TABLE "outbox_messages" ADD COLUMN "probe" text NULL;\n'
TIMEOUTS = "SET LOCAL lock_timeout = '5s';\nSET LOCAL statement_timeout = '1min';\n"


def rules(findings: list[Finding]) -> set[tuple[str, str]]:
    return {(finding.migration, finding.rule) for finding in findings}


def test_squawk_fails_a_lock_without_lock_timeout_and_passes_it_with_one() -> None:
    findings = run_squawk({
        "outbox.0099_bare": f"BEGIN;\n{ADD_COLUMN}COMMIT;\n",
        "outbox.0099_timed": f"BEGIN;\n{TIMEOUTS}{ADD_COLUMN}COMMIT;\n",
        "outbox.0099_index": f"BEGIN;\n{TIMEOUTS}CREATE INDEX probe ON outbox_messages (id);\n"
                             "COMMIT;\n"})
    assert rules(findings) == {
        ("outbox.0099_bare", "require-lock-timeout"),
        ("outbox.0099_bare", "require-statement-timeout"),
        ("outbox.0099_index", "require-concurrent-index-creation")}
    assert [finding.line for finding in findings if finding.migration == "outbox.0099_bare"] \
        == [2, 2]


def test_only_the_listed_findings_of_a_baseline_migration_are_accepted() -> None:
    baseline = {"outbox.0001_initial": {"require-lock-timeout": "why",
                                        "ban-drop-column": "why"}}
    old = Finding("outbox.0001_initial", 3, "require-lock-timeout", "m")
    old_unlisted = Finding("outbox.0001_initial", 4, "require-statement-timeout", "m")
    new = Finding("outbox.0011_new", 3, "require-lock-timeout", "m")
    assert unaccepted([old, old_unlisted, new], baseline,
                      {"outbox.0001_initial", "outbox.0011_new"}) == (
        [old_unlisted, new], ["outbox.0001_initial: ban-drop-column"])


def test_the_baseline_gives_a_reason_for_every_accepted_finding() -> None:
    baseline = load_baseline()
    assert "outbox.0005_stream_position" in baseline
    assert all(reason.strip() for rules in baseline.values() for reason in rules.values())


def test_the_project_apps_are_its_own_packages_not_a_virtualenv_kept_in_the_checkout(
    tmp_path: Path,
) -> None:
    venv_admin = tmp_path / ".venv/lib/python3.11/site-packages/django/contrib/admin"
    for folder in (tmp_path / "outbox", venv_admin):
        folder.mkdir(parents=True)

    assert is_project_app("outbox", tmp_path / "outbox", tmp_path)
    assert not is_project_app("django.contrib.admin", venv_admin, tmp_path)


def test_the_lint_reads_only_the_project_apps_migrations() -> None:
    assert {app for app, _name in project_migrations()} == {"reminders", "outbox"}
