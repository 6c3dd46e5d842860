"""squawk over the SQL of every project migration (`manage.py lint_migrations`, scripts/test.sh).

A migration named in core/squawk_baseline.toml (those before the baseline) may have exactly the
findings listed there, each accepted with a reason; any other migration may have none. A listed
finding that squawk no longer reports is stale and fails too, so the file stays true.
"""

import io
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from django.apps import apps
from django.conf import settings
from django.core.management import call_command
from django.db.migrations.loader import MigrationLoader

BASELINE = Path(__file__).parent / "squawk_baseline.toml"


@dataclass(frozen=True)
class Finding:
    migration: str  # "app.name"
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.migration}:{self.line}: {self.rule}: {self.message}"


def is_project_app(name: str, path: str | Path, root: Path) -> bool:
    """Whether the app `name` (its module) at `path` is the project's own: its package sits
    where its name says under `root`, not merely somewhere below it (a virtualenv kept in the
    checkout, `.venv/lib/.../django/contrib/admin`, is below the root too)."""
    return Path(path).resolve() == (root / Path(*name.split("."))).resolve()


def project_migrations() -> list[tuple[str, str]]:
    """(app label, migration name) of every migration of the project's own apps."""
    root = Path(settings.BASE_DIR)
    ours = {config.label for config in apps.get_app_configs()
            if is_project_app(config.name, config.path, root)}
    loader = MigrationLoader(None, ignore_no_migrations=True)  # the files only, no database
    return sorted(key for key in loader.disk_migrations if key[0] in ours)


def migration_sql(app_label: str, name: str) -> str:
    """What `manage.py sqlmigrate` prints for the migration (RunSQL verbatim)."""
    out = io.StringIO()
    call_command("sqlmigrate", app_label, name, stdout=out, verbosity=0)
    return out.getvalue()


class SquawkMissingError(RuntimeError):
    """No squawk to run: the environment's to fix (requirements/dev.txt)."""


def squawk_binary() -> str:
    """The squawk of this venv (requirements/dev.txt pins squawk-cli), else one on PATH."""
    found = shutil.which("squawk", path=str(Path(sys.executable).parent)) or shutil.which("squawk")
    if found is None:
        raise SquawkMissingError("squawk not found: pip install -r requirements/dev.txt "
                                 "(squawk-cli)")
    return found


def run_squawk(sql_by_migration: dict[str, str]) -> list[Finding]:
    """Every finding of squawk (config: .squawk.toml at the project root) over the SQL."""
    config = Path(settings.BASE_DIR) / ".squawk.toml"
    with tempfile.TemporaryDirectory(prefix="squawk-") as folder:
        paths = []
        for migration, sql in sql_by_migration.items():
            path = Path(folder) / f"{migration}.sql"
            path.write_text(sql, encoding="utf-8")
            paths.append(str(path))
        if not paths:
            return []
        result = subprocess.run(  # noqa: S603 - our own argument list, no shell
            [squawk_binary(), "--config", str(config), "--reporter", "json", *paths],
            capture_output=True, text=True, check=False)
    if result.returncode not in (0, 1) or not result.stdout.strip():
        raise RuntimeError(f"squawk failed ({result.returncode}): {result.stderr.strip()}")
    return [Finding(Path(item["file"]).name.removesuffix(".sql"), item["line"] + 1,
                    item["rule_name"], item["message"]) for item in json.loads(result.stdout)]


def load_baseline(path: Path = BASELINE) -> dict[str, dict[str, str]]:
    """{"app.name": {rule: reason}} of the migrations before the baseline."""
    with path.open("rb") as file:
        data = tomllib.load(file)
    return {f"{app}.{name}": dict(rules) for app, migrations in data.items()
            for name, rules in migrations.items()}


def unaccepted(findings: list[Finding], baseline: dict[str, dict[str, str]],
               linted: set[str]) -> tuple[list[Finding], list[str]]:
    """The findings no baseline entry accepts, and the baseline's stale entries
    ("app.name: rule" accepted there but no longer found)."""
    new = [finding for finding in findings
           if finding.rule not in baseline.get(finding.migration, {})]
    found = {(finding.migration, finding.rule) for finding in findings}
    stale = [f"{migration}: {rule}" for migration, rules in sorted(baseline.items())
             for rule in sorted(rules)
             if migration not in linted or (migration, rule) not in found]
    return new, stale


def lint_migrations() -> tuple[list[Finding], list[str], int]:
    """squawk over every project migration: (unaccepted findings, stale baseline entries, how
    many migrations were linted)."""
    sql = {f"{app}.{name}": migration_sql(app, name) for app, name in project_migrations()}
    new, stale = unaccepted(run_squawk(sql), load_baseline(), set(sql))
    return new, stale, len(sql)
