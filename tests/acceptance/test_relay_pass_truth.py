"""A one-shot pass tells the truth: it exits 1, in one line that names the cause, when rows
wait behind a transaction left open on the database server past its bound, when the broker
does not answer, or when the broker refuses it, even with nothing to send."""

import uuid

import psycopg
import pytest

from devtools.mock_kafka import MockKafkaCluster
from tests.acceptance.test_kafka_security import assert_refused_in_one_line, tls_env
from tests.acceptance.test_relay_process import relay_env, run_relay
from tests.support.db_roles import test_database_url
from tests.support.relay_support import BASE_TIME, insert_outbox, unpublished_count
from tests.support.tansu_support import Certificates, TansuBroker

pytestmark = pytest.mark.slow


def test_rows_held_back_by_an_open_transaction_past_the_bound_exit_1_naming_the_cause(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    insert_outbox(str(uuid.uuid4()), created_at=BASE_TIME)
    with psycopg.connect(test_database_url()) as holder:
        holder.execute("select pg_current_xact_id()")  # an id taken, the transaction left open
        insert_outbox(str(uuid.uuid4()), created_at=BASE_TIME)  # committed after it: held

        done = run_relay(relay_env(kafka.bootstrap_servers), "--held-bound", "1s")

        assert done.returncode == 1, done.stderr
        assert done.stdout.startswith("Relay pass: 1 published")
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("CommandError: 1 message(s) still unpublished: the stream is held"
                               " back by a transaction open on the database server"), last
        holder.rollback()
    assert unpublished_count() == 1
    after = run_relay(relay_env(kafka.bootstrap_servers), "--held-bound", "1s")
    assert after.returncode == 0, after.stderr
    assert unpublished_count() == 0


def test_a_broker_that_does_not_answer_fails_the_pass_even_with_nothing_to_send(
    transactional_db: None,
) -> None:
    done = run_relay(relay_env("127.0.0.1:9", OUTBOX_DELIVERY_TIMEOUT="1s"))

    assert done.returncode == 3, done.stderr
    assert done.stdout.startswith("Relay pass: 0 published")
    assert done.stderr.strip().splitlines()[-1].startswith(
        "CommandError: the broker did not answer within OUTBOX_DELIVERY_TIMEOUT (1s)")


def test_a_broker_that_refuses_the_relay_fails_the_pass_even_with_nothing_to_send(
    transactional_db: None, tansu_tls: TansuBroker, certificates: Certificates
) -> None:
    env = tls_env(tansu_tls.bootstrap_servers, certificates,
                  KAFKA_SSL_CA_LOCATION=str(certificates.other_ca))
    assert unpublished_count() == 0  # nothing to send

    done = run_relay(env)

    assert done.returncode == 4, done.stderr
    assert_refused_in_one_line(done.stderr, expect="certificate verify failed")
    assert done.stdout == "", "a refused relay reported a pass as if it had run"
