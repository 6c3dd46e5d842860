"""outbox.producer.sort_reports with error-only delivery reports: a row without an error is
delivered only in a batch the producer acknowledged as a whole (docs/outbox-relay.md, "Why
nothing is recorded before its acknowledgement")."""

from confluent_kafka import KafkaError

from outbox.producer import sort_reports
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


# --- one partition's outage: deferred, told from the broker's by the batch itself -------------

TIMED_OUT = KafkaError(KafkaError._MSG_TIMED_OUT)
NO_REPLICAS = KafkaError(KafkaError.NOT_ENOUGH_REPLICAS)


def test_rows_their_partition_could_not_take_in_a_batch_the_cluster_took_are_deferred() -> None:
    errors = {"key-1": TIMED_OUT, "key-4": NO_REPLICAS}
    reports = sort_reports(ROWS, errors, acked_at=11.0, read_at=10.0, stop_at_unavailable=True)

    assert reports.delivered == [ROWS[1]]
    assert reports.deferred == [(ROWS[0], TIMED_OUT), (ROWS[3], NO_REPLICAS)]
    assert reports.detoured == [(ROWS[2], None)] and reports.refused == []
    assert reports.settled == 4 and reports.first_unavailable is None  # the position passes all


def test_a_batch_with_nothing_delivered_is_a_broker_outage_and_the_stream_stops_at_its_first_row(
) -> None:
    errors = {"key-1": TIMED_OUT, "key-2": TIMED_OUT, "key-4": NO_REPLICAS}
    stream = sort_reports(ROWS, errors, acked_at=11.0, read_at=10.0, stop_at_unavailable=True)

    assert stream.settled == 0 and stream.deferred == [] and stream.delivered == []
    assert stream.first_unavailable is TIMED_OUT


def test_the_slow_lane_defers_a_partitions_rows_even_when_nothing_of_its_batch_was_delivered(
) -> None:
    errors = {"key-1": TIMED_OUT, "key-2": TIMED_OUT, "key-4": NO_REPLICAS}
    slow = sort_reports(ROWS, errors, acked_at=11.0, read_at=10.0, stop_at_unavailable=False)

    assert [m for m, _error in slow.deferred] == [ROWS[0], ROWS[1], ROWS[3]]
    assert slow.unavailable == [] and slow.delivered == []


def test_a_batch_never_acknowledged_defers_nothing_even_with_partition_errors() -> None:
    errors = {"key-2": TIMED_OUT}
    stream = sort_reports(ROWS, errors, acked_at=None, read_at=10.0, stop_at_unavailable=True)
    slow = sort_reports(ROWS, errors, acked_at=None, read_at=10.0, stop_at_unavailable=False)

    assert stream.settled == 0 and stream.deferred == []
    assert slow.deferred == [] and slow.unavailable == [ROWS[0], ROWS[1], ROWS[3]]


def test_a_connection_or_producer_error_beside_delivered_rows_still_stops_the_stream() -> None:
    for error in (KafkaError(KafkaError._TRANSPORT), KafkaError(KafkaError._PURGE_INFLIGHT),
                  KafkaError(KafkaError._ALL_BROKERS_DOWN),
                  KafkaError(KafkaError._MSG_TIMED_OUT, fatal=True)):
        reports = sort_reports(ROWS, {"key-2": error}, acked_at=11.0, read_at=10.0,
                               stop_at_unavailable=True)
        assert reports.settled == 1 and reports.deferred == [], error
        assert reports.first_unavailable is error


def test_a_stream_batch_of_rows_the_metadata_kept_back_is_no_answer_and_stops_the_stream() -> None:
    """Every partition short of in-sync replicas: nothing is sent, nothing deferred (a batch
    kept back whole deferred its rows, and the stream detoured the backlog row by row)."""
    short = KafkaError(KafkaError.NOT_ENOUGH_REPLICAS, "not sent: the metadata shows 1 in-sync "
                                                       "replica(s), min.insync.replicas=2")
    rows = [row(1), row(3, held=True), row(4)]
    errors = {"key-1": short, "key-4": short}

    kept_back = sort_reports(rows, errors, acked_at=11.0, read_at=10.0, stop_at_unavailable=True,
                             unsent={"key-1", "key-4"})
    beside_one_delivered = sort_reports([*rows, row(5)], errors, acked_at=11.0, read_at=10.0,
                                        stop_at_unavailable=True, unsent={"key-1", "key-4"},
                                        unsent_open=True)  # row 5's partition was not kept back

    assert kept_back.settled == 0 and not kept_back.deferred and not kept_back.detoured
    assert kept_back.first_unavailable is short
    assert [m.key for m, _e in beside_one_delivered.deferred] == ["key-1", "key-4"]
    assert beside_one_delivered.settled == 4


def test_rows_kept_back_are_deferred_only_while_the_relay_sends_to_another_partition() -> None:
    """A row kept back alone in its batch (a stream nearly caught up reads one row at a time)
    is deferred while some partition of its topic is not kept back (`unsent_open`): it is its
    partition's trouble. With every partition kept back, the rows beside the probes that
    answered are read again, not deferred (the probes may have freed their partitions)."""
    slow = KafkaError(KafkaError._MSG_TIMED_OUT, "not sent: the partition waits on broker 2")
    alone = sort_reports([row(1)], {"key-1": slow}, acked_at=11.0, read_at=10.0,
                         stop_at_unavailable=True, unsent={"key-1"}, unsent_open=True)
    beside_probes = sort_reports([row(1), row(2)], {"key-2": slow}, acked_at=11.0, read_at=10.0,
                                 stop_at_unavailable=True, unsent={"key-2"}, unsent_open=False)

    assert [m.key for m, _e in alone.deferred] == ["key-1"] and alone.settled == 1
    assert [m.key for m in beside_probes.delivered] == ["key-1"]  # the probe
    assert not beside_probes.deferred and beside_probes.settled == 1


def test_a_row_kept_back_beside_sent_rows_of_which_none_was_delivered_stops_the_stream() -> None:
    no_leader = KafkaError(KafkaError.LEADER_NOT_AVAILABLE, "not sent: the metadata shows no leader")
    errors = {"key-1": no_leader, "key-2": KafkaError(KafkaError._MSG_TIMED_OUT)}

    reports = sort_reports([row(1), row(2)], errors, acked_at=11.0, read_at=10.0,
                           stop_at_unavailable=True, unsent={"key-1"})

    assert reports.settled == 0 and not reports.deferred


# --- a broker that died halfway through a batch is not one partition's outage ---------------


class Probe:
    """`cluster_answers` for sort_reports: answers `answer`, counts the questions."""

    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.answer


def test_rows_timed_out_beside_delivered_ones_are_deferred_only_if_the_cluster_answers_now(
) -> None:
    errors = {"key-2": TIMED_OUT, "key-4": TIMED_OUT}
    answers, silent = Probe(True), Probe(False)

    partition = sort_reports(ROWS, errors, acked_at=11.0, read_at=10.0,
                             stop_at_unavailable=True, cluster_answers=answers)
    broker = sort_reports(ROWS, errors, acked_at=11.0, read_at=10.0,
                          stop_at_unavailable=True, cluster_answers=silent)

    assert [m for m, _e in partition.deferred] == [ROWS[1], ROWS[3]] and partition.settled == 4
    # The broker died after taking row 1: the stream stops before row 2, nothing is deferred.
    assert broker.delivered == [ROWS[0]] and broker.deferred == [] and broker.settled == 1
    assert broker.first_unavailable is TIMED_OUT
    assert answers.asked == 1 and silent.asked == 1  # once a batch, however many rows


def test_a_brokers_own_answer_of_a_partition_error_needs_no_question() -> None:
    no_leader = KafkaError(KafkaError.LEADER_NOT_AVAILABLE)
    probe = Probe(False)
    reports = sort_reports(ROWS, {"key-2": NO_REPLICAS, "key-4": no_leader}, acked_at=11.0,
                           read_at=10.0, stop_at_unavailable=True, cluster_answers=probe)

    assert [m for m, _e in reports.deferred] == [ROWS[1], ROWS[3]]
    assert probe.asked == 0


def test_no_question_where_nothing_would_be_deferred() -> None:
    probe = Probe(True)
    sort_reports(ROWS, {}, acked_at=11.0, read_at=10.0, stop_at_unavailable=True,
                 cluster_answers=probe)  # all delivered
    sort_reports(ROWS, {"key-2": TIMED_OUT}, acked_at=None, read_at=10.0,
                 stop_at_unavailable=True, cluster_answers=probe)  # not acknowledged
    sort_reports(ROWS, {"key-1": TIMED_OUT, "key-2": TIMED_OUT, "key-4": TIMED_OUT},
                 acked_at=11.0, read_at=10.0, stop_at_unavailable=True,
                 cluster_answers=probe)  # nothing delivered
    slow = sort_reports(ROWS, {"key-2": TIMED_OUT}, acked_at=11.0, read_at=10.0,
                        stop_at_unavailable=False, cluster_answers=probe)

    assert probe.asked == 0
    assert [m for m, _e in slow.deferred] == [ROWS[1]]  # the slow lane defers whatever
