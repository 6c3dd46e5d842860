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
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from core.config import parse_duration
from core.migration_ops import LOCK_TIMEOUT
from core.roles import AUDITOR_ROLE, RELAY_ROLE, WORKER_ROLE
from devtools.read_topic import Record, read_topic
from tests.support.relay_support import wait_for
from tests.support.releases import (
    ROOT,
    Install,
    Release,
    ReleaseNotFoundError,
    install,
    previous_release,
)
from tests.support.tansu_support import TansuBroker
from tests.support.upgrade import (
    DocumentWriter,
    LockSampler,
    LockWaits,
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

    with own_database() as database:
        upgrade = Upgrade.on_the_old_release(database, old_install, tmp_path,
                                             relay_env={**kafka, **RELAY_SETTINGS})
        sampler = LockSampler(database)
        upgrade.start_the_old_relay()
        upgrade.writer.start()
        sampler.start()
        try:
            upgrade.the_old_release_alone()
            upgrade.the_new_migrate_under_the_old_release()
            upgrade.side_by_side()
            upgrade.the_new_release_alone()
            upgrade.read_what_was_written_once_all_is_published()
        finally:
            upgrade.stop_what_is_left()
        waits = sampler.stop()

        audit = upgrade.new.run("audit_reminders", "--against-topic", "--format", "json",
                                role=AUDITOR_ROLE, extra=kafka)
        records = read_topic(tansu.bootstrap_servers)
    seconds = time.monotonic() - started

    report_the_numbers(release, old_install, upgrade, records, waits, seconds=seconds)
    assert upgrade.written_during_migrate > 0, "no document was written while the new migrate ran"
    # No writer waited for a lock as long as the migration's lock timeout.
    assert waits.longest(WRITERS) < MIGRATION_LOCK_TIMEOUT_S, waits.by_role()
    check_nothing_lost(records, upgrade)
    check_duplicated_no_more_than_at_least_once_allows(records)
    check_order_per_key(records)
    check_the_audit_is_clean(audit)


@dataclass
class Upgrade:
    """The old release and the new on one database, the processes they run, and what the run
    measured."""

    old: Side
    new: Side
    days: list[datetime]  # the as-of days of the one-shot cycles
    logs: Path
    relay_env: dict[str, str]
    writer: DocumentWriter
    old_relay: subprocess.Popen[str] | None = None
    new_relay: subprocess.Popen[str] | None = None
    loop: subprocess.Popen[str] | None = None
    migrate_seconds: float = 0.0
    written_during_migrate: int = 0
    documents: int = 0  # written in all
    outbox: set[str] = field(default_factory=set)  # every event's id
    markers: set[tuple[str, int]] = field(default_factory=set)  # every reminder sent

    @classmethod
    def on_the_old_release(cls, database: str, old_install: Install, logs: Path,
                           relay_env: dict[str, str]) -> "Upgrade":
        """The database migrated by the old release, its documents and roles made by it."""
        old, new = Side(database, old_install), Side(database, None)
        ok(old.run("migrate", "--no-input"), "the old release's migrate")
        ok(old.run("create_dev_person_documents"), "the old release's person_documents")
        ok(old.run("apply_db_roles"), "the old release's apply_db_roles")
        # One-shot cycles from 7 to 2 days ago: the new loop's first tick (today's or
        # yesterday's 03:00 UTC, whatever the hour) is always a later day.
        days = database_days(database, range(7, 1, -1))
        writer = DocumentWriter(database, first_expiry=days[0])
        return cls(old, new, days, logs, relay_env, writer)

    def cycle(self, side: Side, day: int, name: str) -> subprocess.Popen[str]:
        return side.start(self.logs / f"{name}-cycle-{day}.log", "run_expiry_reminders",
                          "--as-of", self.days[day].date().isoformat(), role=WORKER_ROLE)

    def start_the_old_relay(self) -> None:
        self.old_relay = self.old.start(self.logs / "old-relay.log", "publish_outbox", "--loop",
                                        role=RELAY_ROLE, extra=self.relay_env)

    def the_old_release_alone(self) -> None:
        """The old release alone, documents coming in."""
        for day in (0, 1):
            finished(self.cycle(self.old, day, "old"), f"old cycle {day}")

    def the_new_migrate_under_the_old_release(self) -> None:
        """The new release's migrate while an old cycle and the old relay work."""
        during = self.cycle(self.old, 2, "old")
        migrate_started, written_before = time.monotonic(), self.writer.written
        ok(self.new.run("migrate", "--no-input"), "the new release's migrate")
        self.migrate_seconds = time.monotonic() - migrate_started
        self.written_during_migrate = self.writer.written - written_before
        ok(self.new.run("apply_db_roles"), "the new release's apply_db_roles")
        finished(during, "the old cycle during migrate")
        # The old relay alone publishes on the new schema what the old worker wrote on it.
        wait_for(lambda: unpublished(self.old.database) == 0, timeout=60,
                 what="the old relay to publish on the new schema", interval=0.2)

    def side_by_side(self) -> None:
        """Both relays (one leads), an old and a new cycle at once; then the old relay stops."""
        self.new_relay = self.new.start(self.logs / "new-relay.log", "publish_outbox", "--loop",
                                        role=RELAY_ROLE, extra=self.relay_env)
        side_by_side = [self.cycle(self.old, 3, "old"), self.cycle(self.new, 4, "new")]
        for process in side_by_side:
            finished(process, "a side-by-side cycle")
        assert self.old_relay is not None
        stop(self.old_relay, "the old relay")

    def the_new_release_alone(self) -> None:
        """A cycle, then its loop's first tick after the last document."""
        finished(self.cycle(self.new, 5, "new"), "the new cycle")
        self.documents = self.writer.stop()
        loop_log = self.logs / "new-loop.log"
        self.loop = self.new.start(loop_log, "run_expiry_reminders", "--loop", role=WORKER_ROLE)
        wait_for(lambda: any(line.get("event") == "cycle completed"
                             for line in log_lines(loop_log)),
                 timeout=120, what="the new loop's first cycle")
        stop(self.loop, "the new worker's loop")

    def read_what_was_written_once_all_is_published(self) -> None:
        """Every event published: the events and the reminders sent; then the new relay stops."""
        database = self.new.database
        wait_for(lambda: unpublished(database) == 0, timeout=60, what="every event published",
                 interval=0.2)
        with connect(database) as conn:
            self.outbox = {str(i) for (i,) in conn.execute("select id from outbox_messages")}
            self.markers = set(conn.execute(
                "select document_id::text, threshold_days from document_expiry_reminders"
                " where notified"))
        assert self.new_relay is not None
        stop(self.new_relay, "the new relay")

    def stop_what_is_left(self) -> None:
        if self.writer.is_alive():
            self.writer.stop()
        kill_left(self.old_relay, self.new_relay, self.loop)


def repeated_on_topic(records: list[Record]) -> dict[str, int]:
    """The message ids on the topic more than once, and how many times."""
    copies = Counter(r.message_id for r in records)
    return {m: n for m, n in copies.items() if n > 1}


def reminders_on_topic(records: list[Record]) -> dict[tuple[str, int], set[str]]:
    """(document, threshold) -> the message ids of the events on the topic that carry it."""
    on_topic: dict[tuple[str, int], set[str]] = defaultdict(set)
    for record in records:
        for item in json.loads(record.value)["documents"]:
            on_topic[(item["documentId"], int(item["thresholdDays"]))].add(record.message_id)
    return on_topic


def report_the_numbers(release: Release, old_install: Install, upgrade: Upgrade,
                       records: list[Record], waits: LockWaits, *, seconds: float) -> None:
    """The numbers to REPORT and stderr, also when an assertion after fails."""
    repeated = repeated_on_topic(records)
    summary = (f"rolling upgrade {release.version} ({release.resolved_by}) -> this checkout"
               f" ({'its own venv' if old_install.own_venv else 'same requirements: this venv'}):"
               f" {upgrade.documents} documents written"
               f" ({upgrade.written_during_migrate} during migrate),"
               f" {len(upgrade.outbox)} events, {len(upgrade.markers)} reminders,"
               f" {len(records)} records ({len(repeated)} repeated);"
               f" migrate {upgrade.migrate_seconds:.1f} s;"
               f" lock waits (count, longest s) by role {waits.by_role()} in {waits.samples}"
               f" samples; {seconds:.1f} s in all\n")
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text(summary)
    sys.stderr.write(summary)


def check_nothing_lost(records: list[Record], upgrade: Upgrade) -> None:
    """Every event the workers wrote is on the topic, and every reminder the ledger holds as
    sent is in an event on the topic."""
    copies = Counter(r.message_id for r in records)
    outbox = upgrade.outbox
    assert set(copies) == outbox, (outbox - set(copies), set(copies) - outbox)
    assert set(reminders_on_topic(records)) == upgrade.markers


def check_duplicated_no_more_than_at_least_once_allows(records: list[Record]) -> None:
    """No reminder in two events (whichever release wrote them); a message id on the topic more
    than once only as an identical copy, at most twice, and at most one relay batch of them:
    the batch in flight at the one hand-over (old relay stopped, new one leading). Two relays
    leading at once would repeat far more."""
    on_topic = reminders_on_topic(records)
    repeated = repeated_on_topic(records)
    assert {k: ids for k, ids in on_topic.items() if len(ids) > 1} == {}
    assert max(repeated.values(), default=1) <= 2 and len(repeated) <= RELAY_BATCH, repeated
    for message_id in repeated:
        assert len({r.value for r in records if r.message_id == message_id}) == 1


def check_order_per_key(records: list[Record]) -> None:
    """A key's records on one partition, whichever relay sent them (a key moved to another
    partition mid-stream may reach a consumer ahead of its earlier events)."""
    partitions: dict[str, set[int]] = defaultdict(set)
    for record in records:
        partitions[record.key].add(record.partition)
    moved = {key: sorted(p) for key, p in partitions.items() if len(p) > 1}
    assert moved == {}, (f"{len(moved)} of {len(partitions)} keys on more than one partition"
                         f" (did the partitioner change?): {list(moved.items())[:5]}")


def check_the_audit_is_clean(audit: subprocess.CompletedProcess[str]) -> None:
    """The audit (ledger, outbox, relay, topic) finds nothing and checked everything."""
    assert audit.returncode == 0, f"{audit.stdout[-3000:]}\n{audit.stderr[-3000:]}"
    assert json.loads(audit.stdout)["verdict"] == "audit clean: no findings", audit.stdout
