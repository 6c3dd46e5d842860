"""A rolling upgrade from the previous release (docs/releases.toml) to this checkout, with the
service running: the old release's worker and relay work on a database the old release
migrated, the new release's `migrate` runs under them, old and new run side by side, then only
the new. Nothing may be lost, duplicated beyond at-least-once, left for the audit, or block a
writer longer than the migration's lock timeout. Independent of what changed between the two:
it names no migration and no table but the ledger's and the outbox's."""

import json
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from core.config import parse_duration
from core.migration_ops import LOCK_TIMEOUT
from core.roles import AUDITOR_ROLE, RELAY_ROLE, WORKER_ROLE
from devtools.read_topic import read_topic
from tests.support.relay_support import wait_for
from tests.support.releases import ROOT, ReleaseNotFoundError, install, previous_release
from tests.support.tansu_support import TansuBroker
from tests.support.upgrade import (
    DocumentWriter,
    LockSampler,
    Side,
    connect,
    database_days,
    log_lines,
    own_database,
    unpublished,
)

pytestmark = pytest.mark.slow

# A writer queued behind a migration's lock request waits at most this long.
MIGRATION_LOCK_TIMEOUT_S = parse_duration("LOCK_TIMEOUT", LOCK_TIMEOUT).total_seconds()
RELAY_BATCH = 50
RELAY_SETTINGS = {"OUTBOX_BATCH_SIZE": str(RELAY_BATCH), "OUTBOX_DELIVERY_TIMEOUT": "2s",
                  "OUTBOX_POLL_INTERVAL": "200ms", "OUTBOX_BACKOFF_INITIAL": "100ms",
                  "OUTBOX_BACKOFF_MAX": "500ms", "OUTBOX_SHUTDOWN_GRACE": "2s"}
WRITERS = {WORKER_ROLE, RELAY_ROLE, "postgres"}  # the worker, the relay, the document writer
REPORT = ROOT / "artifacts" / "rolling-upgrade.txt"


def ok(done: subprocess.CompletedProcess[str], what: str) -> None:
    assert done.returncode == 0, f"{what} exited {done.returncode}:\n{done.stderr[-3000:]}"


def finished(process: subprocess.Popen[str], what: str) -> None:
    assert process.wait(timeout=120) == 0, f"{what} exited {process.returncode}"


def stop(process: subprocess.Popen[str], what: str) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    assert code == 0, f"{what} exited {code} on SIGTERM"


def kill_left(*processes: subprocess.Popen[str] | None) -> None:
    for process in processes:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def test_rolling_upgrade_from_the_previous_release_loses_nothing_and_blocks_no_writer(
    transactional_db: None, tansu: TansuBroker, tmp_path: Path
) -> None:
    started = time.monotonic()
    try:
        release = previous_release()
    except ReleaseNotFoundError as missing:
        pytest.fail(str(missing))  # never a skip: CI must run the upgrade it promises
    old_install = install(release, tmp_path / f"release-{release.version}")
    # Tansu validates every event, old or new, against the contract in its schema registry;
    # one broker, so the relay's topic check is told that one replica is expected.
    kafka = {"KAFKA_BOOTSTRAP_SERVERS": tansu.bootstrap_servers,
             "OUTBOX_ALLOW_UNDURABLE_TOPIC": "true"}
    relay_env = {**kafka, **RELAY_SETTINGS}

    with own_database() as database:
        old, new = Side(database, old_install), Side(database, None)
        ok(old.run("migrate", "--no-input"), "the old release's migrate")
        ok(old.run("create_dev_person_documents"), "the old release's person_documents")
        ok(old.run("apply_db_roles"), "the old release's apply_db_roles")
        # One-shot cycles from 7 to 2 days ago: the new loop's first tick (today's or
        # yesterday's 03:00 UTC, whatever the hour) is always a later day.
        days = database_days(database, range(7, 1, -1))

        def cycle(side: Side, day: int, name: str) -> subprocess.Popen[str]:
            return side.start(tmp_path / f"{name}-cycle-{day}.log", "run_expiry_reminders",
                              "--as-of", days[day].date().isoformat(), role=WORKER_ROLE)

        writer = DocumentWriter(database, first_expiry=days[0])
        sampler = LockSampler(database)
        old_relay = old.start(tmp_path / "old-relay.log", "publish_outbox", "--loop",
                              role=RELAY_ROLE, extra=relay_env)
        new_relay = loop = None
        writer.start()
        sampler.start()
        try:
            # The old release alone, documents coming in.
            for day in (0, 1):
                finished(cycle(old, day, "old"), f"old cycle {day}")

            # The new release's migrate while an old cycle and the old relay work.
            during = cycle(old, 2, "old")
            migrate_started, written_before = time.monotonic(), writer.written
            ok(new.run("migrate", "--no-input"), "the new release's migrate")
            migrate_seconds = time.monotonic() - migrate_started
            written_during_migrate = writer.written - written_before
            ok(new.run("apply_db_roles"), "the new release's apply_db_roles")
            finished(during, "the old cycle during migrate")
            # The old relay alone publishes on the new schema what the old worker wrote on it.
            wait_for(lambda: unpublished(database) == 0, timeout=60,
                     what="the old relay to publish on the new schema", interval=0.2)

            # Side by side: both relays (one leads), an old and a new cycle at once.
            new_relay = new.start(tmp_path / "new-relay.log", "publish_outbox", "--loop",
                                  role=RELAY_ROLE, extra=relay_env)
            side_by_side = [cycle(old, 3, "old"), cycle(new, 4, "new")]
            for process in side_by_side:
                finished(process, "a side-by-side cycle")
            stop(old_relay, "the old relay")

            # The new release alone: a cycle, then its loop's first tick after the last document.
            finished(cycle(new, 5, "new"), "the new cycle")
            documents = writer.stop()
            loop_log = tmp_path / "new-loop.log"
            loop = new.start(loop_log, "run_expiry_reminders", "--loop", role=WORKER_ROLE)
            wait_for(lambda: any(line.get("event") == "cycle completed"
                                 for line in log_lines(loop_log)),
                     timeout=120, what="the new loop's first cycle")
            stop(loop, "the new worker's loop")

            wait_for(lambda: unpublished(database) == 0, timeout=60, what="every event published",
                     interval=0.2)
            with connect(database) as conn:
                outbox = {str(i) for (i,) in conn.execute("select id from outbox_messages")}
                markers = set(conn.execute(
                    "select document_id::text, threshold_days from document_expiry_reminders"
                    " where notified"))
            stop(new_relay, "the new relay")
        finally:
            if writer.is_alive():
                writer.stop()
            kill_left(old_relay, new_relay, loop)
        waits = sampler.stop()

        audit = new.run("audit_reminders", "--against-topic", "--format", "json",
                        role=AUDITOR_ROLE, extra=kafka)
        records = read_topic(tansu.bootstrap_servers)
    seconds = time.monotonic() - started

    copies = Counter(r.message_id for r in records)
    repeated = {m: n for m, n in copies.items() if n > 1}
    summary = (f"rolling upgrade {release.version} ({release.resolved_by}) -> this checkout"
               f" ({'its own venv' if old_install.own_venv else 'same requirements: this venv'}):"
               f" {documents} documents written ({written_during_migrate} during migrate),"
               f" {len(outbox)} events, {len(markers)} reminders,"
               f" {len(records)} records ({len(repeated)} repeated); migrate {migrate_seconds:.1f} s;"
               f" lock waits (count, longest s) by role {waits.by_role()} in {waits.samples}"
               f" samples; {seconds:.1f} s in all\n")
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text(summary)
    sys.stderr.write(summary)  # the numbers, also when an assertion below fails

    assert written_during_migrate > 0, "no document was written while the new migrate ran"
    # No writer waited for a lock as long as the migration's lock timeout.
    assert waits.longest(WRITERS) < MIGRATION_LOCK_TIMEOUT_S, waits.by_role()
    # Nothing lost: every event the workers wrote is on the topic, and every reminder the
    # ledger holds as sent is in an event on the topic.
    assert set(copies) == outbox, (outbox - set(copies), set(copies) - outbox)
    on_topic: dict[tuple[str, int], set[str]] = defaultdict(set)
    for record in records:
        for item in json.loads(record.value)["documents"]:
            on_topic[(item["documentId"], int(item["thresholdDays"]))].add(record.message_id)
    assert set(on_topic) == markers
    # Duplicated no more than at-least-once allows: no reminder in two events (whichever
    # release wrote them); a message id on the topic more than once only as an identical copy,
    # at most twice, and at most one relay batch of them: the batch in flight at the one
    # hand-over (old relay stopped, new one leading). Two relays leading at once would repeat
    # far more.
    assert {k: ids for k, ids in on_topic.items() if len(ids) > 1} == {}
    assert max(repeated.values(), default=1) <= 2 and len(repeated) <= RELAY_BATCH, repeated
    for message_id in repeated:
        assert len({r.value for r in records if r.message_id == message_id}) == 1
    # Order per key: a key's records on one partition, whichever relay sent them (a key moved
    # to another partition mid-stream may reach a consumer ahead of its earlier events).
    partitions: dict[str, set[int]] = defaultdict(set)
    for record in records:
        partitions[record.key].add(record.partition)
    moved = {key: sorted(p) for key, p in partitions.items() if len(p) > 1}
    assert moved == {}, (f"{len(moved)} of {len(partitions)} keys on more than one partition"
                         f" (did the partitioner change?): {list(moved.items())[:5]}")
    # The audit (ledger, outbox, relay, topic) finds nothing and checked everything.
    assert audit.returncode == 0, f"{audit.stdout[-3000:]}\n{audit.stderr[-3000:]}"
    assert json.loads(audit.stdout)["verdict"] == "audit clean: no findings", audit.stdout

