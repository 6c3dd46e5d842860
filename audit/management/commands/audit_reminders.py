"""manage.py audit_reminders: the invariants the tests hold, checked read-only on the live
database (and with --against-topic on Kafka); docs/operations.md, "Auditing the reminders"."""

import dataclasses
import os
from argparse import ArgumentParser
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.management.base import CommandError
from django.db import connections

from audit.against_topic import BrokerRefusedError, BrokerUnavailableError, TopicReader
from audit.checks import AuditOptions, run_audit
from audit.loop import AuditMetrics, run_audit_loop
from audit.report import AuditReport, render_json, render_text
from audit.window import WindowError
from core.commands import ProjectCommand, refused, stop_on_signals, usage_error
from core.config import parse_duration, parse_positive_int
from core.db import DatabaseErrors
from core.exit_codes import ExitCode
from core.health import Heartbeat, database_ready
from core.ops_server import Probes, operations_server
from core.supervise import Backoff
from outbox.config import load_relay_settings
from reminders.cli import parse_as_of
from reminders.config import ReminderSettings, load_settings


class Command(ProjectCommand):
    help = (
        "Audit the reminders, read-only: the ledger against the outbox over the window "
        "(--since before --as-of), nothing due left behind by the last succeeded loop cycle, "
        "the relay's position (its cluster), waits and parked events, and with "
        "--against-topic the outbox against Kafka (the relay's KAFKA_* settings)."
    )
    exit_notes = {
        ExitCode.OK: "no findings: clean when every check ran; a check with nothing to examine "
        "says 'not checked' and why; what it only notes, already_queued, is no finding",
        ExitCode.FAILED: "findings, or a database error",
        ExitCode.USAGE: "also a window with nothing left to audit: an --as-of older than "
        "OUTBOX_RETENTION",
        ExitCode.UNAVAILABLE: "also Kafka did not answer",
        ExitCode.REFUSED: "the broker refused the audit's principal; a table or grant missing",
    }
    database_failure_prefix = "audit failed: "

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--as-of", metavar="DATE|INSTANT",
                            help="end of the window, ISO date or instant in UTC (default: now)")
        parser.add_argument("--since", metavar="DURATION", default="7d",
                            help="length of the window before --as-of (7d), at most "
                                 "OUTBOX_RETENTION back from now")
        parser.add_argument("--max-wait", metavar="DURATION",
                            help="longest an event may wait for the relay (default: "
                                 "REMINDER_POLLING_INTERVAL plus 2h)")
        parser.add_argument("--against-topic", action="store_true",
                            help="also reconcile the window's events with the topic")
        parser.add_argument("--kafka-timeout", metavar="DURATION", default="60s",
                            help="time to read the topic's window to its end (60s)")
        parser.add_argument("--limit", metavar="N", default="20",
                            help="ids listed per finding (20); the counts are whole")
        parser.add_argument("--format", choices=("text", "json"), default="text",
                            help="text for a person (default), json for a script")
        parser.add_argument("--loop", action="store_true",
                            help="audit now and then once per --every, its last findings per "
                                 "check as metrics on METRICS_ADDR; no --as-of")
        parser.add_argument("--every", metavar="DURATION",
                            help="with --loop: time between audits (default: "
                                 "REMINDER_POLLING_INTERVAL)")

    def handle(self, *args: Any, **options: Any) -> None:
        settings = load_settings(os.environ)
        audit = _audit_options(options, settings)
        every = (parse_duration("--every", options["every"]) if options["every"]
                 else settings.polling_interval)
        try:
            if options["loop"]:
                self._loop(audit, every, settings)
                return
            report = run_audit(audit)
        except WindowError as exc:
            raise usage_error(str(exc)) from None
        except BrokerRefusedError as exc:
            raise refused(f"audit failed: {exc}") from None
        except BrokerUnavailableError as exc:
            raise CommandError(f"audit failed: {exc}", returncode=ExitCode.UNAVAILABLE) from None
        self.stdout.write(render_json(report) if options["format"] == "json"
                          else render_text(report))
        if report.findings:
            raise CommandError(f"audit found {report.findings} finding(s)",
                               returncode=ExitCode.FAILED)

    def _loop(self, audit: AuditOptions, every: timedelta, settings: ReminderSettings) -> None:
        """--loop, with METRICS_ADDR's /metrics, /healthz (an audit within two intervals, or
        its failure) and /readyz (the database answers) (core.ops_server); a failure backs off
        from REMINDER_BACKOFF_INITIAL, never longer than an interval (core.supervise)."""
        beat = Heartbeat(timeout=2 * every + timedelta(minutes=10))
        metrics = AuditMetrics()

        def audit_now() -> AuditReport:
            beat.beat()
            try:
                return run_audit(dataclasses.replace(audit, as_of=datetime.now(UTC)))
            except DatabaseErrors:
                connections["default"].close()  # a fresh connection next time
                raise
            finally:
                beat.beat()

        with (operations_server(os.environ, Probes(beat.liveness, database_ready)),
              stop_on_signals() as stop):
            backoff = Backoff(settings.backoff_initial, min(settings.backoff_max, every),
                              wait=stop.wait)
            run_audit_loop(audit_now, every=every, backoff=backoff, stop=stop, metrics=metrics,
                           failures=(*DatabaseErrors, BrokerUnavailableError,
                                     BrokerRefusedError))


def _audit_options(options: dict[str, Any], settings: ReminderSettings) -> AuditOptions:
    """The audit's options from the command line's, refusing the combinations that make no
    sense (a usage error)."""
    relay = load_relay_settings(os.environ, need_kafka=options["against_topic"])
    if options["loop"] and options["as_of"]:
        raise usage_error("--loop takes no --as-of: each audit ends at its own now")
    if options["every"] and not options["loop"]:
        raise usage_error("--every goes with --loop")
    as_of = parse_as_of(options["as_of"]) if options["as_of"] else datetime.now(UTC)
    if as_of > datetime.now(UTC):
        raise usage_error(f"--as-of {as_of.isoformat()} is in the future")
    return AuditOptions(
        as_of=as_of,
        since=parse_duration("--since", options["since"]),
        retention_days=settings.retention_days,
        outbox_retention=relay.retention,
        max_wait=parse_duration("--max-wait", options["max_wait"]) if options["max_wait"]
        else settings.max_silence,
        limit=parse_positive_int("--limit", options["limit"]),
        topic_reader=TopicReader(relay, timeout_s=parse_duration(
            "--kafka-timeout", options["kafka_timeout"]).total_seconds())
        if options["against_topic"] else None,
        topics=relay.topics,
    )
