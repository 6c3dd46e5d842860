"""A small run of the relay benchmark, so that it cannot rot (the numbers are not checked)."""

from bench.harness import warm_up
from bench.relay_bench import DB_ONLY, RAW, RELAY, RELAY_RUN, measure, table
from bench.relay_config import BatchSpec
from bench.relay_latency import measure_latency
from devtools.mock_kafka import MockKafkaCluster


def test_relay_benchmark_runs_end_to_end(transactional_db: None) -> None:
    results = measure(events=[300], batch_size=100, relays=[1, 2])

    assert [(r.name, r.relays) for r in results] == [(RAW, None), (RELAY, 1), (RELAY, 2),
                                                     (DB_ONLY, None)]
    assert all(r.events == 300 and r.seconds > 0 for r in results)
    assert "events/s" in table(results)


def test_relay_benchmark_times_whole_passes_with_the_default_and_fixed_read_sizes(
    transactional_db: None,
) -> None:
    """`--pass`: a publish_outbox process per batch size, its start-up included, beside the
    in-process relay, each line saying its read sizes."""
    results = measure(events=[300], batches=[BatchSpec.parse("default"),
                                             BatchSpec.parse("100-fixed")],
                      relays=[1], whole_pass=True, db_floor=False)

    assert [(r.name, r.batch) for r in results] == [
        (RAW, "-"), (RELAY_RUN, "default"), (RELAY, "default"), (RELAY_RUN, "100 fixed"),
        (RELAY, "100 fixed")]
    passes = [r for r in results if r.name == RELAY_RUN]
    assert all(r.events == 300 and r.seconds > 0 and r.peak_rss_mb for r in passes)
    assert all(r.load_1m is not None for r in results)
    assert "publish_outbox pass" in table(results)


def test_relay_latency_benchmark_runs(transactional_db: None, kafka: MockKafkaCluster) -> None:
    """bench/relay_latency.py: a `publish_outbox --loop` process, rows written for a moment,
    every one's delay from insert to recorded delivery."""
    warm_up(kafka.bootstrap_servers, "bench.latency.smoke")
    result = measure_latency("trickle", BatchSpec(), kafka.bootstrap_servers,
                             "bench.latency.smoke", seconds=0.3, seed=7 << 32)

    assert result.events > 0 and result.batches > 0
    assert 0 < result.p50_ms <= result.p99_ms <= result.max_ms
