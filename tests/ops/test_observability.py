"""Metrics, health and run-history pruning, in process, on real PostgreSQL as the worker role."""

import subprocess
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from prometheus_client import REGISTRY

from core.config import ConfigError
from core.gauges import DatabaseGauges
from core.health import Heartbeat
from core.ops_server import parse_listen_addr
from devtools.mock_kafka import MockKafkaCluster
from outbox import metrics as outbox_metrics
from reminders import metrics
from reminders.config import ReminderSettings, load_settings
from reminders.health import (
    STUCK_GRACE,
    LoopHealth,
    judge_liveness,
    liveness_from_history,
)
from reminders.models import ReminderRun
from reminders.observe import ObservedCycles
from reminders.result import CycleResult
from reminders.retention import prune_run_history
from reminders.serving import observed_loop, seed_from_history
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import as_worker
from tests.support.exported_metrics import exported_metric_names_by_process
from tests.support.factories import Documents
from tests.support.ledger import AS_OF, day, expiring_in
from tests.support.processes import command_env, manage_py
from tests.support.run_history import insert_run

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
# A process that runs cycles installs the reminder metrics (core.metrics); some tests below
# count without running one.
metrics.REMINDER_METRICS.install()
ZERO = timedelta(0)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.real_clock
def test_a_cycle_counts_reminders_per_threshold_duration_and_last_success(
    documents: Documents,
) -> None:
    documents(expires_at=expiring_in(7))
    documents(expires_at=expiring_in(30))
    documents(expires_at=expiring_in(-2))
    before = {t: sample("profile_document_expiry_reminders_total", threshold_days=t)
              for t in ("30", "7", "0")}
    cycles_before = sample("profile_document_expiry_reminder_cycle_duration_seconds_count")
    health = LoopHealth(max_run_duration=timedelta(minutes=10))

    with as_worker():
        result = ObservedCycles(ReminderSettings(), stop=threading.Event(), health=health)(
            as_of=AS_OF)

    assert result.status == ReminderRun.Status.SUCCEEDED
    assert {t: sample("profile_document_expiry_reminders_total", threshold_days=t) - before[t]
            for t in before} == {"30": 1, "7": 1, "0": 1}
    assert sample("profile_document_expiry_reminder_cycle_duration_seconds_count") == cycles_before + 1
    last = sample("profile_document_expiry_reminder_last_success_timestamp_seconds")
    assert abs(last - datetime.now(UTC).timestamp()) < 60
    assert health.last_success is not None and health.running_since is None
    assert_outbox_matches_contract()


def test_failed_owners_and_failed_cycles_count_as_errors() -> None:
    before = sample("profile_document_expiry_reminder_errors_total")
    last = sample("profile_document_expiry_reminder_last_success_timestamp_seconds")
    partial = _result(ReminderRun.Status.PARTIAL, failed_owners=3)
    failed = _result(ReminderRun.Status.FAILED)
    partial_finished = NOW + timedelta(seconds=17)
    assert last != partial_finished.timestamp()  # so that only the partial cycle can set it

    metrics.observe_cycle(partial, finished_at=partial_finished)
    after_partial = sample("profile_document_expiry_reminder_last_success_timestamp_seconds")
    metrics.observe_cycle(failed, finished_at=datetime(2000, 1, 1, tzinfo=UTC))

    assert sample("profile_document_expiry_reminder_errors_total") == before + 4
    assert after_partial == partial_finished.timestamp()  # partial did its work
    assert sample("profile_document_expiry_reminder_last_success_timestamp_seconds") == after_partial


def test_a_dry_run_is_not_counted() -> None:
    before = sample("profile_document_expiry_reminder_cycles_total", status="succeeded")
    result = _result(ReminderRun.Status.SUCCEEDED)
    result.dry_run = True
    metrics.observe_cycle(result)
    assert sample("profile_document_expiry_reminder_cycles_total", status="succeeded") == before


def test_rearmed_markers_are_counted() -> None:
    name = "profile_document_expiry_reminder_markers_rearmed_total"
    before = sample(name)
    result = _result(ReminderRun.Status.SUCCEEDED)
    result.markers_rearmed = 3
    metrics.observe_cycle(result)
    assert sample(name) == before + 3


def _result(status: str, failed_owners: int = 0) -> CycleResult:
    result = CycleResult(run_id=uuid.uuid4(), as_of=AS_OF, status=status)
    result.failed_owners = failed_owners
    return result


def test_backlog_counts_due_documents_until_a_cycle_marks_them(documents: Documents) -> None:
    documents(expires_at=expiring_in(7))
    documents(expires_at=expiring_in(0))
    documents(expires_at=expiring_in(45))  # outside the window
    settings = ReminderSettings()

    with as_worker():
        before = metrics.read_backlog(settings, now=AS_OF)
        ObservedCycles(settings, stop=threading.Event())(as_of=AS_OF)
        after = metrics.read_backlog(settings, now=AS_OF)
        next_week = metrics.read_backlog(settings, now=day(7))

    assert before == {metrics.BACKLOG: 2}
    assert after == {metrics.BACKLOG: 0}
    assert next_week == {metrics.BACKLOG: 1}  # the 7-day one reaches 0; the other is done
    assert_outbox_matches_contract()


def test_outbox_gauges_as_the_worker_role(documents: Documents) -> None:
    documents(expires_at=expiring_in(7))
    documents(expires_at=expiring_in(1))
    with as_worker():
        ObservedCycles(ReminderSettings(), stop=threading.Event())(as_of=AS_OF)
    with connection.cursor() as cursor:
        cursor.execute("update outbox_messages set created_at = now() - interval '90 seconds'")
        cursor.execute("update outbox_messages set parked_at = now(), detoured_at = now(),"
                       " last_error = 'too large'"
                       " where id = (select id from outbox_messages limit 1)")

    with as_worker():
        values = outbox_metrics.read_outbox_backlog()

    assert values[outbox_metrics.UNPUBLISHED] == 1
    assert values[outbox_metrics.PARKED] == 1
    assert 90 <= values[outbox_metrics.OLDEST_AGE] < 600
    assert_outbox_matches_contract()


def test_the_worker_role_still_cannot_read_outbox_headers(transactional_db: None) -> None:
    """The metrics read the bookkeeping timestamps and the claim an id's stored body
    (docs/design.md §5); the headers stay the relay's."""
    with as_worker(), pytest.raises(Exception, match="permission denied"), \
            connection.cursor() as cursor:
        cursor.execute("select headers from outbox_messages")


def test_relay_counters_add_up() -> None:
    outbox_metrics.install_relay_metrics()  # as the relay does; twice is harmless
    outbox_metrics.install_relay_metrics()
    before = [sample(n) for n in ("profile_outbox_published_total", "profile_outbox_failed_total",
                                  "profile_outbox_parked_total")]
    outbox_metrics.record_published(5)
    outbox_metrics.record_failed(2)
    outbox_metrics.record_parked()
    after = [sample(n) for n in ("profile_outbox_published_total", "profile_outbox_failed_total",
                                 "profile_outbox_parked_total")]
    assert [a - b for a, b in zip(after, before, strict=True)] == [5, 2, 1]


def test_database_gauges_are_read_once_per_refresh_and_again_after_invalidate() -> None:
    reads: list[int] = []
    now = [100.0]

    def read() -> dict[str, float]:
        reads.append(1)
        return {"g": float(len(reads))}

    gauges = DatabaseGauges({"g": "a gauge"}, read, refresh_s=30, clock=lambda: now[0])
    assert gauges.values() == {"g": 1.0}
    now[0] += 29
    assert gauges.values() == {"g": 1.0}
    now[0] += 1
    assert gauges.values() == {"g": 2.0}
    gauges.invalidate()
    assert [m.samples[0].value for m in gauges.collect()] == [3.0]
    assert [m.name for m in gauges.describe()] == ["g"]


def test_background_gauges_never_make_a_scrape_wait_after_the_first() -> None:
    release = threading.Event()
    reads: list[int] = []
    now = [0.0]

    def read() -> dict[str, float]:
        if reads:
            assert release.wait(30)  # a slow census
        reads.append(1)
        return {"g": float(len(reads))}

    gauges = DatabaseGauges({"g": "a gauge"}, read, refresh_s=60, clock=lambda: now[0],
                            background=True)
    assert gauges.values() == {"g": 1.0}  # the first scrape waits for the first read
    now[0] += 61
    assert gauges.values() == {"g": 1.0}  # stale: answered at once, refreshed behind
    assert gauges.values() == {"g": 1.0}  # one refresh at a time
    release.set()
    deadline = time.monotonic() + 30
    while gauges.values() != {"g": 2.0}:
        assert time.monotonic() < deadline, "the background refresh never landed"
        time.sleep(0.01)
    assert len(reads) == 2


def test_a_failed_read_keeps_the_values_and_waits_for_the_next_refresh() -> None:
    outcomes: list[dict[str, float] | Exception] = [
        {"g": 1.0}, psycopg.OperationalError("down"), {"g": 3.0}]
    now = [0.0]

    def read() -> dict[str, float]:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    gauges = DatabaseGauges({"g": "a gauge"}, read, refresh_s=10, clock=lambda: now[0])
    assert gauges.values() == {"g": 1.0}
    now[0] += 10
    assert gauges.values() == {"g": 1.0}  # the read failed: last values kept
    now[0] += 5
    assert gauges.values() == {"g": 1.0} and len(outcomes) == 1  # no retry on every scrape
    now[0] += 5
    assert gauges.values() == {"g": 3.0}


def test_liveness_rules() -> None:
    budget = timedelta(minutes=10)
    ok = judge_liveness(since_success=timedelta(hours=25), alive_for=ZERO, running_for=None,
                        max_run_duration=budget)
    silent = judge_liveness(since_success=timedelta(hours=26) + timedelta(seconds=1), alive_for=ZERO,
                            running_for=None, max_run_duration=budget)
    fresh = judge_liveness(since_success=None, alive_for=timedelta(hours=1), running_for=None,
                           max_run_duration=budget)
    never = judge_liveness(since_success=None, alive_for=timedelta(hours=27), running_for=None,
                           max_run_duration=budget)
    busy = judge_liveness(since_success=ZERO, alive_for=ZERO,
                          running_for=budget + STUCK_GRACE, max_run_duration=budget)
    stuck = judge_liveness(since_success=ZERO, alive_for=ZERO,
                           running_for=budget + STUCK_GRACE + timedelta(seconds=1),
                           max_run_duration=budget, running_since=NOW)
    assert (ok.ok, silent.ok, fresh.ok, never.ok, busy.ok, stuck.ok) == (
        True, False, True, False, True, False)
    assert "stuck" in stuck.reason and NOW.isoformat() in stuck.reason
    unknown_start = judge_liveness(since_success=None, alive_for=ZERO,
                                   running_for=timedelta(hours=1), max_run_duration=budget)
    assert unknown_start.reason == "stuck: a cycle has been running for 1:00:00"
    assert "no successful cycle" in silent.reason and "last: never" in never.reason


@pytest.mark.real_clock  # the faked clocks put the worker's clock a day behind or years ahead
def test_run_history_is_pruned_by_age_on_the_database_clock(transactional_db: None) -> None:
    old = [insert_run(timedelta(days=d), "succeeded") for d in (91, 200)]
    crashed = insert_run(timedelta(days=95), "running", finished=False)
    kept = [insert_run(timedelta(days=d), "succeeded") for d in (0, 1, 89)]

    with as_worker():
        pruned = prune_run_history("default", timedelta(days=90), chunk=1)

    remaining = set(ReminderRun.objects.values_list("run_id", flat=True))
    assert pruned == 3 and remaining == set(kept)
    assert not remaining & {*old, crashed}


def test_run_history_days_setting() -> None:
    assert load_settings({}).run_history_days == 90
    assert load_settings({"REMINDER_RUN_HISTORY_DAYS": "30"}).run_history_days == 30
    with pytest.raises(ConfigError, match="REMINDER_RUN_HISTORY_DAYS"):
        load_settings({"REMINDER_RUN_HISTORY_DAYS": "0"})


@pytest.mark.real_clock
def test_liveness_from_run_history(transactional_db: None) -> None:
    budget = timedelta(minutes=10)
    with as_worker():
        assert not liveness_from_history(max_run_duration=budget).ok  # nothing ever ran
        insert_run(timedelta(hours=30), "succeeded")
        assert not liveness_from_history(max_run_duration=budget).ok
        insert_run(timedelta(hours=2), "succeeded")
        assert liveness_from_history(max_run_duration=budget).ok
        insert_run(timedelta(hours=1), "running", finished=False)
        assert "stuck" in liveness_from_history(max_run_duration=budget).reason


@pytest.mark.parametrize(("raw", "expected"), [
    ("127.0.0.1:9108", ("127.0.0.1", 9108)), (":9108", ("", 9108)),
    ("[::1]:0", ("::1", 0)), ("localhost:80", ("localhost", 80)),
])
def test_listen_addresses(raw: str, expected: tuple[str, int]) -> None:
    assert parse_listen_addr("METRICS_ADDR", raw) == expected


@pytest.mark.parametrize("raw", ["9108", "127.0.0.1", "host:99999", "a:b"])
def test_bad_listen_addresses(raw: str) -> None:
    with pytest.raises(ConfigError, match="METRICS_ADDR"):
        parse_listen_addr("METRICS_ADDR", raw)


def _health(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*manage_py(), "check_reminders_health"], env=command_env(**env),
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.real_clock
def test_health_command_exit_codes(transactional_db: None) -> None:
    assert _health().returncode == 1  # no cycle has ever run
    insert_run(timedelta(hours=3), "succeeded")
    healthy = _health()
    assert (healthy.returncode, healthy.stdout.startswith("healthy")) == (0, True)
    assert _health(REMINDER_MAX_RUN_DURATION="soon").returncode == 2
    unreachable = subprocess.run(
        [*manage_py(), "check_reminders_health"], capture_output=True, text=True, timeout=60,
        check=False, env={**command_env(), "DATABASE_URL": "postgres://nobody@127.0.0.1:1/x",
                          "DB_CONNECT_TIMEOUT_S": "2"})
    assert unreachable.returncode == 3, unreachable.stderr


def test_health_command_limit_is_the_polling_interval_plus_two_hours(
    transactional_db: None,
) -> None:
    insert_run(timedelta(hours=30), "succeeded")
    assert _health().returncode == 1  # 26 h at the default 24 h
    assert _health(REMINDER_POLLING_INTERVAL="48h").returncode == 0  # 50 h
    insert_run(timedelta(hours=15), "succeeded")
    assert _health().returncode == 0
    unhealthy = _health(REMINDER_POLLING_INTERVAL="12h")  # 14 h
    assert unhealthy.returncode == 1 and "14:00:00" in unhealthy.stderr


@pytest.mark.parametrize(("interval_h", "alive"), [(12, False), (24, True), (48, True)])
def test_loop_liveness_limit_is_the_polling_interval_plus_two_hours(
    transactional_db: None, interval_h: int, alive: bool,
) -> None:
    settings = ReminderSettings(polling_interval=timedelta(hours=interval_h))
    with observed_loop(settings, {}, stop=threading.Event()) as cycles:
        health = cycles.health
    assert health is not None
    health.seen_success(timedelta(hours=20), now=NOW)

    assert health.liveness(NOW).ok is alive


@pytest.mark.real_clock  # the faked clocks put the worker's clock a day behind or years ahead
@pytest.mark.parametrize(("success_hours_ago", "alive"), [(20, True), (27, False)])
def test_a_restarted_loop_takes_the_last_success_by_its_age_on_the_database_clock(
    transactional_db: None, success_hours_ago: int, alive: bool,
) -> None:
    insert_run(timedelta(hours=success_hours_ago), "succeeded")  # ended a minute after its start
    health = LoopHealth(max_run_duration=timedelta(minutes=10),
                        started_at=datetime.now(UTC) - timedelta(days=3))  # no fresh-start grace

    with as_worker():
        seed_from_history(health)

    ended_ago = timedelta(hours=success_hours_ago) - timedelta(minutes=1)
    assert health.liveness().ok is alive, health.liveness().reason
    worker_clock_then = (datetime.now(UTC) - ended_ago).timestamp()  # the gauge's clock
    assert abs(sample("profile_document_expiry_reminder_last_success_timestamp_seconds")
               - worker_clock_then) < 60


@pytest.mark.real_clock
def test_prune_command_prunes_the_run_history(transactional_db: None) -> None:
    insert_run(timedelta(days=40), "succeeded")
    kept = insert_run(timedelta(days=10), "succeeded")

    def prune(*args: str) -> str:
        done = subprocess.run([*manage_py(), "prune_reminders", *args], capture_output=True,
                              text=True, timeout=60, check=True,
                              env=command_env(REMINDER_RUN_HISTORY_DAYS="30"))
        return done.stdout

    assert "would prune 1 run(s)" in prune("--dry-run")
    assert ReminderRun.objects.count() == 2
    assert "pruned 1 run(s)" in prune()
    assert list(ReminderRun.objects.values_list("run_id", flat=True)) == [kept]


def test_heartbeat_liveness_for_the_relay_loop() -> None:
    beat = Heartbeat(timeout=timedelta(minutes=5), last_beat=NOW)
    assert beat.liveness(NOW + timedelta(minutes=5)).ok
    assert not beat.liveness(NOW + timedelta(minutes=5, seconds=1)).ok
    beat.beat(NOW + timedelta(minutes=6))
    assert beat.liveness(NOW + timedelta(minutes=7)).ok


@pytest.mark.slow
def test_the_worker_and_the_audit_serve_the_outbox_backlog_but_none_of_the_relays_own_metrics(
    transactional_db: None, kafka: MockKafkaCluster, tmp_path: Path
) -> None:
    """A worker never relays: the relay's counters, latency and broker gauges would sit at 0
    on its /metrics and read as "the relay published nothing". The backlog gauges are real
    there (read from the table), so they stay."""
    scraped = exported_metric_names_by_process(tmp_path, kafka.bootstrap_servers)
    relay_own = {"profile_outbox_published_total", "profile_outbox_failed_total",
                 "profile_outbox_parked_total", "profile_outbox_broker_connected",
                 "profile_outbox_delivery_latency_seconds_bucket",
                 "profile_outbox_producer_queue_messages", "profile_outbox_producer_queue_bytes",
                 "profile_outbox_broker_rtt_seconds"}
    backlog = set(outbox_metrics.GAUGES)
    assert relay_own <= scraped["relay"] and backlog <= scraped["relay"]
    for process in ("worker", "audit"):  # both on core.ops_server.operations_server
        outbox_served = {n for n in scraped[process] if n.startswith("profile_outbox_")}
        assert outbox_served == backlog, process
    for process in ("worker", "relay", "audit"):  # and each says which build it runs
        assert "pin_profile_reminders_build_info" in scraped[process], process
