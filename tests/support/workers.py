"""A PostgreSQL cluster of its own for each pytest process that runs tests in parallel.

Under pytest-xdist (`scripts/test.sh` runs `-n 2`), the controller makes one template data
directory (initdb -N, no fsync) and every worker starts a copy of it on a port of its own
(tests/conftest.py's django_db_modify_db_settings, before pytest-django creates the test
database), then points the settings, DATABASE_URL, PG_ADMIN_URL and PG_HOSTPORT at it. A shared
server is not enough: the stream relay waits for the oldest transaction open anywhere on its
server, roles are cluster-wide, and OIDs repeat across template-cloned databases.
TEST_OWN_CLUSTER=1 gives a run without xdist a cluster of its own too (the faked-clock runs
of scripts/clock.sh run side by side that way). Without either, the tests use DATABASE_URL.

Any test file, old or new, gets its worker's cluster: nothing is chosen per test."""

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.support.pg_binaries import as_postgres, bindir

OWN_CLUSTER = "TEST_OWN_CLUSTER"
TEMPLATE = "TEST_CLUSTER_TEMPLATE"
# A throwaway cluster: nothing is worth a disk flush.
SETTINGS = ("-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            "-c max_connections=200")


def _run(tool: str, *args: str) -> None:
    subprocess.run([*as_postgres(), str(bindir() / tool), *args], check=True,
                   capture_output=True, text=True, timeout=300)


def _own_dir(prefix: str) -> Path:
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres")
    return directory


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_template() -> Path:
    """One initialised data directory for the workers to copy (initdb -N: nothing is fsynced)."""
    directory = _own_dir("pin-template-")
    _run("initdb", "-N", "-D", str(directory / "data"), "-U", "postgres", "-A", "trust")
    atexit.register(shutil.rmtree, directory, True)
    return directory / "data"


def start_own_cluster(template: Path | None) -> str:
    """A copy of `template` (or a new initdb), started on a free loopback port and stopped
    when this process exits; its `postgres` database's URL."""
    directory = _own_dir("pin-worker-")
    data = directory / "data"
    if template is not None:
        subprocess.run([*as_postgres(), "cp", "-a", str(template), str(data)], check=True,
                       timeout=300)
    else:
        _run("initdb", "-N", "-D", str(data), "-U", "postgres", "-A", "trust")
    port = _free_port()
    _run("pg_ctl", "-D", str(data), "-l", str(directory / "log"), "-w", "-o",
         f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={directory} "
         f"{SETTINGS}", "start")

    def remove() -> None:
        subprocess.run([*as_postgres(), str(bindir() / "pg_ctl"), "-D", str(data), "-m",
                        "immediate", "-w", "stop"], capture_output=True, check=False, timeout=120)
        shutil.rmtree(directory, ignore_errors=True)

    atexit.register(remove)
    return f"postgres://postgres@127.0.0.1:{port}/postgres"


def _point_at(admin_url: str) -> None:
    """The tests' database settings (and DATABASE_URL, PG_ADMIN_URL, PG_HOSTPORT for what
    they start) on the cluster at `admin_url`, before pytest-django creates the test database."""
    from django.conf import settings

    cluster = urlsplit(admin_url)
    database = settings.DATABASES["default"]
    database["HOST"], database["PORT"] = cluster.hostname, cluster.port
    before = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@x/pin_profile"))
    netloc = f"{before.username or 'postgres'}@{cluster.hostname}:{cluster.port}"
    os.environ["DATABASE_URL"] = urlunsplit(before._replace(netloc=netloc))
    os.environ["PG_ADMIN_URL"] = admin_url
    os.environ["PG_HOSTPORT"] = f"{cluster.hostname}:{cluster.port}"


def starts_workers(config: pytest.Config) -> bool:
    """Whether this process is an xdist controller that will start workers."""
    numprocesses = getattr(config.option, "numprocesses", None)
    return bool(numprocesses) and not os.environ.get("PYTEST_XDIST_WORKER")


def configure(config: pytest.Config) -> None:
    """In tests/conftest.py's pytest_configure: the controller makes the workers' template."""
    if starts_workers(config):
        os.environ[TEMPLATE] = str(make_template())
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_WorkerReports(), "worker-reports")


def use_own_cluster() -> None:
    """In the session's django_db_modify_db_settings: an xdist worker, or a run with
    TEST_OWN_CLUSTER=1, moves the tests to a cluster of its own."""
    if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(TEMPLATE):
        _point_at(start_own_cluster(Path(os.environ[TEMPLATE])))
    elif os.environ.get(OWN_CLUSTER) == "1":
        _point_at(start_own_cluster(None))


class _WorkerReports:
    """What a worker's session collected for the summary (the chaos report) reaches the
    controller, which prints it (tests/conftest.py's pytest_terminal_summary)."""

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        from tests.support import chaos_report

        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput["chaos_lines"] = chaos_report.lines()

    @pytest.hookimpl
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        from tests.support import chaos_report

        chaos_report.LINES.extend(getattr(node, "workeroutput", {}).get("chaos_lines", []))
