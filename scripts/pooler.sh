# Sourced by scripts/test-env.sh: Debian's pgbouncer, for the connection-pooler tests
# (tests/acceptance/test_poolers.py), installed when missing.
source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

pgbouncer_ensure() {
    if command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ]; then
        return 0
    fi
    echo "pooler.sh: installing Debian's pgbouncer" >&2
    apt_install pgbouncer  # the package's own service may run: the tests use a free port
}
