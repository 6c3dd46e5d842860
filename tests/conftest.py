"""Shared fixtures and hooks: a real PostgreSQL test database with the documents table and the
least-privilege roles, documents made in it, cycles run as the worker role, and the clock under
test. The helpers are tests/support's (`db_roles`, `processes`, `faketime`, `factories`)."""

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from core.db import apply_sql_file
from core.roles import ROLES_SQL
from devtools.demo_data import PERSON_DOCUMENTS_SQL
from tests.support import workers
from tests.support.db_roles import CycleRunner, run_cycle_as_worker
from tests.support.factories import DocumentFactory, Documents, make_document
from tests.support.faketime import CLOCK_AT, clock_target


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
    """Create documents (committed, visible to every connection); emptied after the test. A
    test that writes outbox rows checks them itself (`assert_outbox_matches_contract`)."""
    DocumentFactory.reset_sequence()
    yield make_document
    _truncate_documents()


@pytest.fixture
def run(documents: Documents) -> CycleRunner:
    """run(as_of, **settings or Cycle options): one cycle as the worker role."""
    return run_cycle_as_worker


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


# --- chaos scenarios: what each one tried, in the session summary -----------------------


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.support import chaos_report

    if chaos_report.lines():
        chaos_report.write()
        terminalreporter.section("chaos scenarios: what was tried")
        for line in chaos_report.lines():
            terminalreporter.write_line(line)
