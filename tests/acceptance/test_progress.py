"""Progress as an operator sees it: on a terminal (a real pseudo-terminal) a cycle, a
relay pass and a prune show a tqdm bar, with the log lines written whole above it and never
inside the bar's line; without a terminal no bar character is written and every log line is
JSON."""

import json
import re
import uuid
from datetime import date, timedelta

import pytest
from django.db import connection

from core.roles import RELAY_ROLE
from devtools.demo_data import PersonDocument
from devtools.mock_kafka import MockKafkaCluster
from tests.support.contract import assert_outbox_matches_contract
from tests.support.factories import Documents, insert_documents
from tests.support.ledger import expiring_in
from tests.support.processes import command_env, run_command
from tests.support.relay_support import BASE_TIME, insert_outbox
from tests.support.terminal import BAR, BAR_CHARACTERS, TerminalRun, run_in_terminal

AS_OF_ARG = "2026-11-29T03:00:00Z"
OWNERS = 30
# A text log line on a terminal (core.logs): time, level, event.
LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR) +[a-z]")


def _terminal_env(role: str | None = None, **extra: str) -> dict[str, str]:
    # LOG_FORMAT auto: text on a terminal, JSON elsewhere (what an operator gets by default)
    env = command_env(role, **extra) if role else command_env(**extra)
    return {**env, "LOG_FORMAT": "auto", "TERM": "xterm"}


def _one_document_per_owner(owners: int = OWNERS) -> None:
    specs = []
    for n in range(owners):
        owner = uuid.uuid4()
        specs.append(PersonDocument(id=uuid.uuid4(), owner_user_id=owner, person_id=owner,
                                    type="Visa", number_mask=f"12 ** ****{n:02d}",
                                    expires_at=expiring_in(5)))
    insert_documents(specs)


def _assert_bar_above_whole_log_lines(run: TerminalRun, description: str, total: int,
                                      event: str, lines: int) -> None:
    assert run.returncode == 0, run.output[-3000:]
    bars = run.bars(description)
    assert bars, run.output[-3000:]
    final = bars[-1]
    assert (final["pct"], final["done"], final["total"]) == ("100", str(total), str(total))
    logged = [p for p in run.pieces() if event in p]
    assert len(logged) == lines, logged
    for piece in run.pieces():
        if event in piece or LOG_LINE.match(piece):
            # a whole log line: it starts its own terminal line and holds no bar
            assert LOG_LINE.match(piece) and not BAR_CHARACTERS.search(piece), repr(piece)
        if BAR.match(piece):
            assert not re.search(r"\d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR)", piece), repr(piece)


def _assert_no_bar_and_only_json(stderr: str) -> None:
    assert not BAR_CHARACTERS.search(stderr), stderr[-2000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines
    for line in lines:
        assert isinstance(json.loads(line), dict), line


def test_a_cycle_on_a_terminal_shows_a_bar_with_the_log_lines_above_it(
    documents: Documents,
) -> None:
    _one_document_per_owner()

    run = run_in_terminal("run_expiry_reminders", "--as-of", AS_OF_ARG,
                          env=_terminal_env(REMINDER_BATCH_SIZE="4"))

    _assert_bar_above_whole_log_lines(run, "due documents", OWNERS, "reminder queued", OWNERS)
    assert "reminders sent           30" in run.output
    assert_outbox_matches_contract()


def test_a_cycle_without_a_terminal_writes_json_lines_and_no_bar(documents: Documents) -> None:
    _one_document_per_owner()

    done = run_command("run_expiry_reminders", "--as-of", AS_OF_ARG,
                       env={**command_env(REMINDER_BATCH_SIZE="4"), "LOG_FORMAT": "auto"})

    assert done.returncode == 0, done.stderr
    _assert_no_bar_and_only_json(done.stderr)
    assert done.stderr.count('"event":"reminder queued"') == OWNERS
    assert_outbox_matches_contract()


def _expired_markers(count: int, expired_on: date) -> None:
    with connection.cursor() as cursor:
        for _ in range(count):
            cursor.execute(
                "insert into document_expiry_reminders (id, document_id, owner_user_id, type,"
                " threshold_days, expires_at, reminded_at, notified, run_id) values"
                " (gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Visa', 7, %s,"
                " now(), true, gen_random_uuid())", [expired_on])


def test_a_prune_on_a_terminal_shows_a_bar_and_without_one_only_json(
    documents: Documents,
) -> None:
    expired_on = date(2026, 11, 29) - timedelta(days=200)
    _expired_markers(12, expired_on)

    # The whole ledger goes: --yes.
    run = run_in_terminal("prune_reminders", "--as-of", AS_OF_ARG, "--yes", env=_terminal_env())
    _assert_bar_above_whole_log_lines(run, "markers pruned", 12, "markers pruned  cutoff", 1)
    assert "pruned 12 marker(s)" in run.output

    _expired_markers(3, expired_on)
    done = run_command("prune_reminders", "--as-of", AS_OF_ARG, "--yes",
                       env={**command_env(), "LOG_FORMAT": "auto"})
    assert done.returncode == 0 and "pruned 3 marker(s)" in done.stdout, done.stderr
    _assert_no_bar_and_only_json(done.stderr)


@pytest.mark.slow
def test_a_relay_pass_on_a_terminal_shows_a_bar_and_without_one_only_json(
    transactional_db: None, kafka: MockKafkaCluster,
) -> None:
    for n in range(20):
        insert_outbox(f"owner-{n}", created_at=BASE_TIME + timedelta(seconds=n))
    relay = {"KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers, "OUTBOX_BATCH_SIZE": "3",
             "LOG_LEVEL": "DEBUG"}

    run = run_in_terminal("publish_outbox", env=_terminal_env(RELAY_ROLE, **relay))
    _assert_bar_above_whole_log_lines(run, "outbox messages", 20, "batch done", 7)
    assert "Relay pass: 20 published in 7 batch(es)" in run.output

    for n in range(5):
        insert_outbox(f"later-{n}", created_at=BASE_TIME + timedelta(minutes=1, seconds=n))
    done = run_command("publish_outbox", env={**command_env(RELAY_ROLE, **relay),
                                              "LOG_FORMAT": "auto"})
    assert done.returncode == 0 and "Relay pass: 5 published" in done.stdout, done.stderr
    _assert_no_bar_and_only_json(done.stderr)
