"""The locks, requirements/base.txt and dev.txt (pip-compile's format, scripts/lock.sh), read:
each package's pinned version, its hashes and what needs it (its `# via` lines)."""

import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION_LOCK = ROOT / "requirements" / "base.txt"
DEVELOPMENT_LOCK = ROOT / "requirements" / "dev.txt"


@dataclass
class Locked:
    version: str
    hashes: int = 0
    via: set[str] = field(default_factory=set)


_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def lock_entries(path: Path) -> dict[str, Locked]:
    """A pip-compile lock: each package's pinned version, how many hashes, and its `via` lines."""
    entries: dict[str, Locked] = {}
    current: Locked | None = None
    in_via = False
    for line in path.read_text().splitlines():
        entry = _ENTRY.match(line)
        if entry:
            current = entries[canonicalize_name(entry[1])] = Locked(entry[2])
            in_via = False
        elif current is None:
            continue
        elif line.strip().startswith("--hash=sha256:"):
            current.hashes += 1
        elif line.strip() == "# via":
            in_via = True
        elif line.strip().startswith("# via "):
            current.via.add(line.strip().removeprefix("# via ").strip())
        elif in_via and line.strip().startswith("#   "):
            current.via.add(line.strip().removeprefix("#   ").strip())
        elif not line.strip():
            current, in_via = None, False
    return entries


def pins(path: Path) -> set[tuple[str, str]]:
    """(canonical name, version) of every package the lock pins."""
    return {(name, entry.version) for name, entry in lock_entries(path).items()}
