"""The "reminder viewers" group with view permissions on the ledger, runs and outbox."""

from typing import Any

from django.apps.registry import Apps
from django.contrib.auth.management import create_permissions
from django.db import migrations

from reminders.viewers import VIEWERS_GROUP, ensure_viewers_group


def create_viewers_group(apps: Apps, schema_editor: Any) -> None:
    # Permissions are normally created after the whole migrate (post_migrate): create them now.
    for label in ("reminders", "outbox"):
        app_config = apps.get_app_config(label)
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0, using=schema_editor.connection.alias)
        app_config.models_module = None
    # The permissions as of this migration, frozen: later models get their own migration.
    ensure_viewers_group(apps, permissions=(
        ("reminders", "view_documentexpiryreminder"),
        ("reminders", "view_reminderrun"),
        ("outbox", "view_outboxmessage"),
    ))


def drop_viewers_group(apps: Apps, schema_editor: Any) -> None:
    apps.get_model("auth", "Group").objects.filter(name=VIEWERS_GROUP).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0002_ledger_and_runs"),
        ("outbox", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]
    operations = [migrations.RunPython(create_viewers_group, drop_viewers_group)]
