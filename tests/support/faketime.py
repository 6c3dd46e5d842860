"""A Python subprocess whose clock is set off the real one (Debian's libfaketime, as in
scripts/clock.sh), while PostgreSQL keeps the real clock: a worker whose clock is wrong; and
the instant the faked-clock runs set the tests' clock to (`clock_target`)."""

import os
from datetime import UTC, datetime, time, timedelta
from glob import glob
from pathlib import Path

SHIM = Path(__file__).resolve().parent.parent / "faketime_shim"


def skewed_env(env: dict[str, str], skew: timedelta) -> dict[str, str]:
    """`env` for a Python subprocess whose clock reads `skew` ahead of the real clock (behind
    when negative). Monotonic clocks stay real, as under scripts/clock.sh."""
    libraries = sorted(glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    assert libraries, "libfaketime is missing: scripts/test.sh installs Debian's faketime package"
    preload = env.get("LD_PRELOAD", "")
    # A process already under the clock scenarios (FAKETIME set): shift from its offset.
    base = float(env.get("FAKETIME", "+0")) if "faketime" in preload else 0.0
    return {
        **env,
        "LD_PRELOAD": preload if "faketime" in preload else f"{libraries[0]}:{preload}".rstrip(":"),
        "FAKETIME": f"{base + skew.total_seconds():+.0f}",
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_ONLY_CMDS": "python,python3,python3.11",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_FORCE_MONOTONIC_FIX": "0",
        "PYTHONPATH": os.pathsep.join(p for p in (str(SHIM), env.get("PYTHONPATH", "")) if p),
    }


# --- the clock under test (tests/conftest.py's _clock_at, scripts/test-clock.sh) ----------

CLOCK_AT = "TEST_CLOCK_AT"


def clock_target(spec: str, real_now: datetime) -> datetime:
    """TEST_CLOCK_AT's instant: an ISO instant in UTC, or a UTC time of day meaning its latest
    occurrence at or before `real_now`."""
    if len(spec) <= len("HH:MM:SS.ffffff") and "T" not in spec:
        at = datetime.combine(real_now.date(), time.fromisoformat(spec), tzinfo=UTC)
        return at if at <= real_now else at - timedelta(days=1)
    instant = datetime.fromisoformat(spec)
    if instant.tzinfo is None:
        raise ValueError(f"{CLOCK_AT}={spec!r}: give the instant in UTC (a Z suffix)")
    return instant.astimezone(UTC)
