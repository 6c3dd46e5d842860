"""`manage.py --version` says what runs: pyproject.toml's version and the commit (the image's
PIN_PROFILE_REVISION, else the checkout's HEAD), core/build.py."""

import os
import subprocess
import tomllib

from tests.support.processes import ROOT, manage_py


def version_line(**env: str) -> str:
    done = subprocess.run([*manage_py(), "--version"], capture_output=True, text=True, timeout=60,
                          check=True, env={**os.environ, "PIN_PROFILE_REVISION": "", **env})
    return done.stdout


def test_version_prints_the_projects_version_and_the_checkouts_commit() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True, timeout=10, check=True).stdout.strip()
    assert version_line().startswith(f"pin-profile-reminders {version} (commit {head}, Django 5.2.")


def test_an_image_reports_the_commit_it_was_built_from() -> None:
    assert " (commit 0123abcd, Django " in version_line(PIN_PROFILE_REVISION="0123abcd")
