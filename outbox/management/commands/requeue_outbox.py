"""manage.py requeue_outbox: list parked outbox rows, preview a re-queue, or make them deliverable
again (outbox.admin.requeue: logged and counted)."""

import uuid
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from core.commands import ProjectCommand, usage_error
from core.exit_codes import ExitCode
from outbox import store
from outbox.admin import requeue, requeue_preview


class Command(ProjectCommand):
    help = (
        "List the parked outbox rows (the relay gave up on them after OUTBOX_MAX_ATTEMPTS; each "
        "holds back the later rows of its key), or re-queue them with fresh attempts: --id ID "
        "(repeatable), or --all with --yes; --dry-run shows what would go back (count, keys, "
        "oldest) and changes nothing. Each re-queue writes one log line (counts and message "
        "ids)."
    )
    exit_notes = {ExitCode.FAILED: "an --id was not parked, or a database error",
                  ExitCode.USAGE: "also --all without --yes (nothing re-queued)",
                  ExitCode.REFUSED: "a table or grant missing"}

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--id", action="append", default=[], metavar="MESSAGE_ID",
                            help="re-queue this parked message (repeatable)")
        parser.add_argument("--all", action="store_true",
                            help="re-queue every parked message (with --yes)")
        parser.add_argument("--yes", action="store_true",
                            help="confirm --all: re-queue every parked message")
        parser.add_argument("--dry-run", action="store_true",
                            help="show what --id or --all would re-queue; change nothing")
        parser.add_argument("--limit", type=int, default=50, help="rows to list (50)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["all"] and options["id"]:
            raise usage_error("give either --id or --all, not both")
        try:
            ids = [uuid.UUID(raw) for raw in options["id"]]
        except ValueError:
            raise usage_error(f"--id: expected message ids (UUIDs), got {options['id']}") from None
        if not ids and not options["all"]:
            if options["dry_run"]:
                raise usage_error("--dry-run previews a re-queue: give --id or --all")
            self._list(options["limit"])
            return
        selected = None if options["all"] else ids
        if options["dry_run"]:
            self._preview(selected)
            return
        if options["all"] and not options["yes"]:
            parked = len(requeue_preview("default", None))
            raise usage_error(
                f"--all re-queues every parked message ({parked} now) and needs --yes: nothing "
                "re-queued; see them with --all --dry-run")
        requeued = requeue("default", selected, via="command")
        self.stdout.write(f"re-queued {len(requeued)} message(s)")
        for message_id in requeued:
            self.stdout.write(f"  {message_id}")
        missing = set(ids) - set(requeued)
        if missing:
            raise CommandError(
                f"not parked (unknown, published or already queued): "
                f"{', '.join(sorted(map(str, missing)))}", returncode=ExitCode.FAILED)

    def _preview(self, ids: list[uuid.UUID] | None) -> None:
        rows = requeue_preview("default", ids)
        keys = sorted({row.message_key for row in rows})
        self.stdout.write(f"would re-queue {len(rows)} message(s) of {len(keys)} key(s); "
                          "nothing changed")
        if rows:
            oldest = rows[0]
            self.stdout.write(f"  oldest: {oldest.id} parked {oldest.parked_at.isoformat()} "
                              f"(created {oldest.created_at.isoformat()})")
            self.stdout.write(f"  keys: {', '.join(keys)}")
        for row in rows:
            self.stdout.write(f"  {row.id} key {row.message_key} parked "
                              f"{row.parked_at.isoformat()}")
        if ids is not None and (missing := set(ids) - {row.id for row in rows}):
            self.stdout.write("  not parked (would be refused, exit 1): "
                              f"{', '.join(sorted(map(str, missing)))}")

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
