"""The run history is aged on the database's clock (docs/design.md §3.10). The commands run
with the worker's clock a day ahead of PostgreSQL's, a day behind it and two years ahead (Debian's
libfaketime; the database keeps the real clock), on runs the database dated that long ago, and
judge as a worker whose clock is right: the health check, the run-history prune, and the
closing of runs a killed process left `running`."""

import subprocess
import sys
import time
from datetime import timedelta

import pytest

from tests.support.faketime import skewed_env
from tests.support.processes import command_env, run_command
from tests.support.run_history import insert_run, run_states

SKEWS = {
    "a day ahead": timedelta(hours=26),
    "a day behind": -timedelta(hours=26),
    "two years ahead": timedelta(days=730),
}
AS_OF_ARG = "2026-11-29T03:00:00Z"  # the ledger's as-of: the worker's clock plays no part


@pytest.fixture(params=list(SKEWS.values()), ids=list(SKEWS))
def skew(request: pytest.FixtureRequest) -> timedelta:
    value: timedelta = request.param
    return value


def _on_skewed_clock(skew: timedelta, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_command(*args, env=skewed_env(command_env(**env), skew))


def test_the_commands_really_run_on_a_skewed_clock(skew: timedelta) -> None:
    done = subprocess.run([sys.executable, "-c", "import time; print(time.time())"],
                          env=skewed_env(command_env(), skew), capture_output=True, text=True,
                          timeout=60, check=True)
    assert abs(float(done.stdout) - (time.time() + skew.total_seconds())) < 60


@pytest.mark.parametrize(("runs", "healthy", "reason"), [
    ([(timedelta(hours=3), "succeeded", True)], True, "healthy: ok"),
    ([(timedelta(hours=30), "succeeded", True)], False, "no successful cycle for over"),
    ([(timedelta(hours=3), "succeeded", True), (timedelta(hours=1), "running", False)], False,
     "stuck"),
], ids=["success 3 h ago", "success 30 h ago", "running for 1 h"])
def test_health_check_ages_the_run_history_on_the_database_clock(
    transactional_db: None, skew: timedelta, runs: list[tuple[timedelta, str, bool]],
    healthy: bool, reason: str,
) -> None:
    for age, status, finished in runs:
        insert_run(age, status, finished)

    done = _on_skewed_clock(skew, "check_reminders_health")

    assert done.returncode == (0 if healthy else 1), done.stderr
    assert reason in (done.stdout if healthy else done.stderr)


def test_prune_command_ages_the_run_history_on_the_database_clock(
    transactional_db: None, skew: timedelta,
) -> None:
    old = {insert_run(timedelta(days=d), "succeeded") for d in (91, 200)}
    old.add(insert_run(timedelta(days=95), "running", finished=False))  # a crash long ago
    kept = {insert_run(timedelta(days=d), "succeeded") for d in (0, 1, 89)}

    dry = _on_skewed_clock(skew, "prune_reminders", "--dry-run")
    done = _on_skewed_clock(skew, "prune_reminders")

    assert dry.returncode == 0 and "would prune 3 run(s)" in dry.stdout, dry.stderr
    assert done.returncode == 0 and "pruned 3 run(s)" in done.stdout, done.stderr
    assert set(run_states()) == kept


def test_a_cycle_closes_abandoned_runs_and_prunes_on_the_database_clock(
    transactional_db: None, skew: timedelta,
) -> None:
    abandoned = insert_run(timedelta(hours=3), "running", finished=False)  # past 2 budgets, 1 h
    going = insert_run(timedelta(minutes=5), "running", finished=False)  # may still be going
    kept = insert_run(timedelta(days=89), "succeeded")
    pruned = insert_run(timedelta(days=91), "succeeded")

    done = _on_skewed_clock(skew, "run_expiry_reminders", "--as-of", AS_OF_ARG)

    assert done.returncode == 0, done.stderr
    states = run_states()
    assert (states[abandoned], states[going], states[kept]) == ("failed", "running", "succeeded")
    assert pruned not in states
    [this_run] = set(states) - {abandoned, going, kept}  # not pruned by its own cycle
    assert states[this_run] == "succeeded"
