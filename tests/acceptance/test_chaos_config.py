"""Bad configuration: every environment variable with each kind of bad value stops the
command before any database work, with exit code 2 and one line naming the variable."""

import subprocess

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.support import chaos_report
from tests.support.chaos import scalar
from tests.support.factories import Documents
from tests.support.invariants import documents_md5
from tests.support.ledger import day, expiring_in
from tests.support.processes import command_env, manage_py

TOO_BIG = "99999999999999999999"
BAD_VALUES: dict[str, list[str]] = {
    "REMINDER_THRESHOLDS_DAYS": [
        "", " ", "abc", "30,,7", "30,7,", "-1", "7,7", "1,7", "30;7", "1e3", "3.5", "0x10",
        "\u0663\u0660,7", "1000000000", TOO_BIG],
    "REMINDER_BATCH_SIZE": ["", "0", "-5", "abc", "1.5", "\uff15\uff10\uff10", "100001", TOO_BIG],
    "REMINDER_POLLING_INTERVAL": ["", "0", "0s", "abc", "-1h", "1y", "1h-", "\u0663h", "367d",
                                  TOO_BIG + "d"],
    "REMINDER_RUN_AT_UTC": ["", "24:00", "3pm", "03:60", "03:00Z", "3", "\u0660\u0663:\u0660\u0660", "-1:00"],
    "REMINDER_MAX_RUN_DURATION": ["", "0", "abc", "10x", "400d", TOO_BIG + "h"],
    "REMINDER_PRUNE_BUDGET": ["", "0", "abc", "1m-", "400d"],
    "REMINDER_RETENTION_DAYS": ["", "-1", "abc", "3651", TOO_BIG],
}
# Read by Django's settings, before any command runs: manage.py turns them into exit 2.
SETTINGS_BAD_VALUES: dict[str, list[str]] = {
    "DATABASE_URL": ["", "not a url", "mysql://u@h/db", "sqlite:///x.db", "postgres://",
                     "postgres://h:notaport/db", "postgres://h:99999/db"],
    "DB_STATEMENT_TIMEOUT_MS": ["abc", "-1"],
    "DB_CONNECT_TIMEOUT_S": ["1.5"],
    "LOG_FORMAT": ["yaml"],
    "LOG_LEVEL": ["LOUD"],
}


def written_rows() -> int:
    return int(scalar("select (select count(*) from document_expiry_reminder_runs)"
                      " + (select count(*) from document_expiry_reminders)"
                      " + (select count(*) from outbox_messages)"))


def test_every_bad_reminder_setting_is_refused_before_any_database_work(
    documents: Documents, monkeypatch: pytest.MonkeyPatch
) -> None:
    documents(expires_at=expiring_in(3))
    before = documents_md5()
    tried = exit_2 = 0
    for name, values in BAD_VALUES.items():
        for value in values:
            with monkeypatch.context() as env:
                env.setenv(name, value)
                with pytest.raises(CommandError) as refused:
                    call_command("run_expiry_reminders", "--as-of", day(0).isoformat())
            message = str(refused.value)
            assert refused.value.returncode == 2, (name, value)
            assert name in message and "\n" not in message, (name, value, message)
            tried += 1
            exit_2 += refused.value.returncode == 2
    rows_written = written_rows()
    chaos_report.record("bad configuration (REMINDER_*, in process)", variables=len(BAD_VALUES),
                        bad_values=tried, exit_2=exit_2, rows_written=rows_written)
    assert rows_written == 0 and documents_md5() == before


@pytest.mark.slow
def test_bad_settings_exit_2_with_one_line_naming_the_variable(documents: Documents) -> None:
    documents(expires_at=expiring_in(3))
    before = documents_md5()
    cases = [(name, value) for name, values in SETTINGS_BAD_VALUES.items() for value in values]
    cases += [(name, values[-1]) for name, values in BAD_VALUES.items()]  # the real exit path
    procs = []
    for name, value in cases:
        env = command_env()
        env[name] = value
        procs.append(subprocess.Popen(
            [*manage_py(), "run_expiry_reminders", "--as-of", day(0).isoformat()],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for (name, value), proc in zip(cases, procs, strict=True):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, (name, value, err)
        [line] = err.strip().splitlines()
        assert name in line, (name, value, line)
        assert out == ""
    rows_written = written_rows()
    chaos_report.record("bad configuration (subprocess)", variables=len({n for n, _ in cases}),
                        bad_values=len(cases), exit_2=sum(p.returncode == 2 for p in procs),
                        rows_written=rows_written)
    assert rows_written == 0 and documents_md5() == before
