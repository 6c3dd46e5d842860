"""factory-boy factories for person documents (devtools.demo_data.PersonDocument, the demo
data's row type too), inserted with SQL (the table is not ours, and its model deliberately
does not map payload_cipher)."""

import uuid
from collections.abc import Callable
from typing import Any

import factory
from django.db import connection

from devtools.demo_data import COPY_COLUMNS, PersonDocument


def insert_documents(specs: list[PersonDocument]) -> None:
    """Insert documents in one statement (committed when outside a transaction)."""
    with connection.cursor() as cursor:
        cursor.executemany(
            f"insert into person_documents ({', '.join(COPY_COLUMNS)})"
            f" values ({', '.join(['%s'] * len(COPY_COLUMNS))})",
            [s.as_copy_row() for s in specs],
        )


class DocumentFactory(factory.Factory):
    """DocumentFactory(expires_at=...) inserts one Active document and returns its spec."""

    class Meta:
        model = PersonDocument

    id = factory.LazyFunction(uuid.uuid4)
    owner_user_id = factory.LazyFunction(uuid.uuid4)
    person_id = factory.LazyFunction(uuid.uuid4)
    type = "Passport"
    number_mask = factory.Sequence(lambda n: f"45 ** ****{n % 100:02d}")
    expires_at = None
    payload_cipher = factory.Sequence(lambda n: f"cipher-{n}".encode())

    @classmethod
    def _create(cls, model_class: Any, *args: Any, **kwargs: Any) -> PersonDocument:
        spec: PersonDocument = model_class(*args, **kwargs)
        insert_documents([spec])
        return spec


Documents = Callable[..., PersonDocument]


def make_document(**fields: Any) -> PersonDocument:
    """Insert one document (factory defaults for what is not given)."""
    spec: PersonDocument = DocumentFactory(**fields)
    return spec
