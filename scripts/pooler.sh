# Sourced by scripts/test-env.sh: Debian's pgbouncer, for the connection-pooler tests
# (tests/acceptance/test_poolers.py), installed when missing.

pgbouncer_ensure() {
    if command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ]; then
        return 0
    fi
    echo "pooler.sh: installing Debian's pgbouncer" >&2
    export DEBIAN_FRONTEND=noninteractive
    local sudo=()
    if [ "$(id -u)" != 0 ]; then sudo=(sudo); fi
    if ! "${sudo[@]}" apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null 2>&1; then
        "${sudo[@]}" apt-get update -qq >/dev/null
        "${sudo[@]}" apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null
    fi
    # The package's own service is not wanted: the tests start their own on a free port.
    if command -v systemctl >/dev/null; then "${sudo[@]}" systemctl disable --now pgbouncer >/dev/null 2>&1 || true; fi
}
