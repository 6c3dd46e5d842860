"""manage.py apply_db_roles: create the least-privilege roles and their grants."""

from typing import Any

from core.commands import ProjectCommand
from core.db import apply_sql_file
from core.exit_codes import ExitCode
from core.roles import ADMIN_WEB_ROLE, AUDITOR_ROLE, RELAY_ROLE, ROLES_SQL, WORKER_ROLE


class Command(ProjectCommand):
    help = (
        f"Create the roles {WORKER_ROLE}, {RELAY_ROLE}, {ADMIN_WEB_ROLE} and {AUDITOR_ROLE} (if "
        "missing) and "
        "grant them exactly what they need (core/sql/roles.sql). Run as an owner of the "
        "schema, after migrate and after person_documents exists. Idempotent; sets no passwords."
    )
    exit_notes = {ExitCode.REFUSED: "a table missing (migrate first; person_documents) or "
                  "the connection's role may not grant"}

    def handle(self, *args: Any, **options: Any) -> None:
        apply_sql_file(ROLES_SQL)
        self.stdout.write(f"roles {WORKER_ROLE}, {RELAY_ROLE}, {ADMIN_WEB_ROLE} and {AUDITOR_ROLE} "
                          "granted")
