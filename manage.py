#!/usr/bin/env python3
"""Django's command-line utility for the pin_profile project."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pin_profile.settings")
    if sys.argv[1:] in (["--version"], ["version"]):
        # This project's version and commit, where Django would print its own version.
        from core.build import describe

        sys.stdout.write(describe() + "\n")
        return
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # Bad settings (a malformed DATABASE_URL, say) are a configuration error: one line, exit 2.
        sys.stderr.write(f"configuration error: {exc}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
