#!/usr/bin/env bash
# The observability demo: a fresh local database with demo documents, the worker's --loop with
# its metrics server, one cycle, then what Prometheus would scrape and the health endpoints.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/demo_db.sh

DEMO_DB="${DEMO_DB:-pin_profile_metrics_demo}"
demo_database "$DEMO_DB"

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
