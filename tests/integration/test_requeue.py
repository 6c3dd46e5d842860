"""Re-queueing parked messages with care: a preview that changes nothing, --all only with --yes,
and every re-queue (the command's and the admin's action) in one log line with counts and message
ids, and in `profile_outbox_requeued_total{via}`."""

import json
import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse
from prometheus_client import REGISTRY

from outbox import metrics
from outbox.admin import REQUEUED
from tests.support.admin_data import staff_viewer
from tests.support.relay_support import BASE_TIME, Row, as_relay, insert_outbox, outbox_state

pytestmark = pytest.mark.django_db(transaction=True)


def _requeued_total(via: str) -> float:
    return REGISTRY.get_sample_value("profile_outbox_requeued_total", {"via": via}) or 0.0


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def logged() -> Iterator[list[logging.LogRecord]]:
    """The re-queue's log records."""
    handler = Records()
    logger = logging.getLogger("outbox.requeue")
    logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)


def _fields(record: logging.LogRecord) -> dict[str, object]:
    fields: dict[str, object] = record.fields  # type: ignore[attr-defined]
    return fields


def _call(*args: str) -> str:
    out = StringIO()
    with as_relay():
        call_command("requeue_outbox", *args, stdout=out)
    return out.getvalue()


def _parked(count: int, key: str | None = None) -> list[Row]:
    """`count` parked rows, the first parked longest ago."""
    return [insert_outbox(key or f"owner-{uuid.uuid4()}", created_at=BASE_TIME + timedelta(minutes=n),
                          parked_at=BASE_TIME + timedelta(hours=1, minutes=n), seq=n)
            for n in range(count)]


def _still_parked() -> set[uuid.UUID]:
    return {r["id"] for r in outbox_state() if r["parked_at"] is not None}


def test_a_dry_run_shows_what_would_go_back_and_changes_nothing(logged: list[logging.LogRecord]
                                                               ) -> None:
    rows = _parked(3)
    waiting = insert_outbox("owner-waiting", created_at=BASE_TIME)

    shown = _call("--all", "--dry-run")
    one = _call("--id", str(rows[1].id), "--id", str(waiting.id), "--dry-run")

    assert shown.startswith("would re-queue 3 message(s) of 3 key(s); nothing changed\n")
    assert f"  oldest: {rows[0].id} parked {(BASE_TIME + timedelta(hours=1)).isoformat()} " \
           f"(created {BASE_TIME.isoformat()})" in shown
    assert f"  keys: {', '.join(sorted(r.key for r in rows))}" in shown
    assert all(f"  {r.id} key {r.key} parked" in shown for r in rows)
    assert one.startswith("would re-queue 1 message(s) of 1 key(s)")
    assert f"not parked (would be refused, exit 1): {waiting.id}" in one
    assert _still_parked() == {r.id for r in rows}
    assert logged == []  # a preview re-queues nothing, so says nothing


def test_all_without_yes_does_nothing_and_says_so() -> None:
    rows = _parked(2)
    before = _requeued_total("command")

    with pytest.raises(CommandError) as refused:
        _call("--all")

    assert refused.value.returncode == 2
    assert str(refused.value) == ("--all re-queues every parked message (2 now) and needs --yes: "
                                  "nothing re-queued; see them with --all --dry-run")
    assert _still_parked() == {r.id for r in rows}
    assert _requeued_total("command") == before


def test_every_requeue_is_one_log_line_with_counts_and_ids_and_is_counted(
        logged: list[logging.LogRecord]) -> None:
    rows = _parked(3)
    stray = uuid.uuid4()
    before = _requeued_total("command")

    with pytest.raises(CommandError) as partly:
        _call("--id", str(rows[0].id), "--id", str(stray))
    assert partly.value.returncode == 1
    done = _call("--all", "--yes")

    assert done.startswith("re-queued 2 message(s)\n")
    assert _still_parked() == set()
    assert _requeued_total("command") == before + 3
    assert [r.getMessage() for r in logged] == [REQUEUED, REQUEUED]
    first, second = (_fields(r) for r in logged)
    assert first == {"via": "command", "selected": "ids", "requeued": 1, "ids": [str(rows[0].id)],
                     "not_parked": 1, "not_parked_ids": [str(stray)]}
    assert second == {"via": "command", "selected": "all", "requeued": 2,
                      "ids": sorted(str(r.id) for r in rows[1:]),
                      "not_parked": 0, "not_parked_ids": []}
    # Ids and counts only: never a payload or a key (the owner).
    line = json.dumps([_fields(r) for r in logged])
    assert not any(r.key in line for r in rows) and "payload" not in line


def test_the_admins_requeue_is_logged_and_counted_as_the_commands(
        client: Client, logged: list[logging.LogRecord]) -> None:
    [row] = _parked(1)
    operator = staff_viewer("operator")
    operator.user_permissions.add(Permission.objects.get(codename="requeue_outboxmessage"))
    client.force_login(operator)
    before = _requeued_total("admin")

    response = client.post(reverse("admin:outbox_outboxmessage_changelist"),
                           {"action": "requeue_parked", "_selected_action": [str(row.id)]})

    assert response.status_code == 302
    assert _still_parked() == set()
    assert _requeued_total("admin") == before + 1
    assert [(r.getMessage(), _fields(r)["via"], _fields(r)["ids"]) for r in logged] == [
        (REQUEUED, "admin", [str(row.id)])]


def test_the_counter_is_exported_from_install_at_zero_for_each_way() -> None:
    metrics.install_requeue_metrics()
    metrics.install_requeue_metrics()  # again: nothing
    names = {(s.name, s.labels.get("via")) for m in REGISTRY.collect() for s in m.samples
             if s.name == "profile_outbox_requeued_total"}
    assert names == {("profile_outbox_requeued_total", "command"),
                     ("profile_outbox_requeued_total", "admin")}
