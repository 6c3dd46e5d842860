#!/usr/bin/env bash
# The observability demo: a fresh local database with demo documents, the worker's --loop with
# its metrics server, one cycle, then what Prometheus would scrape and the health endpoints.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
source scripts/pg.sh
pg_ensure

DEMO_DB="${DEMO_DB:-pin_profile_metrics_demo}"
psql "$PG_ADMIN_URL" -qc "drop database if exists $DEMO_DB with (force)" >/dev/null
psql "$PG_ADMIN_URL" -qc "create database $DEMO_DB" >/dev/null
export DATABASE_URL; DATABASE_URL=$(database_url "$DEMO_DB")
# The demo needs the dev tools (mock Kafka, demo data, the documents table): dev settings.
export DJANGO_SETTINGS_MODULE=pin_profile.settings_dev
"$PY" manage.py migrate -v 0
"$PY" manage.py create_dev_person_documents >/dev/null
"$PY" manage.py apply_db_roles >/dev/null
"$PY" manage.py seed_demo_documents --owners "${DEMO_OWNERS:-300}"

log=$(mktemp)
DATABASE_URL=$(database_url "$DEMO_DB" pin_reminder_worker) METRICS_ADDR=127.0.0.1:0 \
    LOG_FORMAT=json LOG_LEVEL=INFO "$PY" manage.py run_expiry_reminders --loop 2>"$log" &
worker=$!
trap 'kill -TERM $worker 2>/dev/null || true; wait $worker 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 600); do  # up to 60 s for the first cycle
    grep -q '"event":"cycle completed"' "$log" && break
    kill -0 $worker 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.1
done
grep -q '"event":"cycle completed"' "$log" || { echo "no cycle within 60 s" >&2; exit 1; }
port=$(grep '"event":"metrics server listening"' "$log" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["port"])')

echo "== GET /metrics (profile_* series)"
curl -fsS "http://127.0.0.1:$port/metrics" | grep '^profile_' | grep -v '_bucket{'
echo "== GET /healthz";  curl -sS "http://127.0.0.1:$port/healthz"
echo "== GET /readyz";   curl -sS "http://127.0.0.1:$port/readyz"
