#!/usr/bin/env bash
# The demo: a fresh local database, the documents table, demo documents, one reminder cycle,
# and a summary of the events it wrote to the outbox; then a local mock Kafka cluster, one
# relay pass, and the events consumed back from the topic. Installs what it needs; stops what
# it started.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/demo_db.sh

DEMO_DB="${DEMO_DB:-pin_profile_demo}"
demo_database "$DEMO_DB"
manage() { "$PY" manage.py "$@"; }

echo "== one cycle, as the least-privilege worker role"
DATABASE_URL=$(database_url "$DEMO_DB" pin_reminder_worker) LOG_FORMAT=json LOG_LEVEL=WARNING \
    manage run_expiry_reminders
echo "== events written"
manage show_outbox --limit "${DEMO_SHOW:-8}"

# --- The relay: a local mock Kafka cluster, one relay pass, the events read back. ---
DEMO_TMP=$(mktemp -d /tmp/pin-demo.XXXXXX)
MOCK_KAFKA_PID=""
demo_cleanup() {
    if [ -n "$MOCK_KAFKA_PID" ]; then
        kill "$MOCK_KAFKA_PID" 2>/dev/null || true
        wait "$MOCK_KAFKA_PID" 2>/dev/null || true
    fi
    rm -rf "$DEMO_TMP"
    pg_throwaway_stop  # pg.sh's own exit trap, which this one replaces
}
trap demo_cleanup EXIT
echo "== a local mock Kafka cluster (librdkafka's, in memory)"
# Started directly (not through `manage`), so that $! is the cluster's own pid.
"$PY" manage.py mock_kafka --bootstrap-file "$DEMO_TMP/bootstrap" >/dev/null 2>"$DEMO_TMP/mock.log" &
MOCK_KAFKA_PID=$!
for _ in $(seq 1 100); do [ -s "$DEMO_TMP/bootstrap" ] && break; sleep 0.1; done
if [ ! -s "$DEMO_TMP/bootstrap" ]; then
    echo "demo.sh: the mock Kafka cluster did not start" >&2
    exit 1
fi
export KAFKA_BOOTSTRAP_SERVERS; KAFKA_BOOTSTRAP_SERVERS=$(cat "$DEMO_TMP/bootstrap")
echo "   bootstrap $KAFKA_BOOTSTRAP_SERVERS"
echo "== one relay pass, as the least-privilege relay role"
DATABASE_URL=$(database_url "$DEMO_DB" pin_outbox_relay) LOG_FORMAT=json LOG_LEVEL=WARNING \
    manage publish_outbox
echo "== events consumed from the topic"
manage read_outbox_topic --limit "${DEMO_SHOW:-8}"
