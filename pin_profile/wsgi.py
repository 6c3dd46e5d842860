"""WSGI entry point of the admin web process (gunicorn: pin_profile/gunicorn_conf.py).

A configuration error stops the process at start with one line and exit code 2, as
manage.py does; so does the development secret key when DEBUG is off.
"""

import os
import sys

from django.core.exceptions import ImproperlyConfigured
from django.core.handlers.wsgi import WSGIHandler
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pin_profile.settings")


def refuse_development_secret_key() -> None:
    """Sessions signed with the published development key could be forged by anyone."""
    from django.conf import settings

    if not settings.DEBUG and settings.SECRET_KEY == settings.DEV_SECRET_KEY:
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY: the development key is refused when DJANGO_DEBUG is off; "
            "set a random key of at least 50 characters")


def load_application() -> WSGIHandler:
    """The Django application, or exit 2 with one line naming the bad setting."""
    try:
        refuse_development_secret_key()  # the first read of the settings: a bad value raises here
        return get_wsgi_application()
    except ImproperlyConfigured as exc:
        sys.stderr.write(f"configuration error: {exc}\n")
        raise SystemExit(2) from None


application = load_application()
