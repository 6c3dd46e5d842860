"""manage.py show_outbox: a short human summary of the outbox's reminder events."""

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand
from django.db.models import Count, Q

from outbox.models import OutboxMessage


class Command(BaseCommand):
    help = "Print the newest outbox events (owner, documents, thresholds) and totals."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--limit", type=int, default=10, help="events to print (10)")

    def handle(self, *args: Any, **options: Any) -> None:
        totals = OutboxMessage.objects.aggregate(
            events=Count("id"), unpublished=Count("id", filter=Q(published_at__isnull=True)),
            parked=Count("id", filter=Q(published_at__isnull=True, parked_at__isnull=False)),
        )
        self.stdout.write(
            f"outbox: {totals['events']} event(s), {totals['unpublished']} unpublished"
            f" ({totals['parked']} parked: see requeue_outbox)"
        )
        for message in OutboxMessage.objects.order_by("-created_at", "id")[: options["limit"]]:
            documents = message.payload.get("documents", [])
            described = ", ".join(
                f"{d['type']} expires {d['expiresAt']} ({d['thresholdDays']}d threshold, "
                f"{d['daysLeft']} left)"
                for d in documents
            )
            self.stdout.write(f"  owner {message.message_key}: {described}")
