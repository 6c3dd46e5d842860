"""The services behind a real connection pooler (Debian's pgbouncer; docs/operations.md,
"Connection poolers"). The relay: by session it works; by transaction it refuses at start,
before it leads, with exit 2 and one line, publishing nothing. The worker, told
(`DATABASE_POOL_MODE=transaction`), completes its cycle by transaction: its due owners by
pages, nothing held across transactions; not told, it refuses at start with exit 2 and one
line naming DATABASE_POOL_MODE, writing nothing."""

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from core.roles import ADMIN_WEB_ROLE, RELAY_ROLE, WORKER_ROLE
from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import read_topic
from reminders import rules, store
from reminders.config import DEFAULT_THRESHOLDS
from tests.acceptance.test_relay_process import relay_env, run_relay
from tests.support.admin_data import finished_run, ledger_rows, staff_viewer
from tests.support.chaos import Worker, load_spread_documents
from tests.support.clusters import free_port
from tests.support.contract import assert_outbox_matches_contract
from tests.support.factories import Documents
from tests.support.ledger import AS_OF
from tests.support.relay_support import (
    BASE_TIME,
    insert_outbox,
    unpublished_count,
    wait_for,
)

pytestmark = pytest.mark.slow

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


@contextmanager
def pgbouncer(pool_mode: str) -> Iterator[int]:
    """A pgbouncer in front of the test database's server; its port."""
    settings = connection.settings_dict
    workdir = Path(tempfile.mkdtemp(prefix="pin-pgbouncer-", dir="/tmp"))
    port = free_port()
    (workdir / "users.txt").write_text(
        "".join(f'"{role}" ""\n' for role in ("postgres", RELAY_ROLE, WORKER_ROLE, ADMIN_WEB_ROLE)))
    (workdir / "pgbouncer.ini").write_text(f"""[databases]
* = host={settings['HOST'] or '127.0.0.1'} port={settings['PORT'] or 5432}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {workdir}/users.txt
admin_users = postgres
pool_mode = {pool_mode}
default_pool_size = 2
ignore_startup_parameters = extra_float_digits,options
""")
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_postgres:
        shutil.chown(workdir, "postgres")
        for name in ("users.txt", "pgbouncer.ini"):
            shutil.chown(workdir / name, "postgres")
    process = subprocess.Popen([*as_postgres, PGBOUNCER, str(workdir / "pgbouncer.ini")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def answers() -> bool:
            try:
                with psycopg.connect(f"postgres://postgres@127.0.0.1:{port}/postgres",
                                     connect_timeout=2):
                    return True
            except psycopg.OperationalError:
                assert process.poll() is None, f"pgbouncer exited {process.returncode}"
                return False

        wait_for(answers, timeout=30, what="pgbouncer to listen")
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)


def reconnect(port: int) -> None:
    """PgBouncer's RECONNECT: each server connection is closed once released."""
    with psycopg.connect(f"postgres://postgres@127.0.0.1:{port}/pgbouncer",
                         autocommit=True, prepare_threshold=None) as admin:
        admin.execute("RECONNECT")


def through(port: int, env: dict[str, str], role: str = RELAY_ROLE) -> dict[str, str]:
    """A command's environment with DATABASE_URL through the pooler, as `role`."""
    name = connection.settings_dict["NAME"]
    return {**env, "DATABASE_URL": f"postgres://{role}@127.0.0.1:{port}/{name}"}


def rows(count: int) -> None:
    for n in range(count):
        insert_outbox(str(uuid.uuid4()), created_at=BASE_TIME + timedelta(milliseconds=n))


def test_behind_a_pooler_by_session_the_relay_publishes_everything(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    rows(60)
    with pgbouncer("session") as port:
        done = run_relay(through(port, relay_env(kafka.bootstrap_servers,
                                                 OUTBOX_BATCH_SIZE="10")))

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Relay pass: 60 published")
    assert len({r.message_id for r in read_topic(kafka.bootstrap_servers)}) == 60


def test_behind_a_pooler_by_transaction_the_relay_refuses_at_start_in_one_line(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    rows(20)
    with pgbouncer("transaction") as port:
        done = run_relay(through(port, relay_env(kafka.bootstrap_servers)))

    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("CommandError: bad configuration: DATABASE_URL: the relay's "
                                "session and another one both reached server process"), lines
    assert "pool_mode=transaction" in lines[-1] and "pool_mode=session" in lines[-1]
    assert unpublished_count() == 20  # refused before it led: nothing published
    assert not read_topic(kafka.bootstrap_servers)


# Documents of the worker's cycle through the pooler; POOLER_TEST_DOCUMENTS=100000 for the
# measured run (docs/operations.md): CI keeps it small, with batches small enough for pages.
DOCUMENTS = int(os.environ.get("POOLER_TEST_DOCUMENTS", "3000"))
BATCH_SIZE = max(3, DOCUMENTS // 1000)


def _due_census() -> tuple[int, int]:
    """(due documents, owners with one) of the cycle at AS_OF, before it runs."""
    window = rules.scan_window(AS_OF.date(), DEFAULT_THRESHOLDS, 90)
    _in_window, due = store.window_census("default", window, DEFAULT_THRESHOLDS, AS_OF.date())
    with connection.cursor() as cursor:  # the ledger is empty: every window document is due
        cursor.execute("""
            select count(distinct owner_user_id) from person_documents
            where status = 'Active' and deleted_at is null
              and expires_at >= %s and expires_at < %s""", [window.start, window.end])
        row = cursor.fetchone()
    assert row is not None
    return due, int(row[0])


def test_behind_a_pooler_by_transaction_the_worker_completes_its_cycle_by_pages(
    documents: Documents,  # the documents table emptied after it, for the next test
) -> None:
    load_spread_documents(DOCUMENTS, AS_OF, seed=32)
    due, owners = _due_census()  # every window document of the backlog is due
    # Pages of DUE_PAGE_BATCHES (200) batches' documents in owners: several pages of owners.
    assert owners > 200 * BATCH_SIZE
    with pgbouncer("transaction") as port:
        worker = Worker.start(
            "--as-of", AS_OF.isoformat(),
            DATABASE_URL=through(port, {}, role=WORKER_ROLE)["DATABASE_URL"],
            DATABASE_POOL_MODE="transaction", REMINDER_BATCH_SIZE=str(BATCH_SIZE))
        worker.wait_logged("batch selected")
        # Mid-cycle, the pooler closes its server connections as they are released: whatever
        # a session held across transactions (a cursor WITH HOLD) is gone from the next one.
        reconnect(port)
        code, _out = worker.finish(timeout=1800)

    assert code == 0, "\n".join(worker.lines[-10:])
    [completed] = worker.logged("cycle completed")
    assert completed["status"] == "succeeded"
    assert completed["reminders_sent"] == due
    assert completed["owners_notified"] == owners
    with connection.cursor() as cursor:  # one event an owner, none read twice
        cursor.execute("select count(*), count(distinct message_key) from outbox_messages")
        assert cursor.fetchone() == (owners, owners)
    assert_outbox_matches_contract()


def _written() -> tuple[int, int, int]:
    """(markers, outbox events, recorded runs)."""
    with connection.cursor() as cursor:
        cursor.execute("""
            select (select count(*) from document_expiry_reminders),
                   (select count(*) from outbox_messages),
                   (select count(*) from document_expiry_reminder_runs)""")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


@pytest.mark.parametrize("loop", [False, True], ids=["one-cycle", "loop"])
def test_behind_a_pooler_by_transaction_untold_workers_refuse_at_start_writing_nothing(
    documents: Documents, loop: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    load_spread_documents(DOCUMENTS, AS_OF, seed=39)
    assert _due_census()[0] > 0
    monkeypatch.delenv("DATABASE_POOL_MODE", raising=False)  # the workers' environment: unset
    args = ("--loop",) if loop else ("--as-of", AS_OF.isoformat())
    with pgbouncer("transaction") as port:
        url = through(port, {}, role=WORKER_ROLE)["DATABASE_URL"]
        workers = [Worker.start(*args, DATABASE_URL=url, REMINDER_BATCH_SIZE=str(BATCH_SIZE))
                   for _ in range(2)]
        try:  # a worker that does not refuse may loop on: it fails the test, not hangs it
            for worker in workers:
                worker.proc.wait(timeout=120)
        finally:
            for worker in workers:
                if worker.proc.poll() is None:
                    worker.proc.kill()
        ends = [worker.finish() for worker in workers]

    for worker, (code, _out) in zip(workers, ends, strict=True):
        assert code == 2, "\n".join(worker.lines[-10:])
        [line] = worker.plain_lines()
        assert line.startswith("CommandError: bad configuration: DATABASE_POOL_MODE: unset or "
                               "session, but the worker's session and another one both reached "
                               "server process "), line
        assert "set DATABASE_POOL_MODE=transaction" in line and "nothing was written" in line
        assert not worker.logged("batch selected")
    assert _written() == (0, 0, 0)  # no marker, no event, no run recorded


def test_behind_a_pooler_by_transaction_the_admin_serves_its_pages(
    transactional_db: None, client: Client
) -> None:
    viewer = staff_viewer()
    ledger_rows(3, reminded_at=AS_OF)
    finished_run(AS_OF)
    pages = [reverse(f"admin:{page}") for page in (
        "reminders_documentexpiryreminder_changelist", "outbox_outboxmessage_changelist",
        "reminders_reminderrun_changelist", "reminders_overview")]
    settings = connection.settings_dict
    direct = dict(settings)
    with pgbouncer("transaction") as port:
        # The admin's connection as DATABASE_POOL_MODE=transaction makes it, through the pooler.
        settings.update(HOST="127.0.0.1", PORT=str(port), USER=ADMIN_WEB_ROLE,
                        DISABLE_SERVER_SIDE_CURSORS=True,
                        OPTIONS={**settings["OPTIONS"], "prepare_threshold": None})
        connection.close()
        try:
            client.force_login(viewer)
            for url in pages * 3:
                reconnect(port)  # each page on server connections the last one never used
                assert client.get(url).status_code == 200, url
        finally:
            connection.close()
            settings.clear()
            settings.update(direct)
