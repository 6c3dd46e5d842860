"""manage.py prune_reminders: delete ledger markers whose document left the scan window (dated
by --as-of), and runs older than REMINDER_RUN_HISTORY_DAYS from the run history (aged on the
database's clock, as the cycle does). A future --as-of is refused, and a prune of markers of
documents not expired yet, or of more than a tenth of the ledger, needs --yes."""

import os
from argparse import ArgumentParser
from datetime import UTC, datetime
from typing import Any

from core.commands import ProjectCommand, stop_on_signals, usage_error
from core.exit_codes import ExitCode
from core.progress import ProgressBar
from reminders import rules, store
from reminders.cli import parse_as_of, refuse_future_as_of
from reminders.config import load_settings
from reminders.retention import (
    CONFIRM_PERCENT,
    prune_expired_markers,
    prune_run_history,
    reasons_to_confirm,
    run_history_age,
)


class Command(ProjectCommand):
    help = (
        "Delete markers whose UTC expiry date is before as-of minus REMINDER_RETENTION_DAYS, "
        "in bounded chunks, and runs that started more than REMINDER_RUN_HISTORY_DAYS (90) ago "
        "on the database's clock from the run history (--as-of does not move that cutoff; the "
        "cycle does both at its end too). A future --as-of is refused (only --dry-run may look "
        "ahead); deleting markers of documents not expired yet (on the database's clock) or "
        f"more than {CONFIRM_PERCENT}% of the ledger needs --yes."
    )
    exit_notes = {ExitCode.OK: "also stopped by SIGTERM/SIGINT",
                  ExitCode.USAGE: "also a future --as-of, or a prune that needs --yes without it "
                                  "(nothing deleted)",
                  ExitCode.REFUSED: "a table or grant missing"}

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--as-of", metavar="DATE|INSTANT",
                            help="ISO date or instant in UTC for the markers' cutoff "
                                 "(default: now); a future one needs --dry-run")
        parser.add_argument("--dry-run", action="store_true",
                            help="count what would be deleted; delete nothing")
        parser.add_argument("--yes", action="store_true",
                            help="delete even markers of documents not expired yet, or more "
                                 f"than {CONFIRM_PERCENT}%% of the ledger")

    def handle(self, *args: Any, **options: Any) -> None:
        settings = load_settings(os.environ)
        as_of = parse_as_of(options["as_of"]) if options["as_of"] else None
        refuse_future_as_of(as_of, dry_run=options["dry_run"])
        as_of = as_of or datetime.now(UTC)
        cutoff = rules.prune_cutoff(rules.utc_date(as_of), settings.retention_days)
        runs_age = run_history_age(settings)
        census = store.prune_census("default", cutoff)
        reasons = reasons_to_confirm(census)
        if options["dry_run"]:
            runs, runs_cutoff = store.count_run_history("default", runs_age)
            self.stdout.write(f"would prune {census.expired} marker(s) expiring before {cutoff} "
                              f"(the ledger holds {census.markers})")
            if reasons:
                self.stdout.write(f"without --dry-run it needs --yes: {' and '.join(reasons)}")
            self.stdout.write(f"would prune {runs} run(s) started before "
                              f"{runs_cutoff.isoformat()} (the database's now() minus "
                              f"{runs_age.days} days)")
            return
        if reasons and not options["yes"]:
            raise usage_error(
                f"prune refused, nothing deleted: the markers expiring before {cutoff} are "
                f"{' and '.join(reasons)}; check --as-of and REMINDER_RETENTION_DAYS, "
                "or pass --yes to delete them")
        with stop_on_signals() as stop, ProgressBar("markers pruned", "marker") as progress:
            progress(0, census.expired)
            pruned = prune_expired_markers("default", cutoff, stop=stop,
                                           progress=lambda done: progress(done, census.expired))
        self.stdout.write(f"pruned {pruned} marker(s) expiring before {cutoff}")
        runs = prune_run_history("default", runs_age)
        self.stdout.write(f"pruned {runs} run(s) started more than {runs_age.days} days ago "
                          "(on the database's clock)")
