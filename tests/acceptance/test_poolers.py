"""The relay behind a real connection pooler (Debian's pgbouncer): by session it works; by
transaction it notices, as soon as its statements reach another server process than the one
holding its lead, and stops with exit 2 and one line, recording nothing it did not deliver
(docs/operations.md, "Connection poolers")."""

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

from core.roles import RELAY_ROLE
from devtools.mock_kafka import MockKafkaCluster
from devtools.topic import read_topic
from tests.acceptance.test_relay_process import relay_env, run_relay, start_relay
from tests.support.clusters import free_port
from tests.support.relay_support import (
    BASE_TIME,
    insert_outbox,
    outbox_state,
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
    (workdir / "users.txt").write_text(f'"postgres" ""\n"{RELAY_ROLE}" ""\n')
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


def through(port: int, env: dict[str, str]) -> dict[str, str]:
    """The relay's environment with DATABASE_URL through the pooler."""
    name = connection.settings_dict["NAME"]
    return {**env, "DATABASE_URL": f"postgres://{RELAY_ROLE}@127.0.0.1:{port}/{name}"}


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


def test_behind_a_pooler_by_transaction_the_relay_stops_in_one_line_and_loses_nothing(
    transactional_db: None, kafka: MockKafkaCluster, tmp_path: Path
) -> None:
    rows(20)
    log = tmp_path / "relay.log"
    with pgbouncer("transaction") as port:
        relay = start_relay(through(port, relay_env(kafka.bootstrap_servers,
                                                    OUTBOX_BATCH_SIZE="10")), "--loop", log=log)
        try:
            wait_for(lambda: unpublished_count() == 0, timeout=60, what="the first rows out")
            # The pooler closes its server connections as they are released: the one the
            # relay took the lead on is gone, the relay's next transaction reaches another.
            with psycopg.connect(f"postgres://postgres@127.0.0.1:{port}/pgbouncer",
                                 autocommit=True, prepare_threshold=None) as admin:
                admin.execute("RECONNECT")
            rows(20)
            relay.communicate(timeout=60)
        finally:
            if relay.poll() is None:
                relay.kill()
                relay.communicate()

    assert relay.returncode == 2, log.read_text()
    last = log.read_text().strip().splitlines()[-1]
    assert last.startswith("CommandError: bad configuration: DATABASE_URL: the relay took the"
                           " lead on server process"), last
    assert "pool_mode=transaction" in last
    published = {str(r["id"]) for r in outbox_state() if r["published_at"] is not None}
    assert len(published) < 40  # it stopped before the end, and nothing is lost:
    assert published <= {r.message_id for r in read_topic(kafka.bootstrap_servers)}
    # the rows it left behind go out with the next pass, straight to the database
    later = run_relay(relay_env(kafka.bootstrap_servers))
    assert later.returncode == 0, later.stderr
    assert unpublished_count() == 0
    every = {str(r["id"]) for r in outbox_state()}
    assert len(every) == 40 and every <= {r.message_id for r in read_topic(kafka.bootstrap_servers)}
