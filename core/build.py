"""What this build is: the project's version, written in one place (pyproject.toml's
`[project] version`), and the commit it was built from (the image's PIN_PROFILE_REVISION,
which its REVISION build argument sets; in a git checkout, `git rev-parse HEAD`).
`manage.py --version` prints `describe()`; every ops server (core.ops_server) exports both as the
`pin_profile_reminders_build_info` gauge."""

import os
import shutil
import subprocess
import tomllib
from functools import cache
from pathlib import Path

import django
from prometheus_client import REGISTRY, CollectorRegistry, Gauge

from core.metrics import MetricSet

ROOT = Path(__file__).resolve().parents[1]
NAME = "pin-profile-reminders"
REVISION_VARIABLE = "PIN_PROFILE_REVISION"
UNKNOWN = "unknown"

BUILD_INFO = Gauge(
    f"{NAME.replace('-', '_')}_build_info",
    "The build this process runs: its version (pyproject.toml) and commit; always 1.",
    ["version", "revision"], registry=None,
)
BUILD_METRICS = MetricSet(BUILD_INFO)


@cache
def version() -> str:
    """pyproject.toml's version (the image copies the file)."""
    with (ROOT / "pyproject.toml").open("rb") as file:
        return str(tomllib.load(file)["project"]["version"])


@cache
def revision() -> str:
    """The commit: the image's baked one, else the checkout's HEAD, else `unknown`."""
    baked = os.environ.get(REVISION_VARIABLE, "").strip()
    if baked:
        return baked
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        return UNKNOWN
    done = subprocess.run([git, "-C", str(ROOT), "rev-parse", "HEAD"],  # noqa: S603 (fixed argv)
                          capture_output=True, text=True, timeout=10, check=False)
    return done.stdout.strip() if done.returncode == 0 else UNKNOWN


def describe() -> str:
    """One line: `pin-profile-reminders 0.2.0 (commit 0123abc..., Django 5.2.19)`."""
    return f"{NAME} {version()} (commit {revision()}, Django {django.get_version()})"


def install_build_info(registry: CollectorRegistry = REGISTRY) -> None:
    """The build_info gauge, set, in `registry` (again: nothing)."""
    BUILD_INFO.labels(version=version(), revision=revision()).set(1)
    BUILD_METRICS.install(registry)
