#!/usr/bin/env bash
# The tests that read the real clock (marker `real_clock`), re-run under libfaketime just
# before and just after UTC midnight and on 2028-02-29 (scripts/clock.sh). scripts/test.sh
# runs this after the whole suite; extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
source scripts/pg.sh
pg_ensure
source scripts/prometheus.sh
prometheus_ensure
source scripts/browser.sh
browser_ensure
source scripts/clock.sh

export DATABASE_URL="${TEST_DATABASE_URL:-$(database_url pin_profile)}"
clock_scenarios "$@"
