"""Runs in the run history, dated as the worker dates them: by the database's now()."""

import uuid
from datetime import timedelta
from typing import Any

from django.db import connection


def insert_run(age: timedelta, status: str, finished: bool = True) -> uuid.UUID:
    """A run that started `age` ago on the database's clock (its `now()` stamps real runs),
    and ended a minute later unless `finished` is false."""
    run_id = uuid.uuid4()
    params: dict[str, Any] = {"run_id": run_id, "age": age, "finished": finished, "status": status}
    with connection.cursor() as cursor:
        cursor.execute(
            "insert into document_expiry_reminder_runs (run_id, as_of, started_at, finished_at,"
            " status, thresholds) values (%(run_id)s, now() - %(age)s::interval,"
            " now() - %(age)s::interval,"
            " case when %(finished)s then now() - %(age)s::interval + interval '1 minute' end,"
            " %(status)s, '30,7,1,0')",
            params,
        )
    return run_id


def run_states() -> dict[uuid.UUID, str]:
    """Every run's status, by run id."""
    with connection.cursor() as cursor:
        cursor.execute("select run_id, status from document_expiry_reminder_runs")
        return {run_id: status for run_id, status in cursor.fetchall()}
