"""manage.py run_expiry_reminders: one cycle (the manual re-trigger), or --loop on the schedule."""

import os
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from core.commands import ProjectCommand, stop_on_signals, usage_error
from core.config import parse_duration, parse_positive_int
from core.exit_codes import ExitCode
from core.progress import ProgressBar
from core.tracing import configure_tracing
from reminders.cli import parse_as_of, refuse_future_as_of
from reminders.config import load_settings
from reminders.loop import run_loop
from reminders.observe import ObservedCycles
from reminders.result import CycleResult
from reminders.serving import observed_loop


class Command(ProjectCommand):
    help = (
        "Find documents whose expiry is near or past, mark them in the ledger and write one "
        "reminder event per investor to the outbox. One cycle by default (the manual "
        "re-trigger); --loop runs on the schedule (REMINDER_RUN_AT_UTC, "
        "REMINDER_POLLING_INTERVAL). With --loop, METRICS_ADDR "
        "(e.g. 127.0.0.1:9108) serves /metrics, /healthz and /readyz; OTEL_* variables turn "
        "tracing on (docs/operations.md)."
    )
    exit_notes = {
        ExitCode.OK: "also stopped by SIGTERM/SIGINT",
        ExitCode.FAILED: "owners failed, retried next cycle, or a database error",
        ExitCode.USAGE: "also a transaction pooler without DATABASE_POOL_MODE=transaction",
        ExitCode.REFUSED: "a table or grant missing: migrate, apply_db_roles",
    }
    database_failure_prefix = "cycle failed: "

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--loop", action="store_true",
                            help="run on the schedule until SIGTERM/SIGINT")
        parser.add_argument("--as-of", metavar="DATE|INSTANT",
                            help="the cycle's as-of, ISO date or instant in UTC (default: now); "
                                 "a future as-of needs --dry-run")
        parser.add_argument("--dry-run", action="store_true",
                            help="write nothing; print what a cycle would remind")
        parser.add_argument("--batch-size", metavar="N",
                            help="documents per batch (overrides REMINDER_BATCH_SIZE)")
        parser.add_argument("--max-run-duration", metavar="DURATION",
                            help="time budget, e.g. 10m (overrides REMINDER_MAX_RUN_DURATION)")

    def handle(self, *args: Any, **options: Any) -> None:
        settings = load_settings(os.environ).with_overrides(
            batch_size=None if options["batch_size"] is None
            else parse_positive_int("--batch-size", options["batch_size"]),
            max_run_duration=None if options["max_run_duration"] is None
            else parse_duration("--max-run-duration", options["max_run_duration"]),
        )
        as_of = parse_as_of(options["as_of"]) if options["as_of"] else None
        refuse_future_as_of(as_of, dry_run=options["dry_run"])
        if options["loop"] and (as_of or options["dry_run"]):
            raise usage_error("--loop takes neither --as-of nor --dry-run")

        tracing = None
        try:
            tracing = configure_tracing()
            with stop_on_signals() as stop:
                if options["loop"]:
                    with observed_loop(settings, os.environ, stop=stop) as run_one:
                        run_loop(settings, run_one, stop=stop)
                    return
                # A bar on a terminal (log lines above it); nothing but the log elsewhere.
                with ProgressBar("due documents", "doc") as progress:
                    result = ObservedCycles(settings, stop=stop)(
                        as_of=as_of, dry_run=options["dry_run"], progress=progress)
        finally:
            if tracing is not None:
                tracing.shutdown()  # flush the spans still queued
        self._summarise(result)
        if line := result.failure_line():
            raise CommandError(line, returncode=result.exit_code)

    def _summarise(self, result: CycleResult) -> None:
        title = "Dry run: would remind" if result.dry_run else "Cycle"
        lines = [
            f"{title} {result.run_id} as of {result.as_of.isoformat()}: {result.status}",
            f"  documents in window      {result.window_documents}",
            f"  due documents            {result.due_documents}",
            f"  reminders sent           {result.reminders_sent}",
            f"  owners notified          {result.owners_notified}",
            f"  markers written          {result.markers_written}",
            f"  markers re-armed         {result.markers_rearmed}",
            f"  skipped already marked   {result.skipped_already_marked}",
            f"  pruned markers           {result.pruned}",
            f"  failed owners            {result.failed_owners}",
            f"  duration                 {result.duration_ms} ms",
        ]
        for threshold, count in sorted(result.reminders_by_threshold.items(), reverse=True):
            lines.append(f"  threshold {threshold:>3} days       {count}")
        self.stdout.write("\n".join(lines))
