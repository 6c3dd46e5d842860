# Sourced by the scripts: make sure a PostgreSQL server answers, and export its URL.
#
# If PG_URL (default postgres://postgres@127.0.0.1:5432/postgres) answers, use it.
# Otherwise start a throwaway cluster from Debian's postgresql binaries (installing them if
# missing) on a free loopback port, and stop it when the calling script exits.
# Exports PG_ADMIN_URL (a superuser URL to the `postgres` database) and PG_HOSTPORT.

source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

PG_URL="${PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}"

_pg_answers() {
    psql "$1" -Atqc 'select 1' >/dev/null 2>&1
}

_pg_install() {
    if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || ! command -v psql >/dev/null; then
        echo "pg.sh: installing Debian's postgresql packages" >&2
        apt_install postgresql postgresql-client
    fi
}

_pg_try_service() {
    # This machine's service command; harmless where there is none.
    if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
        for v in $(ls /etc/postgresql); do
            pg_ctlcluster --skip-systemctl-redirect "$v" main start >/dev/null 2>&1 || true
        done
    fi
}

_pg_throwaway() {
    local bindir port dir
    bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    dir=$(mktemp -d /tmp/pin-pg.XXXXXX)
    chown postgres: "$dir" 2>/dev/null || true
    local as=()
    if [ "$(id -u)" = 0 ]; then as=(runuser -u postgres --); fi
    "${as[@]}" "$bindir/initdb" -D "$dir/data" -U postgres -A trust >/dev/null
    "${as[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/log" -w \
        -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir -c fsync=off" start >/dev/null
    PG_THROWAWAY_DIR="$dir"
    PG_THROWAWAY_STOP=("${as[@]}" "$bindir/pg_ctl" -D "$dir/data" -m fast stop)
    trap 'pg_throwaway_stop' EXIT
    PG_URL="postgres://postgres@127.0.0.1:$port/postgres"
    echo "pg.sh: started a throwaway PostgreSQL on 127.0.0.1:$port ($dir)" >&2
}

pg_throwaway_stop() {
    if [ -n "${PG_THROWAWAY_DIR:-}" ]; then
        "${PG_THROWAWAY_STOP[@]}" >/dev/null 2>&1 || true
        rm -rf "$PG_THROWAWAY_DIR"
        PG_THROWAWAY_DIR=""
    fi
}

pg_ensure() {
    _pg_install
    if ! _pg_answers "$PG_URL"; then
        _pg_try_service
        for _ in $(seq 1 20); do _pg_answers "$PG_URL" && break; sleep 0.5; done
    fi
    if ! _pg_answers "$PG_URL"; then
        echo "pg.sh: nothing answers at $PG_URL; starting a throwaway cluster" >&2
        _pg_throwaway
    fi
    PG_ADMIN_URL="$PG_URL"
    PG_HOSTPORT=$(python3 -c 'import sys,urllib.parse as u; p=u.urlsplit(sys.argv[1]); print(f"{p.hostname}:{p.port or 5432}")' "$PG_URL")
    export PG_ADMIN_URL PG_HOSTPORT
}

# database_url NAME [ROLE]: a URL to database NAME on the same server, as ROLE (default postgres)
database_url() {
    echo "postgres://${2:-postgres}@$PG_HOSTPORT/$1"
}
