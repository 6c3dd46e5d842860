# Sourced by scripts/test.sh and scripts/test-clock.sh: the tests marked `real_clock` re-run
# with a faked clock (Debian's libfaketime, installed when missing), so that the suite is
# shown to pass on any day and at any hour, not only on the day it was written.
#
# Each scenario is one pytest run of `-m real_clock`; tests/conftest.py moves the clock of the
# test process, and of every process it starts, to TEST_CLOCK_AT at the start of each test:
#   23:59:58    the latest UTC 23:59:58 (the test crosses midnight)
#   00:00:02    the latest UTC 00:00:02 (just after midnight)
#   2028-02-29T23:59:58Z   a leap day, crossing into March
# PostgreSQL's now() is not faked: the database keeps the real clock (see tests/conftest.py).
source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

CLOCK_SCENARIOS=("23:59:58" "00:00:02" "2028-02-29T23:59:58Z")

faketime_ensure() {
    if ! ls /usr/lib/*/faketime/libfaketimeMT.so.1 >/dev/null 2>&1; then
        echo "clock.sh: installing Debian's faketime (libfaketime)" >&2
        apt_install faketime
    fi
    FAKETIME_LIB=$(ls /usr/lib/*/faketime/libfaketimeMT.so.1 | head -n 1)
}

# clock_scenarios [pytest args]: every scenario at the same time, each a pytest run on a
# PostgreSQL cluster of its own (TEST_OWN_CLUSTER, tests/support/workers.py), its output
# printed in turn when all are done; fails if any fails.
clock_scenarios() {
    faketime_ensure
    local at i status failed=0 pids=() logs=()
    mkdir -p "$ROOT/artifacts"
    for i in "${!CLOCK_SCENARIOS[@]}"; do
        logs+=("$(mktemp /tmp/pin-clock-$i.XXXXXX)")
        clock_scenario "$i" "$@" >"${logs[$i]}" 2>&1 &
        pids+=($!)
    done
    for i in "${!CLOCK_SCENARIOS[@]}"; do
        at=${CLOCK_SCENARIOS[$i]}
        set +e
        wait "${pids[$i]}"
        status=$?
        set -e
        echo "== pytest -m real_clock, the clock at $at (UTC)"
        cat "${logs[$i]}"
        rm -f "${logs[$i]}"
        if [ "$status" -eq 5 ]; then
            echo "clock.sh: no test is marked real_clock: that is a failure" >&2
            failed=1
        elif [ "$status" -ne 0 ]; then
            echo "clock.sh: the real_clock tests failed with the clock at $at" >&2
            failed=$status
        fi
    done
    return "$failed"
}

# clock_scenario INDEX [pytest args]: one scenario's pytest run; its exit status.
clock_scenario() {
    local index=$1 at=${CLOCK_SCENARIOS[$1]} basetemp status=0
    shift
    # A temporary root of its own: the scenarios run at once, each under another faked clock,
    # and pytest's shared numbered directories would be cleaned by one run (their locks look
    # stale to a clock years ahead) while another scans them (a leaked scandir iterator, an
    # error at the end of a run whose tests all passed).
    basetemp=$(mktemp -d "/tmp/pin-clock-tmp-$index.XXXXXX")
    # FAKETIME holds a relative offset in seconds, re-read on every call (NO_CACHE) so
    # that the fixture can move it. Only Python processes (pytest, the worker) are faked:
    # chromium does not start under libfaketime. Monotonic clocks stay real for deadlines;
    # the shim's sitecustomize works around libfaketime's failing time.sleep, and without
    # FORCE_MONOTONIC_FIX=0 its timed waits starve Python's thread switches.
    LD_PRELOAD="$FAKETIME_LIB${LD_PRELOAD:+:$LD_PRELOAD}" FAKETIME="+0" FAKETIME_NO_CACHE=1 \
        FAKETIME_ONLY_CMDS=python,python3,python3.11 FAKETIME_DONT_FAKE_MONOTONIC=1 \
        FAKETIME_FORCE_MONOTONIC_FIX=0 TEST_CLOCK_AT="$at" TEST_OWN_CLUSTER=1 \
        PYTHONPATH="$ROOT/tests/faketime_shim${PYTHONPATH:+:$PYTHONPATH}" \
        "$VENV/bin/pytest" -m real_clock -p no:cacheprovider -p no:xdist \
        --junitxml="$ROOT/artifacts/junit-clock-$index.xml" --basetemp="$basetemp" "$@" \
        || status=$?
    rm -rf "$basetemp"
    return "$status"
}
