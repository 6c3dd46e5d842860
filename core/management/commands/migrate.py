"""manage.py migrate: Django's, run again when a migration times out on its lock.

Each attempt is a new `migrate` (new transactions), so a migration that waited never holds its
place in the lock queue, or an open transaction, through the pause (core/migration_ops.py)."""

from typing import Any

from django.core.management import CommandError
from django.core.management.base import CommandParser
from django.core.management.commands import migrate

from core.commands import ExitCodeContract
from core.exit_codes import ExitCode
from core.migration_ops import (
    LOCK_ATTEMPTS,
    LOCK_RETRY_PAUSE_SECONDS,
    MigrationLockTimeoutError,
    migrate_with_lock_retries,
)


class Command(ExitCodeContract, migrate.Command):
    help = (migrate.Command.help + " A migration that times out on its lock (lock_timeout) is "
            "tried again, in a new transaction, up to --lock-attempts times.")
    exit_notes = {ExitCode.FAILED: "a migration still timed out on its lock after "
                  "--lock-attempts (the line names the sessions holding it), or a database "
                  "error", ExitCode.REFUSED: "the role may not create or alter a table"}

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--lock-attempts", type=int, default=LOCK_ATTEMPTS,
                            help=f"how many times to try (default {LOCK_ATTEMPTS})")
        parser.add_argument("--lock-retry-pause", type=float, default=LOCK_RETRY_PAUSE_SECONDS,
                            help="seconds between attempts (default "
                                 f"{LOCK_RETRY_PAUSE_SECONDS:g})")

    def handle(self, *args: Any, **options: Any) -> None:
        attempts = options.pop("lock_attempts", LOCK_ATTEMPTS)
        pause = options.pop("lock_retry_pause", LOCK_RETRY_PAUSE_SECONDS)
        try:
            migrate_with_lock_retries(lambda: super(Command, self).handle(*args, **options),
                                      attempts=attempts, pause_seconds=pause)
        except MigrationLockTimeoutError as timeout:
            raise CommandError(str(timeout), returncode=ExitCode.FAILED) from timeout
