"""manage.py check_reminders_health: the worker's liveness from the run history, for scripts."""

import os
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from core.commands import ProjectCommand
from core.config import parse_duration
from core.exit_codes import ExitCode
from reminders.config import load_settings
from reminders.health import liveness_from_history


class Command(ProjectCommand):
    help = (
        "Check from the run history that a cycle (of any instance) succeeded within "
        "--max-silence (default REMINDER_POLLING_INTERVAL plus 2h: 26h at the default 24h) and "
        "that no cycle is stuck past REMINDER_MAX_RUN_DURATION "
        "plus REMINDER_PRUNE_BUDGET plus a grace."
    )
    exit_notes = {
        ExitCode.OK: "healthy",
        ExitCode.FAILED: "unhealthy, or a database error",
        ExitCode.REFUSED: "a table or grant missing",
    }

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--max-silence", metavar="DURATION", default=None,
                            help="longest acceptable time since a successful cycle "
                                 "(default: REMINDER_POLLING_INTERVAL plus 2h)")

    def handle(self, *args: Any, **options: Any) -> None:
        settings = load_settings(os.environ)
        max_silence = (settings.max_silence if options["max_silence"] is None
                       else parse_duration("--max-silence", options["max_silence"]))
        # A database failure is the base command's: one line saying which, and its code.
        verdict = liveness_from_history(max_run_duration=settings.longest_cycle,
                                        max_silence=max_silence)
        if not verdict.ok:
            raise CommandError(f"unhealthy: {verdict.reason}", returncode=ExitCode.FAILED)
        self.stdout.write(f"healthy: {verdict.reason}")
