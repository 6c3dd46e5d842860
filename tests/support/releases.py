"""The previous release as its own install: its tree from git (by tag, else by the commit
docs/releases.toml records) and a Python that runs it (this venv when it has every package the
release pins at the release's version, else a venv of its own, cached by those requirements)."""

import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RELEASES = ROOT / "docs" / "releases.toml"
REQUIREMENTS = "requirements/base.txt"
VENV_CACHE = Path(os.environ.get("RELEASE_VENV_CACHE", Path.home() / ".cache" / "pin-profile-releases"))


class ReleaseNotFoundError(RuntimeError):
    """Neither the release's tag nor its recorded commit is in this clone."""


@dataclass(frozen=True)
class Release:
    version: str
    commit: str
    resolved_by: str  # "tag v0.1.0" or "recorded commit"


@dataclass(frozen=True)
class Install:
    release: Release
    tree: Path
    python: str
    own_venv: bool

    def manage_py(self) -> list[str]:
        return [self.python, str(self.tree / "manage.py")]


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=False)


def _commit_of(ref: str) -> str | None:
    found = _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    return found.stdout.decode().strip() if found.returncode == 0 else None


def previous_release() -> Release:
    """The release docs/releases.toml names as `previous`, by its tag, else its recorded commit."""
    recorded = tomllib.loads(RELEASES.read_text())
    version = recorded["previous"]
    entry = recorded["releases"][version]
    by_tag = _commit_of(f"refs/tags/{entry['tag']}")
    if by_tag is not None:
        if by_tag != entry["commit"]:
            raise ReleaseNotFoundError(f"tag {entry['tag']} is {by_tag}, but {RELEASES.name} records "
                                  f"{entry['commit']}: fix one of them")
        return Release(version, by_tag, f"tag {entry['tag']}")
    by_commit = _commit_of(entry["commit"])
    if by_commit is None:
        raise ReleaseNotFoundError(
            f"release {version}: neither tag {entry['tag']} nor commit {entry['commit']} is in "
            f"this clone (a shallow clone? fetch with full history: git fetch --unshallow --tags)")
    return Release(version, by_commit, "recorded commit")


def _requirements_at(commit: str) -> bytes:
    shown = _git("show", f"{commit}:{REQUIREMENTS}")
    if shown.returncode != 0:
        raise ReleaseNotFoundError(f"{commit} has no {REQUIREMENTS}: {shown.stderr.decode().strip()}")
    return shown.stdout


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)", re.MULTILINE)


def pins(requirements: bytes) -> set[tuple[str, str]]:
    """The (normalised name, version) pairs a requirements file pins, hashes and extras aside."""
    return {(re.sub(r"[-_.]+", "-", name).lower(), version)
            for name, version in _PIN.findall(requirements.decode())}


def _own_venv(requirements: bytes) -> str:
    """A venv with exactly `requirements`, made once per distinct file and kept."""
    venv = VENV_CACHE / hashlib.sha256(requirements).hexdigest()[:16]
    python = venv / "bin" / "python"
    if (venv / "ready").exists():
        return str(python)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    (venv / "requirements.txt").write_bytes(requirements)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-r",
                    str(venv / "requirements.txt")], check=True)
    (venv / "ready").touch()
    return str(python)


def install(release: Release, into: Path) -> Install:
    """The release's tree extracted into `into` (git archive: nothing to unregister later)."""
    archive = _git("archive", "--format=tar", release.commit)
    if archive.returncode != 0:
        raise ReleaseNotFoundError(f"git archive {release.commit}: {archive.stderr.decode().strip()}")
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    # The release's pins all installed here at its versions: this venv runs it as it is.
    same = pins(_requirements_at(release.commit)) <= pins((ROOT / REQUIREMENTS).read_bytes())
    python = sys.executable if same else _own_venv(_requirements_at(release.commit))
    return Install(release, into, python, own_venv=not same)
