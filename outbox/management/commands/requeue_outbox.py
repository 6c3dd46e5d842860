"""manage.py requeue_outbox: list parked outbox rows, or make them deliverable again."""

import uuid
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from core.commands import ProjectCommand, usage_error
from core.exit_codes import ExitCode
from outbox import store


class Command(ProjectCommand):
    help = (
        "List the parked outbox rows (the relay gave up on them after OUTBOX_MAX_ATTEMPTS; each "
        "holds back the later rows of its key), or re-queue them with fresh attempts: --id ID "
        "(repeatable) or --all."
    )
    exit_notes = {ExitCode.FAILED: "an --id was not parked, or a database error",
                  ExitCode.REFUSED: "a table or grant missing"}

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--id", action="append", default=[], metavar="MESSAGE_ID",
                            help="re-queue this parked message (repeatable)")
        parser.add_argument("--all", action="store_true", help="re-queue every parked message")
        parser.add_argument("--limit", type=int, default=50, help="rows to list (50)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["all"] and options["id"]:
            raise usage_error("give either --id or --all, not both")
        try:
            ids = [uuid.UUID(raw) for raw in options["id"]]
        except ValueError:
            raise usage_error(f"--id: expected message ids (UUIDs), got {options['id']}") from None
        if not ids and not options["all"]:
            self._list(options["limit"])
            return
        requeued = store.requeue_parked("default", None if options["all"] else ids)
        self.stdout.write(f"re-queued {len(requeued)} message(s)")
        for message_id in requeued:
            self.stdout.write(f"  {message_id}")
        missing = set(ids) - set(requeued)
        if missing:
            raise CommandError(
                f"not parked (unknown, published or already queued): "
                f"{', '.join(sorted(map(str, missing)))}", returncode=ExitCode.FAILED)

    def _list(self, limit: int) -> None:
        parked = store.list_parked("default", limit)
        self.stdout.write(f"{len(parked)} parked message(s)" + (" (first shown)" if
                          len(parked) == limit else ""))
        for p in parked:
            self.stdout.write(
                f"  {p.id} key {p.message_key} {p.event_type} attempts {p.attempts} "
                f"parked {p.parked_at.isoformat()} holding back {p.blocked_behind}: "
                f"{(p.last_error or '')[:200]}"
            )
