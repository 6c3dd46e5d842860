"""manage.py seed_demo_documents: realistic demo documents in profile.person_documents."""

from argparse import ArgumentParser
from typing import Any

from core.commands import ProjectCommand
from devtools.demo_data import seed_demo


class Command(ProjectCommand):
    help = (
        "Insert demo documents: many owners with 1-5 documents each, expiring from long past to "
        "years ahead, some without expiry, some archived or soft-deleted. For dev and demo "
        "databases only."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--owners", type=int, default=200, help="owners to create (200)")
        parser.add_argument("--seed", type=int, default=42, help="random seed (42)")

    def handle(self, *args: Any, **options: Any) -> None:
        count = seed_demo(options["owners"], options["seed"])
        self.stdout.write(f"seeded {count} documents for {options['owners']} owners")
