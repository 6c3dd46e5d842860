"""One relay pass as the action publish_outbox is a shell over (outbox.one_pass.publish_one_pass):
what the pass did, the backlog after it, and the failure it ends with (None: exit 0)."""

import threading
import uuid
from datetime import timedelta

from core.exit_codes import ExitCode
from devtools.mock_kafka import MockKafkaCluster
from outbox.one_pass import publish_one_pass
from tests.support.relay_support import BASE_TIME, as_relay, insert_outbox, relay_settings

NO_WAIT = timedelta(0)
STOOD_BY_BOUND = timedelta(minutes=5)


def test_a_pass_that_delivers_everything_ends_without_a_failure(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    for _ in range(3):
        insert_outbox(str(uuid.uuid4()), created_at=BASE_TIME)

    with as_relay():
        outcome = publish_one_pass(relay_settings(kafka.bootstrap_servers), stop=threading.Event(),
                                   held_bound=NO_WAIT, stood_by_bound=STOOD_BY_BOUND)

    assert (outcome.stats.published, outcome.stats.stood_by) == (3, False)
    assert (outcome.backlog.unpublished, outcome.backlog.parked) == (0, 0)
    assert outcome.failure is None


def test_a_pass_whose_broker_does_not_answer_ends_failed_with_its_rows_still_waiting(
    transactional_db: None,
) -> None:
    for _ in range(2):
        insert_outbox(str(uuid.uuid4()), created_at=BASE_TIME)
    settings = relay_settings("127.0.0.1:9", delivery_timeout=timedelta(milliseconds=300))

    with as_relay():
        outcome = publish_one_pass(settings, stop=threading.Event(), held_bound=NO_WAIT,
                                   stood_by_bound=STOOD_BY_BOUND)

    assert (outcome.stats.released, outcome.stats.broker_answered) == (2, False)
    assert outcome.backlog.unpublished == 2
    assert outcome.failure is not None and outcome.failure.code == ExitCode.FAILED
    assert outcome.failure.line.startswith("not everything was delivered: 2 released")


def test_a_pass_stopped_before_it_began_publishes_nothing_and_ends_without_a_failure(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    insert_outbox(str(uuid.uuid4()), created_at=BASE_TIME)
    stop = threading.Event()
    stop.set()

    with as_relay():
        outcome = publish_one_pass(relay_settings(kafka.bootstrap_servers), stop=stop,
                                   held_bound=NO_WAIT, stood_by_bound=STOOD_BY_BOUND)

    assert (outcome.stats.published, outcome.backlog.unpublished) == (0, 1)
    assert outcome.failure is None  # the rest waits for the next pass
