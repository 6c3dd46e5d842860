#!/usr/bin/env bash
# A throwaway PostgreSQL cluster of your own, for a test run or a benchmark that must not share
# the server with another one (the stream relay waits for the oldest transaction open anywhere
# on its server: two runs on one server hold each other's relays back).
#
#   eval "$(scripts/own-pg.sh start DIR [PORT])"   # exports PG_URL; scripts/test.sh then uses it
#   scripts/own-pg.sh stop DIR
# DIR holds the data and the log; PORT defaults to a free loopback port.
set -euo pipefail
cmd=${1:?usage: own-pg.sh start|stop DIR [PORT]}
dir=${2:?usage: own-pg.sh start|stop DIR [PORT]}
bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
as=()
if [ "$(id -u)" = 0 ]; then as=(runuser -u postgres --); fi
case "$cmd" in
start)
    port=${3:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
    mkdir -p "$dir"
    chown postgres: "$dir" 2>/dev/null || true
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        "${as[@]}" "$bindir/initdb" -D "$dir/data" -U postgres -A trust >/dev/null
    fi
    "${as[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/log" -w \
        -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir -c fsync=off -c max_connections=200" \
        start >/dev/null
    echo "export PG_URL=postgres://postgres@127.0.0.1:$port/postgres"
    ;;
stop)
    "${as[@]}" "$bindir/pg_ctl" -D "$dir/data" -m fast stop >/dev/null
    ;;
*)
    echo "own-pg.sh: unknown command $cmd (start or stop)" >&2
    exit 2
    ;;
esac
