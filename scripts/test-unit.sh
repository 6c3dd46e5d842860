#!/usr/bin/env bash
# The one-minute inner loop: the pure tests (tests/unit; the cycle runs over
# tests/support/memory_ledger.py) with no database, broker or browser set up, then ruff on the
# whole tree. Extra arguments go to pytest, e.g. scripts/test-unit.sh -k rules. The whole
# suite and every check stay scripts/test.sh (and CI).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
# No server is asked for: a test here that touched the database would fail to connect.
export DATABASE_URL="postgres://nobody@127.0.0.1:1/no_database_in_unit_tests"
set +e
"$VENV/bin/pytest" tests/unit -p no:cacheprovider -q --junitxml=artifacts/junit-unit.xml \
    --durations=10 "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "test-unit.sh: pytest collected no tests: that is a failure" >&2
    exit 1
fi
if [ "$status" -ne 0 ]; then
    exit "$status"
fi
echo "== ruff"
"$VENV/bin/ruff" check .
