"""Subprocess entry of the benchmark's pipeline phase: the relay's command (`publish_outbox`,
one pass: everything deliverable, then exit), timed inside the process so that Django's
start-up is not counted.

    DATABASE_URL=... KAFKA_BOOTSTRAP_SERVERS=... python -m bench.timed_relay
"""

import io
import json
import os
import re
import sys
import time

_PUBLISHED = re.compile(r"^Relay pass: (\d+) published", re.MULTILINE)


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pin_profile.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.core.management.base import CommandError

    out = io.StringIO()
    error = None
    started = time.perf_counter()
    try:
        call_command("publish_outbox", stdout=out)
    except CommandError as exc:
        error = str(exc)
    seconds = time.perf_counter() - started
    published = _PUBLISHED.search(out.getvalue())
    print(json.dumps({"seconds": seconds, "published": int(published[1]) if published else 0,
                      "error": error}))
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
