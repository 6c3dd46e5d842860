"""Development and demo tools, never installed by the production settings: the mock Kafka
cluster, the topic reader, the dev documents table and demo data (pin_profile/settings_dev.py)."""

from django.apps import AppConfig


class DevtoolsConfig(AppConfig):
    name = "devtools"
    verbose_name = "Development and demo tools"
    default_auto_field = "django.db.models.BigAutoField"
