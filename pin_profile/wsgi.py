"""WSGI entry point of the admin web process."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pin_profile.settings")

application = get_wsgi_application()
