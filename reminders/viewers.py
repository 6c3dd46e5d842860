"""The "reminder viewers" group: staff who may browse the ledger, the run history and the
outbox in the admin, and change nothing."""

from typing import Any

from django.apps.registry import Apps

VIEWERS_GROUP = "reminder viewers"

# (app label, permission codename): view only; re-queueing parked messages is granted apart.
VIEWER_PERMISSIONS = (
    ("reminders", "view_documentexpiryreminder"),
    ("reminders", "view_reminderrun"),
    ("outbox", "view_outboxmessage"),
)


def ensure_viewers_group(
    apps: Apps, permissions: tuple[tuple[str, str], ...] = VIEWER_PERMISSIONS
) -> Any:
    """Create the group if missing and give it exactly `permissions`; returns the group.

    Takes an app registry so that a migration can pass its historical one.
    """
    group_model = apps.get_model("auth", "Group")
    permission_model = apps.get_model("auth", "Permission")
    group, _ = group_model.objects.get_or_create(name=VIEWERS_GROUP)
    group.permissions.set([
        permission_model.objects.get(content_type__app_label=app_label, codename=codename)
        for app_label, codename in permissions
    ])
    return group
