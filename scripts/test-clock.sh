#!/usr/bin/env bash
# The tests that read the real clock (marker `real_clock`), re-run under libfaketime just
# before and just after UTC midnight and on 2028-02-29 (scripts/clock.sh). scripts/test.sh
# runs this after the whole suite; extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/test-env.sh
clock_scenarios "$@"
