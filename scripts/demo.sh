#!/usr/bin/env bash
# The demo: a fresh local database, the documents table, demo documents, one reminder cycle,
# and a summary of the events it wrote to the outbox. Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
source scripts/pg.sh
pg_ensure

DEMO_DB="${DEMO_DB:-pin_profile_demo}"
psql "$PG_ADMIN_URL" -qc "drop database if exists $DEMO_DB with (force)" >/dev/null
psql "$PG_ADMIN_URL" -qc "create database $DEMO_DB" >/dev/null
export DATABASE_URL; DATABASE_URL=$(database_url "$DEMO_DB")
manage() { "$PY" manage.py "$@"; }

echo "== migrate"
manage migrate -v 0
manage create_dev_person_documents
manage apply_db_roles
echo "== seed"
manage seed_demo_documents --owners "${DEMO_OWNERS:-300}"
echo "== one cycle, as the least-privilege worker role"
DATABASE_URL=$(database_url "$DEMO_DB" pin_reminder_worker) LOG_FORMAT=json LOG_LEVEL=WARNING \
    manage run_expiry_reminders
echo "== events written"
manage show_outbox --limit "${DEMO_SHOW:-8}"
