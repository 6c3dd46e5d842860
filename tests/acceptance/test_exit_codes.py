"""One exit-code contract for every command (core/exit_codes.py, docs/commands.md "Exit
codes"), held by the real commands as an operator runs them: a usage error is 2, a database
that does not answer (a closed loopback port) is 3, a database without the project's tables (a
database never migrated) is 4, each with one line and no traceback; every `--help` ends with
its codes. The conditions only one command has are tested beside it (test_failure_messages,
test_poolers, test_relay_*, test_audit, test_kafka_security)."""

import contextlib
import io
import re
import subprocess
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from django.core.management import ManagementUtility
from django.db import connection

from core import build
from core.exit_codes import MEANINGS, ExitCode
from core.roles import ADMIN_WEB_ROLE, AUDITOR_ROLE, RELAY_ROLE, WORKER_ROLE
from tests.support.chaos_proxy import refused_port
from tests.support.db_roles import test_database_url
from tests.support.processes import ROOT, command_env, run_command

SUPERUSER = None  # the test cluster's configured user

# command -> (its arguments, the role it runs as): the commands of docs/commands.md's table.
COMMANDS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "run_expiry_reminders": (("--as-of", "2026-11-29T03:00:00Z"), WORKER_ROLE),
    "prune_reminders": ((), WORKER_ROLE),
    "check_reminders_health": ((), WORKER_ROLE),
    "publish_outbox": ((), RELAY_ROLE),
    "requeue_outbox": ((), RELAY_ROLE),
    "show_outbox": ((), ADMIN_WEB_ROLE),
    "audit_reminders": ((), AUDITOR_ROLE),
    "apply_db_roles": ((), SUPERUSER),
    "admin_user": (("someone", "--viewer"), SUPERUSER),
    "migrate": ((), SUPERUSER),
    "lint_migrations": ((), SUPERUSER),
}
# Not on a database never migrated: migrate would migrate it; lint_migrations reads no table.
NEEDS_TABLES = [name for name in COMMANDS if name not in ("migrate", "lint_migrations")]
# The relay asks Kafka for its metadata before the database fails it: a broker that is not
# there costs its delivery timeout, 2 s here, not the default 30.
KAFKA_UNUSED = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "OUTBOX_DELIVERY_TIMEOUT": "2s"}


def _role(command: str) -> str:
    return COMMANDS[command][1] or str(connection.settings_dict["USER"])


def _run(command: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {**command_env(_role(command), **KAFKA_UNUSED), "DATABASE_URL": url}
    return run_command(command, *COMMANDS[command][0], env=env)


def _last_line(stderr: str) -> str:
    """The command's own last line (the JSON log lines come before it)."""
    return [line for line in stderr.splitlines() if not line.startswith("{")][-1]


def _assert_one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    line = _last_line(done.stderr)
    assert line.startswith("CommandError: "), done.stderr[-3000:]
    return line


@pytest.fixture
def never_migrated(transactional_db: None) -> Iterator[str]:
    """A URL template ({role}) to a database of the test cluster that has none of the
    project's tables (dropped after the test)."""
    base = test_database_url().rsplit("/", 1)[0]
    name = f"never_migrated_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
        admin.execute(f'create database "{name}"')
    try:
        yield test_database_url("{role}").rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
            admin.execute(f'drop database if exists "{name}" with (force)')


def _argv(*argv: str) -> tuple[int, str, str]:
    """`manage.py ARGV` in this process, as the command line runs it (Django's
    ManagementUtility, argparse, the command's parser): its exit status, stdout and stderr.
    For what ends before any work (help, version, a usage error): no process to start."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            ManagementUtility(["manage.py", *argv]).execute()
            status = 0
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_ends_with_the_commands_exit_codes(command: str) -> None:
    status, stdout, stderr = _argv(command, "--help")

    assert status == 0, stderr
    epilog = stdout.split("exit codes (docs/commands.md):\n", 1)[1]
    listed = [int(code) for code in re.findall(r"^  (\d)  ", epilog, re.MULTILINE)]
    assert listed == [code.value for code in ExitCode], epilog
    for code in ExitCode:
        assert f"  {code.value}  {code.meaning}" in epilog


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_commands_version_is_the_projects(command: str) -> None:
    status, stdout, stderr = _argv(command, "--version")

    assert status == 0, stderr
    assert " ".join(stdout.split()) == build.describe()  # argparse wraps it


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unknown_option_is_usage_exit_2(command: str) -> None:
    status, _stdout, stderr = _argv(command, *COMMANDS[command][0], "--no-such-option")

    assert status == ExitCode.USAGE, stderr
    assert "unrecognized arguments: --no-such-option" in stderr
    assert "Traceback" not in stderr


def test_the_command_line_itself_exits_2_on_an_unknown_option() -> None:
    """The in-process runs above are the command line's own path: one real process says so."""
    done = run_command("show_outbox", "--no-such-option")

    assert done.returncode == ExitCode.USAGE, done.stderr
    assert "unrecognized arguments: --no-such-option" in done.stderr


@pytest.mark.django_db
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_database_that_does_not_answer_is_exit_3_in_one_line(command: str) -> None:
    with refused_port() as port:
        done = _run(command, f"postgres://{_role(command)}@127.0.0.1:{port}/nowhere")

    assert done.returncode == ExitCode.UNAVAILABLE, done.stderr[-3000:]
    line = _assert_one_line(done)
    assert "database unreachable: OperationalError: " in line and f"port {port}" in line


@pytest.mark.django_db
@pytest.mark.parametrize("command", NEEDS_TABLES)
def test_a_database_without_the_projects_tables_is_refused_exit_4_in_one_line(
    command: str, never_migrated: str,
) -> None:
    done = _run(command, never_migrated.format(role=_role(command)))

    assert done.returncode == ExitCode.REFUSED, done.stderr[-3000:]
    line = _assert_one_line(done)
    assert "missing table or grant: " in line and "manage.py migrate" in line


def test_the_docs_table_is_the_codes_of_core_exit_codes() -> None:
    text = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| \*\*(\d)\*\* \| ([^|]+) \|", section, re.MULTILINE)
    assert [(int(code), meaning.strip()) for code, meaning in rows] == [
        (code.value, MEANINGS[code]) for code in ExitCode]
