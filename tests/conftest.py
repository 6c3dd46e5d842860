"""Shared fixtures: a real PostgreSQL test database with the documents table and the
least-privilege roles, and helpers to create documents and run cycles as the worker role."""

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from core.db import apply_sql_file
from core.roles import ROLES_SQL, WORKER_ROLE
from devtools.demo_data import PERSON_DOCUMENTS_SQL
from reminders.config import ReminderSettings
from reminders.cycle import run_cycle
from reminders.result import CycleResult
from tests.support import workers
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import as_role
from tests.support.factories import DocumentFactory, Documents, insert_documents, make_document

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    workers.configure(config)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """Each xdist worker (or a TEST_OWN_CLUSTER=1 run) on a PostgreSQL cluster of its own."""
    workers.use_own_cluster()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> None:
    """The test database as production has it: person_documents exists, roles are granted."""
    with django_db_blocker.unblock():
        apply_sql_file(PERSON_DOCUMENTS_SQL)
        apply_sql_file(ROLES_SQL)


def _truncate_documents() -> None:
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        cursor.execute("truncate person_documents")


@pytest.fixture
def documents(transactional_db: None) -> Iterator[Documents]:
    """Create documents (committed, visible to every connection); emptied after the test."""
    DocumentFactory.reset_sequence()
    yield make_document
    assert_outbox_matches_contract()
    _truncate_documents()


def as_worker() -> AbstractContextManager[None]:
    """Run the block's queries as the worker's least-privilege role."""
    return as_role(WORKER_ROLE)


CycleRunner = Callable[..., CycleResult]


@pytest.fixture
def run(documents: Documents) -> CycleRunner:
    """run(as_of, **settings or Cycle options): one cycle as the worker role."""

    def _run(as_of: datetime, **options: Any) -> CycleResult:
        settings_fields = set(ReminderSettings.__dataclass_fields__)
        settings = ReminderSettings().with_overrides(
            **{k: v for k, v in options.items() if k in settings_fields}
        )
        cycle_options = {k: v for k, v in options.items() if k not in settings_fields}
        with as_worker():
            return run_cycle(settings, as_of=as_of, **cycle_options)

    return _run


def test_database_url(role: str | None = None) -> str:
    """A URL to the test database, as `role` (default: the configured user)."""
    settings = connection.settings_dict
    user = role or settings["USER"]
    return (f"postgres://{user}@{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}"
            f"/{settings['NAME']}")


test_database_url.__test__ = False  # type: ignore[attr-defined]


def command_env(role: str = WORKER_ROLE, **extra: str) -> dict[str, str]:
    """Environment for a `manage.py` subprocess on the test database as `role`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMINDER_")}
    env.update(DATABASE_URL=test_database_url(role), LOG_FORMAT="json",
               PYTHONUNBUFFERED="1", **extra)
    return env


def manage_py() -> list[str]:
    return [sys.executable, str(ROOT / "manage.py")]


def new_uuid() -> uuid.UUID:
    return uuid.uuid4()


__all__ = ["CycleRunner", "command_env", "insert_documents", "manage_py", "new_uuid"]

# --- the clock under test (issue 10) ------------------------------------------------------

CLOCK_AT = "TEST_CLOCK_AT"


def clock_target(spec: str, real_now: datetime) -> datetime:
    """TEST_CLOCK_AT's instant: an ISO instant in UTC, or a UTC time of day meaning its latest
    occurrence at or before `real_now`."""
    if len(spec) <= len("HH:MM:SS.ffffff") and "T" not in spec:
        at = datetime.combine(real_now.date(), time.fromisoformat(spec), tzinfo=UTC)
        return at if at <= real_now else at - timedelta(days=1)
    instant = datetime.fromisoformat(spec)
    if instant.tzinfo is None:
        raise ValueError(f"{CLOCK_AT}={spec!r}: give the instant in UTC (a Z suffix)")
    return instant.astimezone(UTC)


@pytest.fixture(autouse=True)
def _clock_at(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under scripts/test-clock.sh: start each `real_clock` test with the clock of this test
    process and of every process it starts (libfaketime, offset in FAKETIME) at TEST_CLOCK_AT.

    PostgreSQL keeps the real clock, so the worker's clock runs up to a day behind the
    database's (the times of day) or years ahead (2028): the run history, stamped and aged by
    the database's now(), must not mind (docs/design.md §3.10)."""
    spec = os.environ.get(CLOCK_AT)
    marker = request.node.get_closest_marker("real_clock")
    if not spec or marker is None:
        yield
        return
    if "faketime" not in os.environ.get("LD_PRELOAD", "") or "FAKETIME" not in os.environ:
        pytest.fail(f"{CLOCK_AT} needs libfaketime preloaded with FAKETIME set: "
                    "run scripts/test-clock.sh")
    before = os.environ["FAKETIME"]
    real_now = datetime.now(UTC) - timedelta(seconds=float(before))
    target = clock_target(spec, real_now)
    # A relative offset, re-read on every call (FAKETIME_NO_CACHE): one clock for all processes.
    os.environ["FAKETIME"] = f"{(target - real_now).total_seconds():+.3f}"
    assert abs(datetime.now(UTC) - target) < timedelta(seconds=5), "libfaketime is not in effect"
    try:
        yield
    finally:
        os.environ["FAKETIME"] = before


# The relay's fixtures: a mock Kafka cluster or a Tansu broker per test; Apache Kafka itself.
pytest_plugins = ["tests.support.relay_support", "tests.support.tansu_support",
                  "tests.support.kafka_support"]


# --- chaos scenarios (issue 7): what each one tried, in the session summary ---------------


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.support import chaos_report

    if chaos_report.lines():
        chaos_report.write()
        terminalreporter.section("chaos scenarios: what was tried")
        for line in chaos_report.lines():
            terminalreporter.write_line(line)
