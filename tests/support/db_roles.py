"""The test database as one of the least-privilege roles: its queries and cycles run in the
role (`as_role`, `as_worker`, `run_cycle_as_worker`), and a URL connecting as it."""

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any

from django.db import connection

from core.roles import WORKER_ROLE
from reminders.config import ReminderSettings
from reminders.cycle import run_cycle
from reminders.result import CycleResult


@contextmanager
def as_role(role: str) -> Iterator[None]:
    """Run the block's queries (this thread's connection) as `role`."""
    with connection.cursor() as cursor:
        cursor.execute(f"set role {role}")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("reset role")


def as_worker() -> AbstractContextManager[None]:
    """Run the block's queries as the worker's least-privilege role."""
    return as_role(WORKER_ROLE)


CycleRunner = Callable[..., CycleResult]


def run_cycle_as_worker(as_of: datetime, **options: Any) -> CycleResult:
    """One cycle as the worker role; `options`: settings (ReminderSettings' fields) or Cycle
    options. The `run` fixture."""
    settings_fields = set(ReminderSettings.__dataclass_fields__)
    settings = ReminderSettings().with_overrides(
        **{k: v for k, v in options.items() if k in settings_fields}
    )
    cycle_options = {k: v for k, v in options.items() if k not in settings_fields}
    with as_worker():
        return run_cycle(settings, as_of=as_of, **cycle_options)


def test_database_url(role: str | None = None) -> str:
    """A URL to the test database, as `role` (default: the configured user)."""
    settings = connection.settings_dict
    user = role or settings["USER"]
    return (f"postgres://{user}@{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}"
            f"/{settings['NAME']}")


test_database_url.__test__ = False  # type: ignore[attr-defined]
