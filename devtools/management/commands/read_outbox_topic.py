"""manage.py read_outbox_topic: print the reminder events on the topic, read from its start."""

import os
from argparse import ArgumentParser
from typing import Any

from core.commands import ProjectCommand
from core.logs import printable
from devtools.read_topic import read_topic
from outbox.config import load_relay_settings
from outbox.kafka import security_config
from reminders import events


class Command(ProjectCommand):
    help = (
        "Read the reminder topic from its start (a fresh consumer group, nothing committed) and "
        "print each event: owner, documents, thresholds; never number masks. Uses "
        "KAFKA_BOOTSTRAP_SERVERS and the relay's KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_* and "
        "KAFKA_SSL_* settings. Exit codes: 0 done, 2 bad configuration."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--topic", default=events.TOPIC, help=f"topic ({events.TOPIC})")
        parser.add_argument("--limit", type=int, default=10, help="events to print (10)")

    def handle(self, *args: Any, **options: Any) -> None:
        settings = load_relay_settings(os.environ)
        records = read_topic(settings.bootstrap_servers, options["topic"],
                             security=security_config(settings.security))
        self.stdout.write(printable(f"topic {options['topic']}: {len(records)} event(s) consumed"))
        for record in records[: options["limit"]]:
            body = record.json()
            described = ", ".join(
                f"{d['type']} expires {d['expiresAt']} ({d['thresholdDays']}d threshold, "
                f"{d['daysLeft']} left)"
                for d in body.get("documents", [])
            )
            # Every value is the topic's: shown with its control characters escaped.
            self.stdout.write(printable(f"  owner {record.key} [p{record.partition}@"
                                        f"{record.offset}, message {record.message_id[:8]}]: "
                                        f"{described}"))
