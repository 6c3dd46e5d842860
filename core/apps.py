"""The shared base under both apps: database plumbing, settings, commands, logging,
operations endpoints and the read-only admin base (docs/design.md §7)."""

from pathlib import Path
from typing import Any

from django.apps import AppConfig
from django.db import connections
from django.db.models.signals import pre_migrate

from core.queries import QueryFile

SCHEMA_QUERIES = QueryFile(Path(__file__).parent / "sql" / "schema.sql")


def create_profile_schema(using: str = "default", **_: Any) -> None:
    """Create the `profile` schema before migrate writes anything, its own bookkeeping included."""
    with connections[using].cursor() as cursor:
        cursor.execute(SCHEMA_QUERIES["create_profile_schema"])


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "Shared base"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        pre_migrate.connect(create_profile_schema, dispatch_uid="core.create_profile_schema")
