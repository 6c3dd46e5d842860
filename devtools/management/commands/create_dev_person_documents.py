"""manage.py create_dev_person_documents: create profile.person_documents for dev/test/demo."""

from typing import Any

from core.commands import ProjectCommand
from core.db import apply_sql_file
from devtools.demo_data import PERSON_DOCUMENTS_SQL


class Command(ProjectCommand):
    help = (
        "Create profile.person_documents and its indexes from devtools/sql/person_documents.sql "
        "(idempotent). Production has this table already: never run this there."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        apply_sql_file(PERSON_DOCUMENTS_SQL)
        self.stdout.write("profile.person_documents is in place")
