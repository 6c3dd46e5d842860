"""manage.py show_outbox: a short human summary of the outbox's reminder events."""

from argparse import ArgumentParser
from typing import Any

from core.commands import ProjectCommand
from core.exit_codes import ExitCode
from core.logs import printable
from outbox import store
from outbox.models import OutboxMessage


class Command(ProjectCommand):
    help = "Print the newest outbox events (owner, documents, thresholds) and totals."
    exit_notes = {ExitCode.FAILED: "a database error", ExitCode.REFUSED: "a table or grant missing"}

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--limit", type=int, default=10, help="events to print (10)")

    def handle(self, *args: Any, **options: Any) -> None:
        backlog = store.backlog("default")
        self.stdout.write(
            f"outbox: {OutboxMessage.objects.count()} event(s), {backlog.unpublished} unpublished,"
            f" {backlog.parked} parked (see requeue_outbox)"
        )
        for message in OutboxMessage.objects.order_by("-created_at", "id")[: options["limit"]]:
            documents = message.payload.get("documents", [])
            described = ", ".join(
                f"{d['type']} expires {d['expiresAt']} ({d['thresholdDays']}d threshold, "
                f"{d['daysLeft']} left)"
                for d in documents
            )
            # Every value is the documents' or a writer's: shown with its control characters escaped.
            self.stdout.write(printable(f"  owner {message.message_key}: {described}"))
