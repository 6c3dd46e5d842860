"""The locks against their sources: requirements/base.txt and dev.txt are generated from base.in
and dev.in by scripts/lock.sh (pip-compile --generate-hashes). A lock is stale when a direct
requirement was added, removed or re-bounded in its .in without re-running the script; this
catches each of those from the lock's own annotations (`# via -r requirements/base.in`), in
milliseconds and offline, without re-running the resolver."""

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.locks import Locked, lock_entries

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "requirements"
LOCK_COMMAND = "scripts/lock.sh"


def source_requirements(path: Path) -> tuple[dict[str, Requirement], list[Path]]:
    """A .in file's direct requirements by canonical name, and the .in files it includes (-r)."""
    direct: dict[str, Requirement] = {}
    included: list[Path] = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-c "):
            continue
        if line.startswith("-r "):
            included.append(path.parent / line.removeprefix("-r ").strip())
            continue
        requirement = Requirement(line)
        direct[canonicalize_name(requirement.name)] = requirement
    return direct, included


def all_requirements(path: Path) -> dict[str, Requirement]:
    """A .in file's direct requirements with those of the .in files it includes."""
    direct, included = source_requirements(path)
    for other in included:
        direct |= all_requirements(other)
    return direct


def stale(source: Path) -> list[str]:
    """Why the lock of `source` (X.in -> X.txt) no longer matches it; empty when it does."""
    lock = source.with_suffix(".txt")
    entries = lock_entries(lock)
    wanted = all_requirements(source)
    problems = []
    if LOCK_COMMAND not in lock.read_text().split("\n\n", 1)[0]:
        problems.append(f"{lock.name}: its header does not name {LOCK_COMMAND}")
    problems += unmet(source, lock, wanted, entries)
    from_sources = {name for name, entry in entries.items()
                    if any(v.startswith("-r requirements/") and v.endswith(".in") for v in entry.via)}
    for name in sorted(from_sources - set(wanted)):
        problems.append(f"{name}: {lock.name} has it from a .in that no longer asks for it")
    return problems + unexplained(lock, entries)


def unmet(source: Path, lock: Path, wanted: dict[str, Requirement],
          entries: dict[str, Locked]) -> list[str]:
    """What `source` asks for that `lock` does not pin as asked."""
    problems = []
    for name, requirement in sorted(wanted.items()):
        locked = entries.get(name)
        if locked is None:
            problems.append(f"{name}: in {source.name} (or what it includes), not in {lock.name}")
        elif not requirement.specifier.contains(Version(locked.version), prereleases=True):
            problems.append(f"{name}: {lock.name} pins {locked.version}, {source.name} asks "
                            f"{requirement.specifier}")
        for extra in requirement.extras:  # --strip-extras: psycopg[binary] is psycopg-binary
            if canonicalize_name(f"{name}-{extra}") not in entries:
                problems.append(f"{name}[{extra}]: {name}-{extra} is not in {lock.name}")
    return problems


def unexplained(lock: Path, entries: dict[str, Locked]) -> list[str]:
    """Entries of `lock` without a hash, or without (or with a missing) reason to be there."""
    problems = []
    for name, entry in sorted(entries.items()):
        if entry.hashes == 0:
            problems.append(f"{name}: no hash in {lock.name}")
        if not entry.via:
            problems.append(f"{name}: {lock.name} says nothing needs it")
        for parent in entry.via:
            if not parent.startswith("-") and canonicalize_name(parent) not in entries:
                problems.append(f"{name}: needed by {parent}, which is not in {lock.name}")
    return problems


SOURCES = sorted(REQUIREMENTS.glob("*.in"))


def test_every_requirements_file_has_a_source() -> None:
    assert [p.name for p in SOURCES] == ["base.in", "dev.in", "uv.in"]
    assert sorted(p.name for p in REQUIREMENTS.glob("*.txt")) == ["base.txt", "dev.txt", "uv.txt"]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_the_lock_matches_its_source(source: Path) -> None:
    assert stale(source) == [], f"run {LOCK_COMMAND} (README.md, \"Dependencies\")"


def test_the_development_lock_pins_production_packages_as_production_does() -> None:
    production = lock_entries(REQUIREMENTS / "base.txt")
    development = lock_entries(REQUIREMENTS / "dev.txt")
    assert {n: e.version for n, e in development.items() if n in production} == {
        n: e.version for n, e in production.items()}


def test_a_changed_source_makes_its_lock_stale(tmp_path: Path) -> None:
    """The check itself: an added, a removed and a re-bounded requirement are each caught."""
    for name in ("base.in", "base.txt"):
        (tmp_path / name).write_text((REQUIREMENTS / name).read_text())
    source = tmp_path / "base.in"
    original = source.read_text()
    assert stale(source) == []
    source.write_text(original + "attrs\n")
    assert stale(source) == ["attrs: in base.in (or what it includes), not in base.txt"]
    source.write_text(original.replace("\ntqdm\n", "\n"))
    assert stale(source) == ["tqdm: base.txt has it from a .in that no longer asks for it"]
    source.write_text(original.replace("Django>=5.2,<5.3", "Django>=6"))
    assert stale(source) == ["django: base.txt pins 5.2.19, base.in asks >=6"]
