"""The reminders app: the expiry-reminder worker, its ledger, its run history and its admin."""

from typing import Any

from django.apps import AppConfig
from django.db import connections
from django.db.models.signals import pre_migrate


def create_profile_schema(using: str = "default", **_: Any) -> None:
    """Create the `profile` schema before migrate writes anything, its own bookkeeping included."""
    from django.conf import settings

    with connections[using].cursor() as cursor:
        cursor.execute(f"create schema if not exists {settings.DB_SCHEMA}")


class RemindersConfig(AppConfig):
    name = "reminders"
    verbose_name = "Document-expiry reminders"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        pre_migrate.connect(create_profile_schema, dispatch_uid="reminders.create_profile_schema")
