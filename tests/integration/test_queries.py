"""Every named query of every app's `sql/` files parses and plans on the real schema, and the
candidate scans use the partial expiry index rather than a scan of the whole documents table."""

import uuid
from datetime import UTC, date, datetime, timedelta

import pytest
from django.db import connection

from core.db import raw_connection
from core.queries import load, parse_queries, query_files
from reminders import store
from reminders.rules import scan_window

TODAY = date(2026, 11, 29)
WINDOW = scan_window(TODAY, (30, 7, 1, 0), 90)
SAMPLE = {
    "window_start": WINDOW.start, "window_end": WINDOW.end, "thresholds": [30, 7, 1, 0],
    "as_of_date": TODAY, "owner_ids": [uuid.uuid4()], "document_ids": [uuid.uuid4()],
    "cutoff": TODAY, "chunk": 10,
    "m_document_ids": [uuid.uuid4()], "m_owner_ids": [uuid.uuid4()], "m_types": ["Visa"],
    "m_expires_on": [TODAY], "m_thresholds": [7], "m_notified": [True],
    "i_document_ids": [uuid.uuid4()], "i_types": ["Visa"], "i_number_masks": [None],
    "i_expires_on": [TODAY], "i_days_left": [3], "run_id": uuid.uuid4(),
    "reminded_at": "2026-11-29T03:00:00Z", "aggregate_type": "Profile", "event_type": "E",
    "contract_version": 1, "topic": "t", "extra_headers": None, "partitions": 3,
    "as_of": datetime(2026, 11, 29, 3, 0, tzinfo=UTC),
    "host": "h", "trigger": "loop", "tick": datetime(2026, 11, 29, 3, 0, tzinfo=UTC),
    "status": "succeeded", "reminders_sent": 0, "owners_notified": 0, "markers_written": 0,
    "markers_rearmed": 0, "owners_already_queued": 0, "skipped_already_marked": 0, "pruned": 0,
    "failed_owners": 0, "message_id_namespace": uuid.uuid4(),
    "duration_ms": 0, "error": None, "max_documents_per_event": 500, "unknown_type": "Unknown",
    "older_than": timedelta(hours=1), "successful": ["succeeded"], "since": datetime.now(UTC),
    "batch_size": 10, "lease": timedelta(minutes=2), "relay_id": "r", "ids": [uuid.uuid4()],
    "errors": ["e"], "retry_in": [timedelta(seconds=1)], "max_attempts": 5,
    "retention": timedelta(days=7), "limit": 10, "all": False,
    "after_txid": "1", "after_seq": 0, "from_txid": "1", "from_seq": 0, "upto_txid": "2",
    "upto_seq": 5, "published_at": datetime(2026, 11, 29, 3, 0, tzinfo=UTC), "messages": 5,
    "attempted": [True], "park": [False], "leader_pid": 1, "keys": ["k"],
    "lock": 1, "statement": "alter table outbox_messages add column x text",
    "until": datetime.now(UTC), "pruning_statuses": ["succeeded"], "pruned_before": "2026-08-31",
    "uuid_pattern": "^[0-9a-f-]{36}$", "started_at": datetime.now(UTC), "max_documents": 500,
    "now": datetime.now(UTC), "bound": timedelta(hours=26),
    "after_expiry": datetime(2026, 11, 29, 3, 0, tzinfo=UTC), "after_owner": uuid.uuid4(),
    "page_owners": 10, "topics": ["t"],
}
# Every named query of the project, as "file stem: name".
NAMED = {f"{path.parent.parent.name}/{path.stem}: {name}": sql
         for path in query_files() for name, sql in load(path).items()}


def test_parse_queries_splits_named_blocks() -> None:
    assert parse_queries("-- a: first\nselect 1;\n\n-- b: second\nselect 2;\n") == {
        "a": "select 1", "b": "select 2"}
    with pytest.raises(ValueError, match="twice"):
        parse_queries("-- a: x\nselect 1;\n-- a: y\nselect 2;")
    # A header wrapped onto comment lines: they describe the block, the statement follows.
    assert parse_queries("-- a: a description\n-- wrapped on\nset x = 1;\n") == {"a": "set x = 1"}


def test_every_app_with_statements_is_covered() -> None:
    assert {key.split("/")[0] for key in NAMED} == {"core", "reminders", "outbox", "audit"}


@pytest.mark.parametrize("name", sorted(NAMED))
def test_query_plans(name: str, db: None) -> None:
    sql = NAMED[name].replace("{statement}", "select 1")  # the admin EXPLAIN template
    with raw_connection("default").cursor() as cursor:
        if sql.lower().startswith(("set ", "listen ", "create ")):  # no plan: it runs (idempotent)
            cursor.execute(sql)
            return
        if sql.lower().startswith("explain "):
            cursor.execute(sql, SAMPLE)
        else:
            cursor.execute(f"explain {sql}", SAMPLE)
        assert cursor.fetchall()


def _plan(name: str) -> str:
    with raw_connection("default").cursor() as cursor:
        cursor.execute("set local enable_seqscan = on")
        cursor.execute(f"explain {store.QUERIES[name]}", SAMPLE)
        return "\n".join(r[0] for r in cursor.fetchall())


@pytest.mark.parametrize("name", ["window_census", "due_owners", "due_owners_page"])
def test_candidate_queries_use_the_partial_expiry_index(name: str, db: None) -> None:
    with connection.cursor() as cursor:  # a table big enough for the planner to care
        cursor.execute("""
            insert into person_documents
            select gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Visa', null,
                   %(today)s::timestamptz + (i %% 3650 - 1825) * interval '1 day', 'Active', null,
                   '\\x00', %(today)s, %(today)s
            from generate_series(1, 50000) i""", {"today": TODAY})  # around the window's day
        cursor.execute("analyze person_documents")
    plan = _plan(name)
    assert "ix_person_documents_expires_at" in plan, plan
    assert "Seq Scan on person_documents" not in plan, plan
