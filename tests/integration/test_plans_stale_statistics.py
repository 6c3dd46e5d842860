"""The plans of the statements that the design needs in one shape hold whatever the statistics
say (docs/design.md §3.11): on tables loaded by COPY and never analyzed, and on tables whose
statistics were taken when they were 100 times smaller (another distribution: a table in its
steady state, then a bulk load into the window). Each statement is EXPLAINed on its session
as the app sets it up; the intended indexes are asserted, and that no node reads the whole
window (or the ledger, or the outbox) once per batch row. tests/integration/test_queries.py
covers analyzed tables."""

import random
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from core.db import raw_connection
from devtools.demo_data import COPY_COLUMNS
from outbox import store as outbox_store
from reminders import events, store
from reminders.rules import scan_window

TODAY = date(2026, 11, 29)
MIDNIGHT = datetime(2026, 11, 29, tzinfo=UTC)
THRESHOLDS = [30, 7, 1, 0]
WINDOW = scan_window(TODAY, tuple(THRESHOLDS), 90)
DOCUMENTS = 50_000  # one owner each, like a partner's import: every one due
BATCH = 500
TABLES = ("person_documents", "document_expiry_reminders", "outbox_messages")
LEDGER_INDEXES = {"ux_document_expiry_reminders_dedupe"}
STEADY = datetime(2020, 1, 1, tzinfo=UTC)  # created_at of the documents before the bulk load
BULK = datetime(2026, 1, 1, tzinfo=UTC)  # and of the bulk load's


def _copy_documents(cursor: Any, count: int, days: tuple[int, int], created: datetime,
                    seed: int) -> None:
    """COPY `count` Active documents of one owner each, expiring within `days` of today."""
    rng = random.Random(seed)
    with cursor.copy(f"copy person_documents ({', '.join(COPY_COLUMNS)}) from stdin") as copy:
        for _ in range(count):
            expires = MIDNIGHT + timedelta(days=rng.randint(*days), seconds=rng.randrange(86_400))
            copy.write_row((uuid.UUID(int=rng.getrandbits(128)),
                            uuid.UUID(int=rng.getrandbits(128)),
                            uuid.UUID(int=rng.getrandbits(128)), "Visa", None, expires, "Active",
                            None, b"\x00", created, created))


def _add_markers_and_events(cursor: Any, created: datetime) -> None:
    """Markers for half the documents created at `created` (all thresholds; every other one
    for an earlier expiry date, a quarter past the retention, for the prune) and an outbox row
    for each of them, 1 in 100 detoured into the slow lane."""
    cursor.execute("""
        insert into document_expiry_reminders
            (id, document_id, owner_user_id, type, threshold_days, expires_at, reminded_at,
             notified, run_id)
        select gen_random_uuid(), d.id, d.owner_user_id, d.type, t.threshold_days,
               (d.expires_at at time zone 'UTC')::date
                   - 200 * (get_byte(uuid_send(d.id), 14) %% 2),
               now(), t.threshold_days = 0, gen_random_uuid()
        from person_documents d
        cross join unnest(%(thresholds)s::int[]) as t(threshold_days)
        where d.created_at = %(created)s and get_byte(uuid_send(d.id), 15) %% 2 = 0
        on conflict do nothing""", {"thresholds": THRESHOLDS, "created": created})
    cursor.execute("""
        insert into outbox_messages
            (aggregate_type, aggregate_id, event_type, contract_version, topic, message_key,
             payload, headers, detoured_at)
        select 'Profile', d.owner_user_id::text, 'E', 1, 't', d.owner_user_id::text, '{}', '{}',
               case when get_byte(uuid_send(d.id), 13) < 3 then now() end
        from person_documents d
        where d.created_at = %(created)s and get_byte(uuid_send(d.id), 15) %% 2 = 0""",
                   {"created": created})


def _forget_statistics(cursor: Any) -> None:
    cursor.execute("delete from pg_statistic where starelid = any(%s::regclass[])",
                   [list(TABLES)])


@pytest.fixture(scope="module", params=["never analyzed", "analyzed 100 times smaller"])
def lying_statistics(request: pytest.FixtureRequest, django_db_setup: None,
                     django_db_blocker: Any) -> Iterator[dict[str, Any]]:
    """The tables loaded by COPY (committed; autovacuum kept off them meanwhile, so that the
    statistics stay as the test left them), and a batch's worth of ids for the statements."""
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(f"truncate {', '.join(TABLES)}")
        for table in TABLES:
            cursor.execute(f"alter table {table} set (autovacuum_enabled = off)")
        _forget_statistics(cursor)
        with raw_connection("default").cursor() as raw:
            if request.param == "analyzed 100 times smaller":
                # the steady state: ten years around today, few documents in the window
                _copy_documents(raw, DOCUMENTS // 100, (-1826, 1826), STEADY, seed=1)
                _add_markers_and_events(raw, STEADY)
                cursor.execute(f"analyze {', '.join(TABLES)}")
            # the bulk load: every document in the window
            _copy_documents(raw, DOCUMENTS, (-90, 30), BULK, seed=2)
            _add_markers_and_events(raw, BULK)
            raw.execute("""select id, owner_user_id from person_documents
                           where expires_at >= %s and expires_at < %s
                           order by expires_at limit %s""", (WINDOW.start, WINDOW.end, BATCH))
            rows = raw.fetchall()
    try:
        yield {"document_ids": [str(r[0]) for r in rows], "owner_ids": [r[1] for r in rows]}
    finally:
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute(f"truncate {', '.join(TABLES)}")
            for table in TABLES:
                cursor.execute(f"alter table {table} reset (autovacuum_enabled)")
            cursor.execute(f"analyze {', '.join(TABLES)}")


def _params(batch: dict[str, Any]) -> dict[str, Any]:
    return {
        "window_start": WINDOW.start, "window_end": WINDOW.end, "thresholds": THRESHOLDS,
        "as_of_date": TODAY, "run_id": uuid.uuid4(),
        # the claim's envelope as the cycle passes it (reminders.events), message-id namespace too
        **events.envelope_params(datetime(2026, 11, 29, 3, 0, tzinfo=UTC)),
        "extra_headers": None, "cutoff": TODAY - timedelta(days=90),
        "chunk": 5_000, "batch_size": 500, "after_txid": "1", "after_seq": 0,
        "after_expiry": None, "after_owner": None, "page_owners": 100_000, **batch,
    }


def _plan(queries: Any, name: str, setup: tuple[str, ...], batch: dict[str, Any]
          ) -> dict[str, Any]:
    """EXPLAIN (FORMAT JSON) of `name`, after the statements its session runs first."""
    with raw_connection("default").cursor() as cursor:
        for statement in setup:
            cursor.execute(queries[statement])
        cursor.execute(f"explain (format json) {queries[name]}", _params(batch))
        row = cursor.fetchone()
    assert row is not None
    return row[0][0]["Plan"]  # type: ignore[no-any-return]


def _nodes(plan: dict[str, Any], inner: bool = False) -> Iterator[tuple[dict[str, Any], bool]]:
    """Every node, and whether it runs on the inner side of a nested loop (once per row)."""
    yield plan, inner
    for index, child in enumerate(plan.get("Plans", [])):
        rescanned = inner or (plan["Node Type"] == "Nested Loop" and index == 1)
        yield from _nodes(child, rescanned)


def _indexes(node: dict[str, Any]) -> set[str]:
    """The indexes a scan node reads (a bitmap heap scan's from its bitmap children)."""
    found = {node["Index Name"]} if "Index Name" in node else set()
    if node["Node Type"] == "Bitmap Heap Scan":
        found |= {n["Index Name"] for n, _ in _nodes(node) if "Index Name" in n}
    return found


def _scans(plan: dict[str, Any], relation: str) -> list[tuple[dict[str, Any], bool]]:
    return [(n, inner) for n, inner in _nodes(plan)
            if n.get("Relation Name") == relation and n["Node Type"] != "ModifyTable"]


def _describe(scans: list[tuple[dict[str, Any], bool]]) -> list[str]:
    return [f"{n['Node Type']} {sorted(_indexes(n))}{' (per row)' if inner else ''}"
            for n, inner in scans]


def _no_bitmap_and(plan: dict[str, Any]) -> None:
    assert not [n for n, _ in _nodes(plan) if n["Node Type"] == "BitmapAnd"], \
        "a BitmapAnd reads a whole index range (every marker of a date) in each probe"


def _ledger_by_key(plan: dict[str, Any]) -> None:
    scans = _scans(plan, "document_expiry_reminders")
    assert scans and all(_indexes(n) == LEDGER_INDEXES for n, _ in scans), _describe(scans)
    _no_bitmap_and(plan)


def _claim_batch(plan: dict[str, Any]) -> None:
    # one primary-key probe a batch id, never the window
    scans = _scans(plan, "person_documents")
    assert scans and all(n["Node Type"] == "Index Scan" and _indexes(n) == {"person_documents_pkey"}
                         for n, _ in scans), _describe(scans)
    _ledger_by_key(plan)


def _batch_documents(plan: dict[str, Any]) -> None:
    # one owner-index probe a batch owner, never the window
    scans = _scans(plan, "person_documents")
    assert scans and all(_indexes(n) == {"ix_person_documents_owner_user_id"}
                         for n, _ in scans), _describe(scans)
    _ledger_by_key(plan)


def _window_once(plan: dict[str, Any]) -> None:
    scans = _scans(plan, "person_documents")
    assert len(scans) == 1 and not scans[0][1], _describe(scans)
    assert _indexes(scans[0][0]) == {"ix_person_documents_expires_at"}, _describe(scans)


def _window_census(plan: dict[str, Any]) -> None:
    _window_once(plan)
    _ledger_by_key(plan)  # a probe per document and threshold, by the marker's unique key


def _due_owners(plan: dict[str, Any]) -> None:
    _window_once(plan)
    # the markers by a join: one pass over the ledger, none a document
    assert not [n for n, _ in _nodes(plan) if n["Node Type"] == "Nested Loop"], \
        _describe(_scans(plan, "document_expiry_reminders"))
    assert len(_scans(plan, "document_expiry_reminders")) == 1


def _relations_under(node: dict[str, Any]) -> list[str]:
    return [node.get("Relation Name", "")] + [
        name for child in node.get("Plans", []) for name in _relations_under(child)]


def _due_owners_page(plan: dict[str, Any]) -> None:
    _window_once(plan)
    assert len(_scans(plan, "document_expiry_reminders")) == 1
    # the one nested loop joins the census row to the page, both over the pass's CTE: no table
    # scanned under it
    for node, _ in _nodes(plan):
        if node["Node Type"] == "Nested Loop":
            assert not any(_relations_under(node)), _relations_under(node)


def _prune_expired_markers(plan: dict[str, Any]) -> None:
    scans = _scans(plan, "document_expiry_reminders")
    # the chunk's ids through the expiry index (under its limit), then each by primary key
    assert sorted((n["Node Type"], *sorted(_indexes(n))) for n, _ in scans) == [
        ("Index Scan", "document_expiry_reminders_pkey"),
        ("Index Scan", "ix_document_expiry_reminders_expires_at"),
    ], _describe(scans)
    assert not [n for n, _ in _nodes(plan) if "Hash" in n["Node Type"]]


def _count_expired_markers(plan: dict[str, Any]) -> None:
    # once, through the expiry index: never the whole ledger
    scans = _scans(plan, "document_expiry_reminders")
    assert len(scans) == 1 and not scans[0][1], _describe(scans)
    assert _indexes(scans[0][0]) == {"ix_document_expiry_reminders_expires_at"}, _describe(scans)


def _read_stream(plan: dict[str, Any]) -> None:
    # in stream order through its index, stopping at the batch; the held check a probe a row
    scans = _scans(plan, "outbox_messages")
    assert scans and _indexes(scans[0][0]) == {"ix_outbox_messages_stream"}, _describe(scans)
    assert not scans[0][1], _describe(scans)
    # the held check: a subplan run for each row (not hashed), through the slow lane's index
    assert scans[1:] and all(
        _indexes(n) == {"ix_outbox_messages_slow_key"} and n.get("Parent Relationship") == "SubPlan"
        and not n.get("Subplan Name", "").startswith("hashed") for n, _ in scans[1:]), \
        _describe(scans)
    assert not [n for n, _ in _nodes(plan) if n["Node Type"] == "Sort"]


def _read_slow(plan: dict[str, Any]) -> None:
    # the slow lane through its partial index only: never the stream's whole index
    scans = _scans(plan, "outbox_messages")
    assert scans and all(_indexes(n) == {"ix_outbox_messages_slow_key"} for n, _ in scans), \
        _describe(scans)


REMINDERS = [
    # (statement, the statements its session runs before it, the check)
    ("claim_batch", (), _claim_batch),
    ("batch_documents", (), _batch_documents),
    ("window_census", (), _window_census),
    ("due_owners", ("tune_session", "due_owners_plan"), _due_owners),
    ("due_owners_page", ("tune_transaction", "due_owners_plan"), _due_owners_page),
    ("prune_expired_markers", ("prune_plan",), _prune_expired_markers),
    ("count_expired_markers", (), _count_expired_markers),
]
RELAY = [
    ("read_stream", ("stream_reader_session",), _read_stream),
    ("read_slow", (), _read_slow),
]


@pytest.mark.parametrize(("name", "setup", "check"), REMINDERS, ids=[r[0] for r in REMINDERS])
def test_reminder_plans_hold_with_lying_statistics(
        lying_statistics: dict[str, Any], name: str, setup: tuple[str, ...], check: Any,
        db: None) -> None:
    check(_plan(store.QUERIES, name, setup, lying_statistics))


@pytest.mark.parametrize(("name", "setup", "check"), RELAY, ids=[r[0] for r in RELAY])
def test_relay_plans_hold_with_lying_statistics(
        lying_statistics: dict[str, Any], name: str, setup: tuple[str, ...], check: Any,
        db: None) -> None:
    check(_plan(outbox_store.QUERIES, name, setup, lying_statistics))
