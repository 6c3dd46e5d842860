"""Development, test and demo databases: the documents table this repo does not own, the
least-privilege roles, and realistic demo documents."""

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from reminders import store

SQL_DIR = Path(__file__).parent / "sql"
PERSON_DOCUMENTS_SQL = SQL_DIR / "person_documents.sql"
ROLES_SQL = SQL_DIR / "roles.sql"
WORKER_ROLE = "pin_reminder_worker"
RELAY_ROLE = "pin_outbox_relay"
ADMIN_WEB_ROLE = "pin_admin_web"

DOCUMENT_TYPES = ("Passport", "InternationalPassport", "DriverLicense", "ResidencePermit", "Visa")
NO_EXPIRY_TYPES = ("Passport", "Inn", "Snils")

COPY_COLUMNS = (
    "id", "owner_user_id", "person_id", "type", "number_mask", "expires_at", "status",
    "deleted_at", "payload_cipher", "created_at", "updated_at",
)


def apply_sql_file(path: Path, using: str = "default") -> None:
    """Run a whole SQL script (several statements, no parameters) in one transaction."""
    conn = store.raw_connection(using)
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(path.read_text(encoding="utf-8").encode())


@dataclass(frozen=True, slots=True)
class DemoDocument:
    id: uuid.UUID
    owner_user_id: uuid.UUID
    person_id: uuid.UUID
    type: str
    number_mask: str | None
    expires_at: datetime | None
    status: str
    deleted_at: datetime | None
    payload_cipher: bytes
    created_at: datetime

    def as_copy_row(self) -> tuple[object, ...]:
        return (
            self.id, self.owner_user_id, self.person_id, self.type, self.number_mask,
            self.expires_at, self.status, self.deleted_at, self.payload_cipher,
            self.created_at, self.created_at,
        )


def random_mask(rng: random.Random) -> str:
    """A number mask in the profile service's style: `45 ** ****12`."""
    return f"{rng.randint(10, 99)} ** ****{rng.randint(10, 99)}"


def demo_documents(owners: int, today: datetime, rng: random.Random) -> Iterator[DemoDocument]:
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
            yield DemoDocument(
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
    conn = store.raw_connection(using)
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
