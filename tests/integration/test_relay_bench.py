"""A small run of the relay benchmark, so that it cannot rot (the numbers are not checked)."""

from bench.relay_bench import DB_ONLY, RAW, RELAY, measure, table


def test_relay_benchmark_runs_end_to_end(transactional_db: None) -> None:
    results = measure(events=[300], batch_size=100, relays=[1, 2])

    assert [(r.name, r.relays) for r in results] == [(RAW, None), (RELAY, 1), (RELAY, 2),
                                                     (DB_ONLY, None)]
    assert all(r.events == 300 and r.seconds > 0 for r in results)
    assert "events/s" in table(results)
