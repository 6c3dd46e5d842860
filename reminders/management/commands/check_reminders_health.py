"""manage.py check_reminders_health: the worker's liveness from the run history, for scripts."""

import os
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from core.commands import EXIT_FAILED, ProjectCommand
from core.config import parse_duration
from core.db import DatabaseErrors
from core.failures import classify_on
from reminders.config import load_settings
from reminders.health import liveness_from_history

EXIT_UNHEALTHY = EXIT_FAILED
EXIT_DATABASE_UNAVAILABLE = 3


class Command(ProjectCommand):
    help = (
        "Check from the run history that a cycle (of any instance) succeeded within "
        "--max-silence (default REMINDER_POLLING_INTERVAL plus 2h: 26h at the default 24h) and "
        "that no cycle is stuck past REMINDER_MAX_RUN_DURATION "
        "plus REMINDER_PRUNE_BUDGET plus a grace. Exit codes: 0 healthy, 1 unhealthy, 2 bad "
        "configuration or usage, 3 database unavailable (unreachable, a table or grant missing, "
        "or another database error: the line says which)."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--max-silence", metavar="DURATION", default=None,
                            help="longest acceptable time since a successful cycle "
                                 "(default: REMINDER_POLLING_INTERVAL plus 2h)")

    def handle(self, *args: Any, **options: Any) -> None:
        settings = load_settings(os.environ)
        max_silence = (settings.max_silence if options["max_silence"] is None
                       else parse_duration("--max-silence", options["max_silence"]))
        try:
            verdict = liveness_from_history(max_run_duration=settings.longest_cycle,
                                            max_silence=max_silence)
        except DatabaseErrors as exc:
            # Which: unreachable (with host, port and user; never a password), or a table or
            # grant missing (with the fix), or another database error.
            raise CommandError(classify_on(exc, "default").reason,
                               returncode=EXIT_DATABASE_UNAVAILABLE) from None
        if not verdict.ok:
            raise CommandError(f"unhealthy: {verdict.reason}", returncode=EXIT_UNHEALTHY)
        self.stdout.write(f"healthy: {verdict.reason}")
