"""The stream's read size on real PostgreSQL (outbox.lanes): a backlog drains in growing
reads up to OUTBOX_BATCH_SIZE, and a stream that is caught up reads small again; the relay's
batches follow the reads, every row delivered once, in order."""

from django.db import connection

from bench.outbox_rows import bench_messages, load_outbox
from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import read_topic
from outbox import store
from outbox.config import MIN_READ_ROWS
from outbox.lanes import ReadSize, StreamReader
from outbox.relay import Relay
from tests.support.relay_support import TOPIC, as_relay, relay_settings


def drain(reader: StreamReader, after: store.Position) -> tuple[list[tuple[int, int]],
                                                                  store.Position]:
    """(rows asked, rows read) of each read after `after` until one comes back empty, each read
    after the one before as the relay's are; and the position after the last."""
    reads = []
    while True:
        asked = reader.size.rows
        read = reader.read(after).messages
        reads.append((asked, len(read)))
        if not read:
            return reads, after
        after = read[-1].position or after


def test_a_backlog_is_read_in_growing_reads_and_a_caught_up_stream_in_small_ones(
    transactional_db: None,
) -> None:
    load_outbox(bench_messages(3_000), TOPIC)
    reader = StreamReader("default", ReadSize.up_to(1_000))
    try:
        reads, after = drain(reader, store.read_position("default"))
        assert reads == [(100, 100), (200, 200), (400, 400), (800, 800), (1_000, 1_000),
                         (1_000, 500), (500, 0)]
        assert reader.size.rows == MIN_READ_ROWS

        # Nearly caught up: a trickle of a few rows a read keeps the reads at the floor.
        for trickle in range(3):
            load_outbox(bench_messages(30, topic_seed=trickle + 1), TOPIC)
            reads, after = drain(reader, after)
            assert reads == [(MIN_READ_ROWS, 30), (MIN_READ_ROWS, 0)]
    finally:
        reader.close()


def test_the_relay_drains_a_backlog_in_growing_batches_every_row_once_in_order(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    messages = bench_messages(2_500)
    load_outbox(messages, TOPIC)
    start = store.read_position("default")

    with as_relay():
        stats = Relay(relay_settings(kafka.bootstrap_servers, batch_size=800)).run_pass()

    assert stats.published == 2_500 and stats.failed == stats.released == 0
    with connection.cursor() as cursor:
        cursor.execute("select messages from outbox_relay_batches"
                       " where (upto_txid, upto_seq) > (%s::xid8, %s::bigint)"
                       " order by upto_txid, upto_seq", start)
        sizes = [size for (size,) in cursor.fetchall()]
    assert sizes == [100, 200, 400, 800, 800, 200]
    records = read_topic(kafka.bootstrap_servers)
    assert sorted(r.message_id for r in records) == sorted(str(m.id) for m in messages)
    assert len(records) == 2_500
    # In order: each partition holds its rows in the order they were written (one row a key
    # here, so this is the stream's order, which a key's events follow).
    written = {str(m.id): n for n, m in enumerate(messages)}
    for partition in {r.partition for r in records}:
        on_it = [written[r.message_id] for r in records if r.partition == partition]
        assert on_it == sorted(on_it), f"partition {partition} out of order"
