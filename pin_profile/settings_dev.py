"""Settings for development, tests and the demo: production's, plus the devtools app (the
mock Kafka cluster, the topic reader, the dev documents table, demo data), and the admin over
plain HTTP on localhost: HTTPS is off unless its variables turn it on (docs/configuration.md)."""

from pin_profile.settings import *  # noqa: F403
from pin_profile.settings import INSTALLED_APPS, https_settings

INSTALLED_APPS = [*INSTALLED_APPS, "devtools"]
(SECURE_SSL_REDIRECT, SECURE_HSTS_SECONDS, SECURE_HSTS_INCLUDE_SUBDOMAINS, SECURE_HSTS_PRELOAD,
 SESSION_COOKIE_SECURE) = https_settings(secure=False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
