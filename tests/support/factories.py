"""factory-boy factories for person documents, inserted with SQL (the table is not ours, and
its model deliberately does not map payload_cipher)."""

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import factory
from django.db import connection


@dataclass
class DocumentSpec:
    id: uuid.UUID
    owner_user_id: uuid.UUID
    person_id: uuid.UUID
    type: str
    number_mask: str | None
    expires_at: datetime | None
    status: str = "Active"
    deleted_at: datetime | None = None
    payload_cipher: bytes = b"\x00secret"
    created_at: datetime = field(default_factory=lambda: datetime(2020, 1, 1, tzinfo=UTC))


def insert_documents(specs: list[DocumentSpec]) -> None:
    """Insert documents in one statement (committed when outside a transaction)."""
    rows = [
        (s.id, s.owner_user_id, s.person_id, s.type, s.number_mask, s.expires_at, s.status,
         s.deleted_at, s.payload_cipher, s.created_at, s.created_at)
        for s in specs
    ]
    with connection.cursor() as cursor:
        cursor.executemany(
            "insert into person_documents (id, owner_user_id, person_id, type, number_mask,"
            " expires_at, status, deleted_at, payload_cipher, created_at, updated_at)"
            " values (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            rows,
        )


class DocumentFactory(factory.Factory):
    """DocumentFactory(expires_at=...) inserts one Active document and returns its spec."""

    class Meta:
        model = DocumentSpec

    id = factory.LazyFunction(uuid.uuid4)
    owner_user_id = factory.LazyFunction(uuid.uuid4)
    person_id = factory.LazyFunction(uuid.uuid4)
    type = "Passport"
    number_mask = factory.Sequence(lambda n: f"45 ** ****{n % 100:02d}")
    expires_at = None
    payload_cipher = factory.Sequence(lambda n: f"cipher-{n}".encode())

    @classmethod
    def _create(cls, model_class: Any, *args: Any, **kwargs: Any) -> DocumentSpec:
        spec: DocumentSpec = model_class(*args, **kwargs)
        insert_documents([spec])
        return spec


Documents = Callable[..., DocumentSpec]


def make_document(**fields: Any) -> DocumentSpec:
    """Insert one document (factory defaults for what is not given)."""
    spec: DocumentSpec = DocumentFactory(**fields)
    return spec
