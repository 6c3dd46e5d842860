"""manage.py admin_user: create or change an admin user and its groups and permissions."""

from argparse import ArgumentParser
from typing import Any

from django.contrib.auth.models import Group, Permission, User
from django.db import transaction

from core.commands import ProjectCommand, refused
from core.exit_codes import ExitCode

# reminders.viewers.VIEWERS_GROUP (the base imports no app).
VIEWERS_GROUP = "reminder viewers"
# --flag -> (app label, codename): what each option grants.
GRANTS = {
    "requeue": ("outbox", "requeue_outboxmessage"),
    "number_masks": ("outbox", "view_number_masks"),
}


class Command(ProjectCommand):
    help = (
        "Create the admin user NAME (staff, no usable password until changepassword sets one) or "
        "change it: --viewer puts it in the group 'reminder viewers', --requeue and "
        "--number-masks grant those permissions, --superuser makes it one, --deactivate locks it "
        "out. Users and groups are not in the admin: run this under the schema owner's "
        "DATABASE_URL (docs/admin.md)."
    )
    exit_notes = {ExitCode.FAILED: "a database error", ExitCode.REFUSED: "the group or a "
                  "permission missing (migrate first), or a table or grant missing"}

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("name")
        for flag in ("viewer", "requeue", "number-masks", "superuser", "deactivate"):
            parser.add_argument(f"--{flag}", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self._create_or_change(options)
        except (Group.DoesNotExist, Permission.DoesNotExist) as exc:
            # Both come from migrations: a database not migrated (or not this project's).
            raise refused(f"a group or permission is missing ({exc}): run manage.py migrate "
                          "first, as the schema owner") from None

    def _create_or_change(self, options: dict[str, Any]) -> None:
        with transaction.atomic():
            user, created = User.objects.get_or_create(username=options["name"],
                                                       defaults={"is_staff": True})
            if created:
                user.set_unusable_password()
            user.is_superuser = user.is_superuser or options["superuser"]
            user.is_active = not options["deactivate"]
            user.save()
            if options["viewer"]:
                user.groups.add(Group.objects.get(name=VIEWERS_GROUP))
            for option, (app_label, codename) in GRANTS.items():
                if options[option]:
                    user.user_permissions.add(Permission.objects.get(
                        content_type__app_label=app_label, codename=codename))
        groups = ", ".join(user.groups.values_list("name", flat=True)) or "none"
        self.stdout.write(f"user {user.username}: {'created' if created else 'changed'}, "
                          f"{'active' if user.is_active else 'inactive'}, groups: {groups}"
                          + ("" if user.has_usable_password()
                             else f"; set its password with changepassword {user.username}"))
