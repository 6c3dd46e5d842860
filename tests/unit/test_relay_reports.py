"""outbox.reports.sort_reports with error-only delivery reports: a row without an error is
delivered only in a batch the producer acknowledged as a whole (docs/outbox-relay.md, "Why
nothing is recorded before its acknowledgement")."""

from confluent_kafka import KafkaError

from outbox.reports import sort_reports
from outbox.store import ReadMessage

CLOCK_S = 1_800_000_000.0  # the database's clock at the read


def row(n: int, *, held: bool = False, age_s: float = 2.0) -> ReadMessage:
    created_ms = int((CLOCK_S - age_s) * 1000)
    return ReadMessage(str(n), n, f"id-{n}", "topic", f"key-{n}", "{}", "{}", created_ms,
                       CLOCK_S, held, 0)


ROWS = [row(1), row(2), row(3, held=True), row(4)]
UNAVAILABLE = KafkaError(KafkaError._TRANSPORT)
REFUSED = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)


def test_an_acknowledged_batch_without_errors_is_delivered_with_one_latency_per_created_at(
) -> None:
    rows = [row(1, age_s=2.0), row(2, age_s=2.0), row(3, age_s=5.0)]
    reports = sort_reports(rows, {}, acked_at=10.5, read_at=10.0, stop_at_unavailable=True)

    assert reports.delivered == rows and reports.settled == 3
    assert not reports.detoured and not reports.unavailable
    assert sorted(reports.latencies) == [(2.5, 2), (5.5, 1)]


def test_a_batch_never_acknowledged_delivers_nothing_it_has_no_error_for() -> None:
    stream = sort_reports(ROWS, {}, acked_at=None, read_at=10.0, stop_at_unavailable=True)
    slow = sort_reports(ROWS, {}, acked_at=None, read_at=10.0, stop_at_unavailable=False)

    assert stream.delivered == [] and stream.settled == 0  # the position stays where it was
    assert slow.delivered == [] and slow.unavailable == [ROWS[0], ROWS[1], ROWS[3]]
    assert [m for m, _error in slow.detoured] == [ROWS[2]]  # held: never sent
    assert stream.latencies == [] and slow.latencies == []


def test_errors_reported_in_an_acknowledged_batch_are_refused_or_unavailable_by_their_kind(
) -> None:
    errors = {"key-2": REFUSED, "key-4": UNAVAILABLE}
    reports = sort_reports(ROWS, errors, acked_at=11.0, read_at=10.0, stop_at_unavailable=True)

    assert reports.delivered == [ROWS[0]]
    assert reports.detoured == [(ROWS[1], REFUSED), (ROWS[2], None)]
    assert reports.settled == 3 and reports.first_unavailable is UNAVAILABLE
    assert reports.latencies == [(3.0, 1)]
