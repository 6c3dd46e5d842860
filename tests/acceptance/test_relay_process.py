"""The relay as operators run it: `manage.py publish_outbox` in a subprocess, as the relay's
role, killed with SIGKILL between produce and mark, stopped with SIGTERM, misconfigured."""

import json
import signal
import subprocess
import urllib.request
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
from django.db import connection

from core.roles import RELAY_ROLE
from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import read_topic
from tests.support.mock_controls import set_partition_leader
from tests.support.partitioner import keys_on
from tests.support.processes import command_env, manage_py
from tests.support.relay_support import (
    BASE_TIME,
    TOPIC,
    first_seen_order,
    insert_outbox,
    interleaved_rows,
    marking_held,
    outbox_state,
    unpublished_count,
    wait_for,
)

pytestmark = pytest.mark.slow


def relay_env(bootstrap: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in command_env(RELAY_ROLE).items() if not k.startswith("OUTBOX_")}
    env.update({"KAFKA_BOOTSTRAP_SERVERS": bootstrap, "OUTBOX_DELIVERY_TIMEOUT": "2s",
                "OUTBOX_POLL_INTERVAL": "200ms",
                "OUTBOX_BACKOFF_INITIAL": "100ms", "OUTBOX_BACKOFF_MAX": "500ms",
                "OUTBOX_SHUTDOWN_GRACE": "2s",
                # The stand-ins are one broker (Tansu: one copy of each record); the check of
                # the topic's durability is tested on its own (tests/integration/test_relay_topic.py).
                "OUTBOX_ALLOW_UNDURABLE_TOPIC": "on", **extra})
    return env


def start_relay(env: dict[str, str], *args: str, log: Path | None = None) -> subprocess.Popen[str]:
    """The relay in a subprocess; its stderr (JSON log lines) goes to `log` when given."""
    stderr = log.open("w") if log else subprocess.PIPE
    try:
        return subprocess.Popen([*manage_py(), "publish_outbox", *args], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=stderr)
    finally:
        if log:
            stderr.close()  # type: ignore[union-attr]


def run_relay(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*manage_py(), "publish_outbox", *args], env=env, text=True,
                          capture_output=True, timeout=120, check=False)


# Sessions of the relay role in this test database only: other suites share the server.
RELAY_SESSIONS = "pg_stat_activity where usename = %s and datname = current_database()"


def relay_blocked_on_mark() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            f"select count(*) from {RELAY_SESSIONS}"
            " and wait_event_type = 'Lock' and wait_event = 'advisory'", [RELAY_ROLE])
        return int(cursor.fetchone()[0]) > 0


def end_relay_sessions() -> None:
    # Only this test database's: other test runs on the server have relay sessions of their own.
    with connection.cursor() as cursor:
        cursor.execute(f"select pg_terminate_backend(pid) from {RELAY_SESSIONS}", [RELAY_ROLE])

    def gone() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(f"select count(*) from {RELAY_SESSIONS}", [RELAY_ROLE])
            return int(cursor.fetchone()[0]) == 0

    wait_for(gone, timeout=30, what="the relay's sessions to end")


def logged_events(log: Path) -> list[str]:
    """The `event` of each JSON line the relay wrote to `log` so far."""
    return [json.loads(line)["event"] for line in _log_lines(log.read_text())]


def test_killed_between_produce_and_mark_then_restarted_delivers_everything_at_least_once(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    written = interleaved_rows(keys=5, per_key=4)
    env = relay_env(kafka.bootstrap_servers)
    with marking_held():
        relay = start_relay(env)
        try:
            wait_for(relay_blocked_on_mark, timeout=60, what="the relay to wait on its mark")
            produced = read_topic(kafka.bootstrap_servers)
            assert len(produced) == 5  # the head of each key reached Kafka, none is marked yet
            relay.send_signal(signal.SIGKILL)
            relay.communicate(timeout=30)
            # The server would finish the orphaned mark once the lock goes; end it as a dead
            # client's session ends, so the kill lands before the mark.
            end_relay_sessions()
        finally:
            if relay.poll() is None:
                relay.kill()
                relay.communicate(timeout=30)
    assert relay.returncode == -signal.SIGKILL
    assert unpublished_count() == 20

    restarted = start_relay(env, "--loop")
    try:
        wait_for(lambda: unpublished_count() == 0, timeout=60, what="every row published")
    finally:
        restarted.send_signal(signal.SIGTERM)
        _, stderr = restarted.communicate(timeout=30)
    assert restarted.returncode == 0, stderr

    records = read_topic(kafka.bootstrap_servers)
    copies = Counter(r.message_id for r in records)
    assert set(copies) == {str(i) for ids in written.values() for i in ids}
    duplicated = {m for m, n in copies.items() if n > 1}
    assert duplicated == {r.message_id for r in produced}  # exactly the unmarked heads, again
    for message_id in duplicated:
        assert len({r.value for r in records if r.message_id == message_id}) == 1
    assert first_seen_order(records) == {k: [str(i) for i in ids] for k, ids in written.items()}


def test_sigterm_mid_batch_records_what_was_delivered_and_exits_0(
    transactional_db: None, kafka: MockKafkaCluster, tmp_path: Path
) -> None:
    written = interleaved_rows(keys=4, per_key=1)
    log = tmp_path / "relay.log"
    with marking_held():
        relay = start_relay(relay_env(kafka.bootstrap_servers), "--loop", log=log)
        try:
            wait_for(relay_blocked_on_mark, timeout=60, what="the relay to wait on its mark")
            relay.send_signal(signal.SIGTERM)
            wait_for(lambda: "stop requested" in log.read_text(), timeout=30,
                     what="the relay to take the signal while its batch is in flight")
        except BaseException:
            relay.kill()
            relay.communicate(timeout=30)
            raise
    relay.communicate(timeout=30)
    stderr = log.read_text()

    assert relay.returncode == 0, stderr
    assert unpublished_count() == 0
    assert '"event":"stop requested"' in stderr and '"event":"relay stopped"' in stderr
    # Every row the table counts as published is on the topic.
    published = {str(r["id"]) for r in outbox_state() if r["published_at"] is not None}
    assert published == {str(i) for ids in written.values() for i in ids}
    assert published <= {r.message_id for r in read_topic(kafka.bootstrap_servers)}


def test_sigterm_with_the_broker_down_releases_the_batch_within_the_grace_and_exits_0(
    transactional_db: None, kafka: MockKafkaCluster, tmp_path: Path
) -> None:
    interleaved_rows(keys=3, per_key=2)
    kafka.set_down()
    log = tmp_path / "relay.log"
    relay = start_relay(relay_env(kafka.bootstrap_servers, OUTBOX_DELIVERY_TIMEOUT="60s",
                                  OUTBOX_SHUTDOWN_GRACE="500ms",
                                  LOG_LEVEL="DEBUG"), "--loop", log=log)
    try:
        wait_for(lambda: "batch produced" in logged_events(log), timeout=60,
                 what="the relay to produce the heads")
        relay.send_signal(signal.SIGTERM)
        # Longer than the delivery timeout: a relay that ignored the grace still shows its gap.
        relay.communicate(timeout=90)
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.communicate(timeout=30)
    stderr = log.read_text()

    assert relay.returncode == 0, stderr
    state = outbox_state()
    assert all(r["published_at"] is None and r["detoured_at"] is None and r["available_at"] is None
               and r["attempts"] == 0 for r in state)
    # The grace, measured on the relay's own clock: from the signal to the batch's release.
    logged = {e["event"]: e for e in map(json.loads, _log_lines(stderr))}
    assert logged["messages released at stop"]["released"] == 3
    waited = (datetime.fromisoformat(logged["messages released at stop"]["ts"])
              - datetime.fromisoformat(logged["stop requested"]["ts"])).total_seconds()
    assert 0.5 - 0.01 <= waited < 0.5 + 5, waited  # the grace (500ms), not the delivery timeout


def test_one_pass_publishes_and_exits_0_with_a_summary(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    interleaved_rows(keys=3, per_key=2)

    done = run_relay(relay_env(kafka.bootstrap_servers))

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Relay pass: 6 published")
    assert unpublished_count() == 0


def test_one_pass_with_no_broker_exits_1_and_keeps_every_row(transactional_db: None) -> None:
    insert_outbox(str(uuid.uuid4()), created_at=BASE_TIME)

    done = run_relay(relay_env("127.0.0.1:9", OUTBOX_DELIVERY_TIMEOUT="300ms"))

    assert done.returncode == 1, done.stderr
    assert "1 released (broker unavailable)" in done.stderr
    assert [(r["published_at"], r["attempts"]) for r in outbox_state()] == [(None, 0)]


@pytest.mark.parametrize(
    ("variable", "value"),
    [("KAFKA_BOOTSTRAP_SERVERS", "nohost"), ("OUTBOX_BATCH_SIZE", "0"),
     ("OUTBOX_RETENTION", "forever"), ("OUTBOX_TOPICS", "pin.profile.*"),
     ("OUTBOX_TOPICS", "")],
)
def test_bad_configuration_exits_2_with_one_line_naming_the_variable(
    transactional_db: None, variable: str, value: str
) -> None:
    env = relay_env("127.0.0.1:9092")
    env[variable] = value

    done = run_relay(env)

    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and variable in lines[0]


def test_missing_bootstrap_exits_2(transactional_db: None) -> None:
    env = relay_env("x:1")
    del env["KAFKA_BOOTSTRAP_SERVERS"]

    done = run_relay(env)

    assert done.returncode == 2 and "KAFKA_BOOTSTRAP_SERVERS" in done.stderr


def test_the_demo_pieces_mock_cluster_relay_and_read_back(
    transactional_db: None, tmp_path: Path
) -> None:
    written = interleaved_rows(keys=3, per_key=2)
    bootstrap_file = tmp_path / "bootstrap"
    cluster = subprocess.Popen([*manage_py(), "mock_kafka", "--bootstrap-file", str(bootstrap_file)],
                               env=command_env(), text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    try:
        wait_for(bootstrap_file.exists, timeout=30, what="the mock cluster's bootstrap file")
        env = relay_env(bootstrap_file.read_text().strip())
        assert run_relay(env).returncode == 0
        shown = subprocess.run([*manage_py(), "read_outbox_topic", "--limit", "2"], env=env,
                               text=True, capture_output=True, timeout=60, check=True).stdout
    finally:
        cluster.send_signal(signal.SIGTERM)
        cluster.communicate(timeout=30)

    assert cluster.returncode == 0
    lines = shown.splitlines()
    assert lines[0] == "topic pin.profile.document-expiry-reminders.v1: 6 event(s) consumed"
    assert len(lines) == 3 and "Passport expires 2026-12-06 (7d threshold, 7 left)" in lines[1]
    assert any(key in lines[1] for key in written)
    assert "**" not in shown  # no number mask on the terminal


def test_loop_serves_its_counters_and_health_on_metrics_addr(
    transactional_db: None, kafka: MockKafkaCluster, tmp_path: Path
) -> None:
    interleaved_rows(keys=3, per_key=2)
    log = tmp_path / "relay.log"
    relay = start_relay(relay_env(kafka.bootstrap_servers, METRICS_ADDR="127.0.0.1:0"), "--loop",
                        log=log)
    try:
        wait_for(lambda: unpublished_count() == 0, timeout=60, what="the rows to go out")
        wait_for(lambda: '"metrics server listening"' in log.read_text(), what="the server")
        port = next(json.loads(line)["port"] for line in log.read_text().splitlines()
                    if '"metrics server listening"' in line)
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: "profile_outbox_published_total 6.0" in _get(f"{base}/metrics")[1],
                 timeout=30, what="the published counter to reach 6")
        scraped = _get(f"{base}/metrics")[1]
        health, ready = _get(f"{base}/healthz"), _get(f"{base}/readyz")
    finally:
        relay.send_signal(signal.SIGTERM)
        relay.communicate(timeout=30)

    assert relay.returncode == 0, log.read_text()
    assert "profile_outbox_parked_total 0.0" in scraped
    assert "profile_outbox_unpublished_messages 0.0" in scraped
    assert (health[0], ready[0]) == (200, 200)


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - a loopback URL
        return response.status, response.read().decode()


def _log_lines(stderr: str) -> list[str]:
    """The JSON log lines of a relay's stderr."""
    return [line for line in stderr.splitlines() if line.startswith('{"ts"')]


def test_one_pass_during_one_partitions_outage_records_the_others_and_exits_1_naming_it(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    """Partition 0's leader down: the pass delivers and records the other partitions' rows,
    defers partition 0's with no attempt counted, says so in the log, and exits 1."""
    kafka.create_topic(TOPIC, 3, 3)
    for partition, broker in enumerate(kafka.broker_ids):
        set_partition_leader(kafka, TOPIC, partition, broker)
    [down] = keys_on(0, 3, 1, "down")
    up = keys_on(1, 3, 1, "up") + keys_on(2, 3, 1, "up")
    rows = [insert_outbox(k, created_at=BASE_TIME) for k in (up[0], down, up[1])]
    kafka.set_down(kafka.broker_ids[0])

    done = run_relay(relay_env(kafka.bootstrap_servers))

    assert done.returncode == 1, done.stderr
    assert "1 deferred (a partition unavailable)" in done.stderr
    assert "  deferred (partition unavailable) 1" in done.stdout
    logged = [json.loads(line) for line in _log_lines(done.stderr)]
    [unavailable] = [e for e in logged if e["event"] == "kafka partition unavailable"]
    assert (unavailable["partition"], unavailable["deferred"]) == (0, 1)
    state = {r["id"]: r for r in outbox_state()}
    assert [r.id for r in rows if state[r.id]["published_at"] is None] == [rows[1].id]
    assert (state[rows[1].id]["attempts"], state[rows[1].id]["parked_at"]) == (0, None)
