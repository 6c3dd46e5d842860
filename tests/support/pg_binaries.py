"""Debian's PostgreSQL binaries, for the throwaway clusters of the tests (tests.support.clusters,
tests.support.workers): where they are, and as whom they run."""

import os
from pathlib import Path


def bindir() -> Path:
    """The newest installed PostgreSQL's binaries."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parent.parent.name))
    if not found:
        raise RuntimeError("no PostgreSQL binaries under /usr/lib/postgresql (apt postgresql)")
    return found[-1].parent


def as_postgres() -> list[str]:
    """The prefix that runs a server binary as `postgres` (initdb refuses root)."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
