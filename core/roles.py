"""The least-privilege database roles (docs/design.md §6): one for the reminder
worker, one for the outbox relay, created and granted by `core/sql/roles.sql`."""

from pathlib import Path

ROLES_SQL = Path(__file__).parent / "sql" / "roles.sql"
WORKER_ROLE = "pin_reminder_worker"
RELAY_ROLE = "pin_outbox_relay"
ADMIN_WEB_ROLE = "pin_admin_web"
AUDITOR_ROLE = "pin_reminder_auditor"
