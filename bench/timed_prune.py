"""Subprocess entry of the benchmark's prune phase: the worker's own chunked prune, timed
inside the process so that Django's start-up is not counted.

    DATABASE_URL=... python -m bench.timed_prune 2026-12-28
"""

import json
import os
import sys
import time
from datetime import date


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pin_profile.settings")
    import django

    django.setup()
    from reminders import rules
    from reminders.config import load_settings
    from reminders.retention import prune_expired_markers

    settings = load_settings(os.environ)
    cutoff = rules.prune_cutoff(date.fromisoformat(argv[0]), settings.retention_days)
    started = time.perf_counter()
    pruned = prune_expired_markers("default", cutoff)
    print(json.dumps({"seconds": time.perf_counter() - started, "pruned": pruned}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
