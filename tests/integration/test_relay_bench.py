"""A small run of the relay benchmark, so that it cannot rot (the numbers are not checked)."""

from bench.relay_bench import measure, table


def test_relay_benchmark_runs_end_to_end(transactional_db: None) -> None:
    results = measure(events=300, batch_sizes=[100])

    assert [r.name for r in results] == ["raw producer (from memory)",
                                         "relay (outbox -> acknowledged)",
                                         "database only (claim + mark)"]
    assert all(r.events == 300 and r.seconds > 0 for r in results)
    assert "events/s" in table(results)
