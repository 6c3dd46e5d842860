"""manage.py prune_reminders: delete ledger markers whose document left the scan window (dated
by --as-of), and runs older than REMINDER_RUN_HISTORY_DAYS from the run history (aged on the
database's clock, as the cycle does)."""

import os
from argparse import ArgumentParser
from datetime import UTC, datetime
from typing import Any

from core.commands import ProjectCommand, stop_on_signals
from core.exit_codes import ExitCode
from core.progress import ProgressBar
from reminders import rules, store
from reminders.cli import parse_as_of
from reminders.config import load_settings
from reminders.retention import prune_expired_markers, prune_run_history, run_history_age


class Command(ProjectCommand):
    help = (
        "Delete markers whose UTC expiry date is before as-of minus REMINDER_RETENTION_DAYS, "
        "in bounded chunks, and runs that started more than REMINDER_RUN_HISTORY_DAYS (90) ago "
        "on the database's clock from the run history (--as-of does not move that cutoff; the "
        "cycle does both at its end too)."
    )
    exit_notes = {ExitCode.OK: "also stopped by SIGTERM/SIGINT",
                  ExitCode.REFUSED: "a table or grant missing"}

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--as-of", metavar="DATE|INSTANT",
                            help="ISO date or instant in UTC for the markers' cutoff "
                                 "(default: now)")
        parser.add_argument("--dry-run", action="store_true",
                            help="count what would be deleted; delete nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        settings = load_settings(os.environ)
        as_of = parse_as_of(options["as_of"]) if options["as_of"] else datetime.now(UTC)
        cutoff = rules.prune_cutoff(rules.utc_date(as_of), settings.retention_days)
        runs_age = run_history_age(settings)
        if options["dry_run"]:
            count = store.count_expired_markers("default", cutoff)
            runs, runs_cutoff = store.count_run_history("default", runs_age)
            self.stdout.write(f"would prune {count} marker(s) expiring before {cutoff}")
            self.stdout.write(f"would prune {runs} run(s) started before "
                              f"{runs_cutoff.isoformat()} (the database's now() minus "
                              f"{runs_age.days} days)")
            return
        with stop_on_signals() as stop, ProgressBar("markers pruned", "marker") as progress:
            # The count is for the bar alone: only a terminal shows it.
            total = store.count_expired_markers("default", cutoff) if progress.enabled else None
            progress(0, total)
            pruned = prune_expired_markers("default", cutoff, stop=stop,
                                           progress=lambda done: progress(done, total))
        self.stdout.write(f"pruned {pruned} marker(s) expiring before {cutoff}")
        runs = prune_run_history("default", runs_age)
        self.stdout.write(f"pruned {runs} run(s) started more than {runs_age.days} days ago "
                          "(on the database's clock)")
