"""A small run of the benchmark (bench/bench_reminders.py), so that it cannot rot: it builds
its data set, runs every phase, the worker's cold cycle equals the floor, and the pipeline
(cycle, then relay to a mock cluster) puts every event on the topic. No timings are
asserted: speed is the benchmark's business, not the tests'."""

import uuid

import pytest
from django.db import connection

from bench.bench_reminders import (
    BenchConfig,
    BenchResult,
    drop_database,
    format_table,
    run_benchmark,
)
from bench.cycle_phases import Phase

SMOKE_DOCUMENTS = 5_000


def _server_url() -> str:
    """The test run's server (its own cluster with TEST_OWN_CLUSTER=1 or under xdist: the tests
    below use django_db_modify_db_settings, which points the settings at it)."""
    settings = connection.settings_dict
    return (f"postgres://{settings['USER']}@{settings['HOST'] or '127.0.0.1'}:"
            f"{settings['PORT'] or 5432}")


@pytest.mark.slow
@pytest.mark.usefixtures("django_db_modify_db_settings")
@pytest.mark.parametrize("shape", ["backlog", "steady"])
def test_benchmark_runs_and_the_worker_equals_the_floor(shape: str) -> None:
    # Unique: two sessions on one test database (or a rerun after a crash) never share it; the
    # suffix is kept whole within PostgreSQL's 63-byte names.
    suffix = f"_smoke_{shape}_{uuid.uuid4().hex[:12]}"
    database = connection.settings_dict["NAME"][:63 - len(suffix)] + suffix
    # backlog: the floor and the cold cycle twice, alternated (--pairs 2)
    config = BenchConfig(shape=shape, documents=SMOKE_DOCUMENTS, server_url=_server_url(),
                         database=database, pairs=2 if shape == "backlog" else 1)
    try:
        result = run_benchmark(config, log=lambda _line: None)
    finally:
        drop_database(config)

    assert result is not None
    phases = {p.name.split(" (")[0]: p for p in result.phases}
    check_the_worker_equals_the_floor(result, phases)
    check_the_pipeline(phases)
    if shape == "backlog":
        check_the_pairs_alternate(result, phases)
    else:
        cold = phases["cold cycle"]
        assert cold.window_documents and cold.window_documents < SMOKE_DOCUMENTS / 10


def check_the_worker_equals_the_floor(result: BenchResult, phases: dict[str, Phase]) -> None:
    """The cold cycle wrote what the floor wrote; the warm cycle nothing; the next day more."""
    assert result.floor_check["markers_differing"] == 0, result.floor_check
    assert result.floor_check["events_differing"] == 0, result.floor_check
    assert result.worker_equals_floor
    floor, cold, warm, next_day = (phases[n] for n in ("floor", "cold cycle", "warm cycle",
                                                         "next day"))
    assert cold.status == "succeeded" and cold.markers == floor.markers
    # the floor carries the re-arm rule: both replace the same stale markers
    assert cold.markers_rearmed == floor.markers_rearmed and cold.markers_rearmed
    assert cold.markers and cold.events == floor.events and cold.events
    assert cold.due_documents == floor.due_documents == cold.window_documents
    assert (warm.status, warm.due_documents, warm.markers, warm.events) == ("succeeded", 0, 0, 0)
    assert next_day.status == "succeeded" and next_day.markers
    assert cold.peak_rss_mb and cold.peak_rss_mb > 0
    assert cold.candidate_index is not None and cold.plan


def check_the_pipeline(phases: dict[str, Phase]) -> None:
    """The pipeline (cycle, then relay) put every event the cold cycle wrote on the topic."""
    cold = phases["cold cycle"]
    cycle, relay, whole = (phases[f"pipeline: {n}"] for n in ("cycle", "relay", "end to end"))
    assert cycle.events == cold.events and relay.status == "succeeded", relay.status
    assert relay.events == relay.events_on_topic == whole.events_on_topic == cold.events
    assert whole.status == "succeeded" and whole.events_per_second


def check_the_pairs_alternate(result: BenchResult, phases: dict[str, Phase]) -> None:
    """backlog: the floor and the cold cycle twice, alternated; the second pair the same."""
    cold = phases["cold cycle"]
    again, floor_again = phases["cold cycle, pair 2"], phases["floor, pair 2"]
    assert [p.name for p in result.phases if p.name.startswith(("floor", "cold"))] == [
        "floor (1 SQL statement)", "cold cycle", "floor, pair 2 (1 SQL statement)",
        "cold cycle, pair 2"], "the pairs alternate"
    assert again.status == "succeeded" and again.ratio_to_floor
    assert (again.markers, again.events) == (floor_again.markers, floor_again.events) == (
        cold.markers, cold.events)
    assert "pair by pair" in format_table(result)
    assert cold.window_documents == SMOKE_DOCUMENTS
    assert phases["prune"].markers

@pytest.mark.slow
@pytest.mark.usefixtures("django_db_modify_db_settings")
def test_benchmark_stale_statistics_phase_runs_and_equals_the_floor() -> None:
    suffix = f"_smoke_stale_{uuid.uuid4().hex[:12]}"
    database = connection.settings_dict["NAME"][:63 - len(suffix)] + suffix
    config = BenchConfig(shape="backlog", documents=SMOKE_DOCUMENTS, server_url=_server_url(),
                         database=database, documents_per_owner=1, stale_statistics=True,
                         pipeline=False)
    try:
        result = run_benchmark(config, log=lambda _line: None)
    finally:
        drop_database(config)

    assert result is not None
    assert result.worker_equals_floor, result.floor_check
    phases = {p.name.split(" (")[0]: p for p in result.phases}
    stale, floor, cold = (phases[n] for n in ("stale statistics: cold", "floor", "cold cycle"))
    assert result.floor_check["stale_markers_differing"] == 0, result.floor_check
    assert result.floor_check["stale_events_differing"] == 0, result.floor_check
    assert stale.status == "succeeded" and stale.markers == floor.markers == cold.markers
    # one document an owner: an event each
    assert stale.events == cold.events == SMOKE_DOCUMENTS
    assert stale.ratio_to_analyzed and stale.ratio_to_floor
