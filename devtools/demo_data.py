"""Development, test and demo databases: the documents table this repo does not own, and
realistic demo documents."""

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from core.db import raw_connection
from reminders.events import DOCUMENT_TYPES

PERSON_DOCUMENTS_SQL = Path(__file__).parent / "sql" / "person_documents.sql"

NO_EXPIRY_TYPES = ("Passport", "Inn", "Snils")

COPY_COLUMNS = (
    "id", "owner_user_id", "person_id", "type", "number_mask", "expires_at", "status",
    "deleted_at", "payload_cipher", "created_at", "updated_at",
)


@dataclass(frozen=True, slots=True)
class PersonDocument:
    """One person_documents row, as the demo data and the tests write it (updated_at is
    created_at)."""

    id: uuid.UUID
    owner_user_id: uuid.UUID
    person_id: uuid.UUID
    type: str
    number_mask: str | None
    expires_at: datetime | None
    status: str = "Active"
    deleted_at: datetime | None = None
    payload_cipher: bytes = b"\x00secret"
    created_at: datetime = datetime(2020, 1, 1, tzinfo=UTC)

    def as_copy_row(self) -> tuple[Any, ...]:
        """The row in COPY_COLUMNS order."""
        return (
            self.id, self.owner_user_id, self.person_id, self.type, self.number_mask,
            self.expires_at, self.status, self.deleted_at, self.payload_cipher,
            self.created_at, self.created_at,
        )


def random_mask(rng: random.Random) -> str:
    """A number mask in the profile service's style: `45 ** ****12`."""
    return f"{rng.randint(10, 99)} ** ****{rng.randint(10, 99)}"


def demo_documents(owners: int, today: datetime, rng: random.Random) -> Iterator[PersonDocument]:
    """Several documents per owner, expiring from long past to years ahead; some without
    expiry, some archived or soft-deleted."""
    for _ in range(owners):
        owner = uuid.UUID(int=rng.getrandbits(128), version=4)
        person = uuid.UUID(int=rng.getrandbits(128), version=4)
        for _ in range(rng.randint(1, 5)):
            roll = rng.random()
            if roll < 0.15:
                kind, expires = rng.choice(NO_EXPIRY_TYPES), None
            else:
                kind = rng.choice(DOCUMENT_TYPES)
                # Mostly near today, so that a demo has plenty due; a tail years out or past.
                span = rng.choice((45, 45, 45, 400, 2000))
                expires = today + timedelta(days=rng.randint(-span, span),
                                            minutes=rng.randint(0, 1439))
            status = "Archived" if rng.random() < 0.07 else "Active"
            deleted = today - timedelta(days=rng.randint(1, 300)) if rng.random() < 0.05 else None
            yield PersonDocument(
                id=uuid.UUID(int=rng.getrandbits(128), version=4),
                owner_user_id=owner,
                person_id=person,
                type=kind,
                number_mask=random_mask(rng) if rng.random() < 0.9 else None,
                expires_at=expires,
                status=status,
                deleted_at=deleted,
                payload_cipher=rng.randbytes(48),
                created_at=today - timedelta(days=rng.randint(30, 3000)),
            )


def copy_documents(rows: Iterator[tuple[object, ...]], using: str = "default") -> int:
    """COPY rows (in COPY_COLUMNS order) into person_documents; the number copied."""
    conn = raw_connection(using)
    count = 0
    with conn.transaction(), conn.cursor() as cur, cur.copy(
        f"copy person_documents ({', '.join(COPY_COLUMNS)}) from stdin"
    ) as copy:
        for row in rows:
            copy.write_row(row)
            count += 1
    return count


def seed_demo(owners: int, seed: int, today: datetime | None = None,
              using: str = "default") -> int:
    """Insert demo documents for `owners` owners; the number of documents."""
    now = today or datetime.now(UTC)
    rng = random.Random(seed)  # noqa: S311 - demo data, not secrets
    return copy_documents((d.as_copy_row() for d in demo_documents(owners, now, rng)), using)
