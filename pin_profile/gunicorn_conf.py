"""gunicorn's settings for the admin web process (docker/compose.yml, the tests):

    gunicorn -c python:pin_profile.gunicorn_conf --bind 0.0.0.0:8000

One worker process with threads, so that its request metrics live in one registry; the
application loads in the master (preload), so a configuration error stops gunicorn itself
with one line and exit code 2 instead of a worker restarting forever. The worker serves
`/metrics`, `/healthz` and `/readyz` on METRICS_ADDR, a port of its own that the admin's
public port never answers for.
"""

import os
import sys
from typing import Any

wsgi_app = "pin_profile.wsgi:application"
workers = 1
worker_class = "gthread"
threads = 4
preload_app = True
# gunicorn's control socket would live in $HOME, which the image's user has none of.
control_socket_disable = True


def on_starting(server: Any) -> None:
    """A bad METRICS_ADDR stops gunicorn before it listens, as it stops the worker."""
    from core.config import ConfigError
    from core.ops_server import parse_listen_addr

    raw = os.environ.get("METRICS_ADDR", "").strip()
    try:
        if raw:
            parse_listen_addr("METRICS_ADDR", raw)
    except ConfigError as exc:
        sys.stderr.write(f"configuration error: {exc}\n")
        raise SystemExit(2) from None


def post_worker_init(worker: Any) -> None:
    """The ops server, on the worker's own threads beside the requests it counts (and the
    re-queues the admin's action makes)."""
    from core.health import Verdict, database_ready
    from core.ops_server import Probes, ops_server_from_env
    from outbox.metrics import install_requeue_metrics

    install_requeue_metrics()
    server = ops_server_from_env(os.environ, Probes(
        liveness=lambda: Verdict(True, "ok: the admin's worker answers"),
        readiness=database_ready,
    ))
    if server is not None:
        server.start()
