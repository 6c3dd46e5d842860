"""Settings for development, tests and the demo: production's, plus the devtools app (the
mock Kafka cluster, the topic reader, the dev documents table, demo data)."""

from pin_profile.settings import *  # noqa: F403
from pin_profile.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "devtools"]
