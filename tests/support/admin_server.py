"""The admin under its production WSGI server: gunicorn with pin_profile/gunicorn_conf.py as
a subprocess on loopback, connected as the admin's own database role, serving the static
files that collectstatic gathered (as the image does)."""

import contextlib
import json
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.roles import ADMIN_WEB_ROLE
from tests.support.processes import ROOT, command_env, manage_py

START_DEADLINE_S = 60.0
STOP_DEADLINE_S = 30.0
_LISTENING = re.compile(r"Listening at: http://127\.0\.0\.1:(\d+)")

# Every HTTPS setting on, explicitly (docs/configuration.md, "The admin web process").
PRODUCTION_TLS = {
    "DJANGO_SECURE_SSL_REDIRECT": "on",
    "DJANGO_SECURE_HSTS_SECONDS": "31536000",
    "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS": "on",
    "DJANGO_SECURE_HSTS_PRELOAD": "on",
    "DJANGO_SECURE_COOKIES": "on",
}


def production_key() -> str:
    """A fresh secret key of the kind production sets (never the development one)."""
    return secrets.token_urlsafe(50)


def admin_env(static_root: Path, **extra: str) -> dict[str, str]:
    """The admin's environment: DEBUG off, a real key, the admin role, an ops port of its own."""
    env = command_env(ADMIN_WEB_ROLE, DJANGO_DEBUG="off", DJANGO_SECRET_KEY=production_key(),
                      DJANGO_STATIC_ROOT=str(static_root), METRICS_ADDR="127.0.0.1:0")
    env.update(extra)
    return env


def collect_static(target: Path) -> None:
    """`collectstatic` into `target`, as the image's build step does."""
    done = subprocess.run(
        [*manage_py(), "collectstatic", "--noinput", "-v", "0"],
        env=command_env(ADMIN_WEB_ROLE, DJANGO_STATIC_ROOT=str(target)),
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (target / "admin" / "css" / "base.css").is_file()


def gunicorn(*args: str) -> list[str]:
    """The admin's production command line (docker/compose.yml) with extra arguments."""
    return [sys.executable, "-m", "gunicorn", "-c", "python:pin_profile.gunicorn_conf", *args]


class AdminServer:
    """A running gunicorn; `url` is the admin's public port, `ops_url` its METRICS_ADDR."""

    def __init__(self, env: dict[str, str], port: int = 0) -> None:
        self.env = env
        self.process = subprocess.Popen(
            gunicorn("--bind", f"127.0.0.1:{port}"), cwd=ROOT, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.url = f"http://127.0.0.1:{self._wait_for(self._public_port)}"
        self.ops_url = f"http://127.0.0.1:{self._wait_for(self._ops_port)}"

    def _read(self) -> None:
        assert self.process.stdout is not None
        # stop() may close the pipe under a reader still waiting on it (a server that never
        # started): the end of the output, not an error of its own
        with contextlib.suppress(ValueError):
            for line in self.process.stdout:
                with self._changed:
                    self.lines.append(line.rstrip("\n"))
                    self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def _public_port(self) -> int | None:
        return next((int(m[1]) for line in self.lines if (m := _LISTENING.search(line))), None)

    def _ops_port(self) -> int | None:
        for line in self.lines:
            event = _json(line)
            if event.get("event") == "metrics server listening":
                return int(event["port"])
        return None

    def _wait_for(self, found: Any) -> int:
        deadline = time.monotonic() + START_DEADLINE_S
        with self._changed:
            while (value := found()) is None:
                left = deadline - time.monotonic()
                if left <= 0 or (self.process.poll() is not None and not self._reader.is_alive()):
                    self.stop()
                    raise AssertionError("gunicorn did not start:\n" + "\n".join(self.lines[-30:]))
                self._changed.wait(timeout=min(left, 0.5))
        return int(value)

    def stop(self) -> int:
        """SIGTERM (a graceful stop), then the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_DEADLINE_S)
        self._reader.join(timeout=STOP_DEADLINE_S)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


def _json(line: str) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


@contextmanager
def admin_server(env: dict[str, str], port: int = 0) -> Iterator[AdminServer]:
    """gunicorn for the block; stopped (and its exit code checked) afterwards."""
    server = AdminServer(env, port)
    try:
        yield server
    finally:
        code = server.stop()
    assert code == 0, "\n".join(server.lines[-30:])


def free_port() -> int:
    """A loopback port free now (another process may take it before gunicorn binds it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def admin_server_on_a_known_port(env_for: Callable[[int], dict[str, str]],
                                 attempts: int = 3) -> Iterator[AdminServer]:
    """gunicorn on a port chosen before it starts (for settings that name the port), trying
    another port when one was taken in between."""
    for attempt in range(attempts):
        port = free_port()
        try:
            server = AdminServer(env_for(port), port)
        except AssertionError as exc:
            if "in use" in str(exc) and attempt < attempts - 1:
                continue
            raise
        break
    try:
        yield server
    finally:
        code = server.stop()
    assert code == 0, "\n".join(server.lines[-30:])


def run_gunicorn_to_exit(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """gunicorn that is expected to refuse to start: its exit code and output."""
    return subprocess.run(gunicorn("--bind", "127.0.0.1:0"), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=START_DEADLINE_S, check=False)
