"""manage.py lint_migrations: squawk over the SQL of every migration (core/migrations_lint.py)."""

from typing import Any

from django.core.management import CommandError

from core.commands import ProjectCommand, usage_error
from core.exit_codes import ExitCode
from core.migrations_lint import BASELINE, SquawkMissingError, lint_migrations


class Command(ProjectCommand):
    help = ("Run squawk over `sqlmigrate` of every project migration. Fails on a finding "
            f"that {BASELINE.name} does not accept (only migrations before the baseline have "
            "accepted findings), and on an accepted finding squawk no longer reports. Needs a "
            "database connection (sqlmigrate introspects for some operations).")
    exit_notes = {ExitCode.FAILED: "a finding not accepted, a stale baseline entry, or squawk "
                  "failed", ExitCode.USAGE: "also no squawk installed"}

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            new, stale, linted = lint_migrations()
        except SquawkMissingError as exc:
            raise usage_error(str(exc)) from None
        except RuntimeError as exc:  # squawk itself failed
            raise CommandError(str(exc), returncode=ExitCode.FAILED) from None
        for finding in new:
            self.stderr.write(str(finding))
        for entry in stale:
            self.stderr.write(f"{entry}: accepted in {BASELINE.name} but no longer found: "
                              "remove it")
        if new or stale:
            raise CommandError(
                f"squawk: {len(new)} finding(s) not accepted, {len(stale)} stale baseline "
                "entr(ies); a new migration subclasses core.migration_ops.LockTimeoutMigration "
                "(docs/operations.md, \"Writing a migration\")")
        self.stdout.write(f"squawk: {linted} migrations, no finding beyond {BASELINE.name}")
