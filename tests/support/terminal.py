"""Run a `manage.py` command on a real pseudo-terminal, as an operator at a terminal sees it,
and split what it printed into the pieces a terminal draws: a carriage return or a new line
starts a new piece (a progress bar redraws itself after `\\r`)."""

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from dataclasses import dataclass

from tests.support.processes import manage_py

COLUMNS = 120
BAR = re.compile(r"^(?P<desc>[a-z ]+): +(?P<pct>\d+)%\|[^|]*\| *(?P<done>\d+)/(?P<total>\d+) ")
BAR_CHARACTERS = re.compile("%\\||[\u2588-\u258f]|\r")


@dataclass(frozen=True)
class TerminalRun:
    returncode: int
    output: str

    def pieces(self) -> list[str]:
        return [p for p in re.split(r"[\r\n]", self.output) if p.strip()]

    def bars(self, description: str) -> list[re.Match[str]]:
        return [m for p in self.pieces() if (m := BAR.match(p)) and m["desc"] == description]


def run_in_terminal(*args: str, env: dict[str, str], timeout: float = 120) -> TerminalRun:
    """Run the command with stdin, stdout and stderr on a pty; read it until it exits (or
    `timeout`, then fail)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, COLUMNS, 0, 0))
    process = subprocess.Popen([*manage_py(), *args], env=env, stdin=slave, stdout=slave,
                               stderr=slave, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([master], [], [], min(left, 1.0))
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the command exited and the terminal closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        else:
            process.kill()
            raise AssertionError(f"{args} still running after {timeout} s: "
                                 f"{b''.join(chunks)[-2000:]!r}")
        returncode = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
            process.wait()
    return TerminalRun(returncode, b"".join(chunks).decode("utf-8", errors="replace"))
