"""Security: the worker's role cannot read the encrypted payload or write the documents, while a
full cycle succeeds under it; a full run, at DEBUG, logs no number mask, payload or cipher
(not even in the error of a failing owner); and the relay shows neither its SASL password nor
its key password (not in --help, an error, or librdkafka's debug output)."""

import socket
import uuid
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from psycopg import errors

from core.roles import WORKER_ROLE
from devtools.demo_data import PersonDocument
from tests.acceptance.test_relay_process import relay_env, run_relay
from tests.support import chaos_report
from tests.support.chaos import Worker, iso
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import test_database_url
from tests.support.factories import Documents, insert_documents
from tests.support.invariants import check_invariants, documents_md5
from tests.support.ledger import day
from tests.support.reference import ReferenceLedger, documents_from_database
from tests.support.relay_support import BASE_TIME, insert_outbox, outbox_state
from tests.support.tansu_support import Certificates, TansuBroker, TlsFront, reserve_port

FORBIDDEN = [
    "select payload_cipher from profile.person_documents limit 1",
    "select * from profile.person_documents limit 1",
    "select count(payload_cipher) from profile.person_documents",
    "update profile.person_documents set type = type",
    "update profile.person_documents set number_mask = 'x' where false",
    "insert into profile.person_documents (id, owner_user_id, person_id, type, status,"
    " payload_cipher, created_at, updated_at) values (gen_random_uuid(), gen_random_uuid(),"
    " gen_random_uuid(), 'Visa', 'Active', '\\x00', now(), now())",
    "delete from profile.person_documents",
    "truncate profile.person_documents",
    # the payload it may read back (the claim compares a stored body: docs/design.md §2.6),
    # never the headers
    "select headers from profile.outbox_messages limit 1",
    "copy profile.person_documents to stdout",
]


def test_worker_role_cannot_read_the_cipher_or_write_documents_yet_a_cycle_succeeds(
    documents: Documents,
) -> None:
    docs = [documents(expires_at=day(d)) for d in (-3, 0, 5, 20)]
    before = documents_md5()
    refused = 0
    with psycopg.connect(test_database_url(WORKER_ROLE), autocommit=True) as conn:
        [(role,)] = conn.execute("select current_user").fetchall()
        assert role == WORKER_ROLE
        for sql in FORBIDDEN:
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(sql)
            refused += 1
        # What it may do: the open columns, for the rules.
        rows = conn.execute("select id, number_mask from profile.person_documents").fetchall()
        assert len(rows) == len(docs)

    worker = Worker.start("--as-of", iso(day(0)))
    code, _ = worker.finish()

    assert code == 0, worker.lines[-5:]
    model = ReferenceLedger()
    model.run(documents_from_database(), day(0), (30, 7, 1, 0))
    unchanged = documents_md5() == before
    chaos_report.record("security (least-privilege worker role)", statements_refused=refused,
                        cycle_exit_code=code, reminders=model.reminders(),
                        documents_unchanged=unchanged)
    check_invariants(documents_before=before, model=model)
    assert_outbox_matches_contract()


def test_a_full_run_at_debug_logs_no_mask_payload_or_cipher(documents: Documents) -> None:
    owners = [uuid.uuid4() for _ in range(30)]
    specs = [
        PersonDocument(id=uuid.uuid4(), owner_user_id=owners[i % 30], person_id=uuid.uuid4(),
                       type="Passport", number_mask=f"MASK{i:03d}-{uuid.uuid4().hex[:8]}",
                       expires_at=day(i % 40 - 5),
                       payload_cipher=f"PAYLOAD-SECRET-{uuid.uuid4().hex}".encode())
        for i in range(120)
    ]
    insert_documents(specs)
    failing_owner = owners[7]
    with connection.cursor() as cursor:  # a real per-owner failure, whose error gets logged
        cursor.execute(f"alter table outbox_messages add constraint chaos_refuse_one_owner"
                       f" check (aggregate_id <> '{failing_owner}')")
    try:
        worker = Worker.start("--as-of", iso(day(0)), LOG_LEVEL="DEBUG", LOG_FORMAT="json",
                              REMINDER_BATCH_SIZE="10")
        code, out = worker.finish()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("alter table outbox_messages drop constraint chaos_refuse_one_owner")

    assert code == 1, worker.lines[-5:]  # the refused owner failed, the rest went out
    assert worker.logged("owner failed") and worker.logged("reminder queued")
    assert worker.logged("batch selected")
    assert len(worker.events()) == len(worker.lines) - len(worker.plain_lines())
    everything = "\n".join(worker.lines) + out
    leaks = []
    checked = 0
    for spec in specs:
        assert spec.number_mask is not None
        secrets = [spec.number_mask, spec.payload_cipher.decode(), spec.payload_cipher.hex(),
                   "\\x" + spec.payload_cipher.hex()]
        leaks += [s for s in secrets if s in everything]
        checked += len(secrets)
    chaos_report.record("log audit (full run, DEBUG, one failing owner)",
                        log_lines=len(worker.lines), documents=len(specs),
                        secrets_checked=checked, leaks=len(leaks))
    assert leaks == []
    assert "payload_cipher" not in everything and "numberMask" not in everything
    assert_outbox_matches_contract()


def test_the_relay_never_shows_the_sasl_password_or_the_key_password(
    transactional_db: None, tmp_path: Path, certificates: Certificates
) -> None:
    """--help, bad configurations, and a run at DEBUG with librdkafka's own debug output on
    (debug=all) that a broker behind TLS refuses at SASL: neither secret appears anywhere."""
    insert_outbox(str(uuid.uuid4()), created_at=BASE_TIME)
    sasl_password = f"sasl-audit-{uuid.uuid4().hex}"
    key_password = certificates.key_password
    front_port = reserve_port()
    with TansuBroker(tmp_path / "tansu", advertised_port=front_port,
                     authentication=True).start() as broker:
        front = TlsFront(tmp_path, broker.port, certificates.server, certificates.server_key,
                         port=front_port)
        try:
            env = relay_env(
                broker.bootstrap_servers, LOG_LEVEL="DEBUG", KAFKA_SECURITY_PROTOCOL="SASL_SSL",
                KAFKA_SASL_MECHANISM="SCRAM-SHA-256", KAFKA_SASL_USERNAME="pin_outbox_relay",
                KAFKA_SASL_PASSWORD=sasl_password, KAFKA_SSL_CA_LOCATION=str(certificates.ca),
                KAFKA_SSL_CERTIFICATE_LOCATION=str(certificates.client),
                KAFKA_SSL_KEY_LOCATION=str(certificates.client_key),
                KAFKA_SSL_KEY_PASSWORD=key_password, KAFKA_PRODUCER_CONFIG='{"debug": "all"}')
            runs = {
                "refused at DEBUG, librdkafka debug=all": (run_relay(env), 4),
                "--help": (run_relay(env, "--help"), 0),
                "bad setting": (run_relay({**env, "KAFKA_SSL_ENDPOINT_IDENTIFICATION": "?"}), 2),
                "wrong key password": (run_relay({**env, "KAFKA_SSL_KEY_PASSWORD": key_password
                                                  + "-wrong"}), 2),
                "broken JSON holding the password": (run_relay({
                    **env, "KAFKA_PRODUCER_CONFIG": f'{{"sasl.password": "{sasl_password}"'}), 2),
                "guarded property holding the password": (run_relay({
                    **env, "KAFKA_PRODUCER_CONFIG": f'{{"sasl.password": "{sasl_password}"}}'}),
                    2),
            }
        finally:
            front.stop()

    for name, (done, code) in runs.items():
        assert done.returncode == code, (name, done.stderr[-2000:])
    everything = "\n".join(done.stdout + done.stderr for done, _ in runs.values())
    leaks = everything.count(sasl_password) + everything.count(key_password)
    assert leaks == 0
    refused = runs["refused at DEBUG, librdkafka debug=all"][0].stderr.splitlines()
    librdkafka_lines = [ln for ln in refused if '"logger":"outbox.kafka"' in ln]
    assert len(librdkafka_lines) > 50, "librdkafka's debug output was not on: a hollow audit"
    assert "KAFKA_SASL_" in runs["--help"][0].stdout  # named, never valued
    assert all(r["published_at"] is None and r["attempts"] == 0 for r in outbox_state())
    chaos_report.record("log audit (relay: SASL password, key password)", runs=len(runs),
                        log_lines=len(everything.splitlines()),
                        librdkafka_debug_lines=len(librdkafka_lines), leaks=leaks)


@pytest.mark.parametrize("environ", [
    {"KAFKA_SECURITY_PROTOCOL": "SSL",
     "KAFKA_PRODUCER_CONFIG": '{"enable.ssl.certificate.verification": "false"}'},
    {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_PRODUCER_CONFIG": '{"ssl.ca.pem": "---"}'},
    {"KAFKA_SECURITY_PROTOCOL": "SSL",
     "KAFKA_PRODUCER_CONFIG": '{"ssl.keystore.location": "/tmp/k.p12"}'},
    {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
     "KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": "p",
     "KAFKA_PRODUCER_CONFIG": '{"sasl.oauthbearer.method": "oidc"}'},
    {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_MECHANISM": "PLAIN",
     "KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": "p"},
], ids=["verification-off", "ssl.ca.pem", "ssl.keystore", "sasl.oauthbearer", "plain-cleartext"])
def test_kafka_s_tls_cannot_be_switched_off_exit_2_before_any_connection(
    transactional_db: None, environ: dict[str, str],
) -> None:
    """A would-be broker listening where the relay is pointed: it never sees a connection."""
    with socket.socket() as broker:
        broker.bind(("127.0.0.1", 0))
        broker.listen(8)
        broker.setblocking(False)
        done = run_relay(relay_env(f"127.0.0.1:{broker.getsockname()[1]}", **environ))
        with pytest.raises(BlockingIOError):
            broker.accept()
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "KAFKA_PRODUCER_CONFIG" in last or "KAFKA_SASL_MECHANISM" in last, last
    assert outbox_state() == []
