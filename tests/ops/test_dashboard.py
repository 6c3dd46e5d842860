"""The Grafana dashboard: every panel has a unit and explicit thresholds, no panel mixes
per-second rates with other units, the stat colours match the alerts, every query parses
(promtool) and names only metrics that the worker or the relay really export (scraped)."""

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.mock_kafka import MockKafkaCluster
from tests.support.exported_metrics import exported_metric_names, promql_metric_names
from tests.support.processes import ROOT

DASHBOARD = ROOT / "ops" / "grafana" / "document-expiry-reminders.json"
RULES = ROOT / "ops" / "prometheus" / "alerts.yml"
GRID_COLUMNS = 24
RATE_UNITS = {"mps", "ops", "reqps", "cps", "eps"}
TIME_UNITS = {"s", "ms", "dtdurations"}
COUNT_UNITS = {"short", "none"}
SIZE_UNITS = {"bytes"}
_AGGREGATION = re.compile(r"^(?:sum|max|min|avg|count)\s*(?:(?:by|without)\s*\([^)]*\))?\s*\(")

Panel = dict[str, Any]


def panels() -> list[Panel]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return list(dashboard["panels"])


def exprs(panel: Panel) -> list[str]:
    return [str(t["expr"]) for t in panel["targets"]]


def alert_rules() -> dict[str, str]:
    """{alert name: expr} of the shipped rules."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"] if "alert" in r}


def _top_level_division(expr: str) -> bool:
    depth = 0
    for char in expr:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "/" and depth == 0:
            return True
    return False


def per_second(expr: str) -> bool:
    """True when the expression's result is a per-second rate (not a ratio of two rates,
    not a quantile of one)."""
    expr = expr.strip()
    if _top_level_division(expr):
        return False
    while match := _AGGREGATION.match(expr):
        expr = expr[match.end():].strip()
    return expr.startswith(("rate(", "irate(", "deriv("))


def test_the_helpers_see_what_they_should() -> None:
    assert promql_metric_names(
        'histogram_quantile(0.95, sum by (le) (rate(a_bucket{job="x"}[1d]))) / on() '
        "max(b offset 5m) > 26 * 3600 and min_over_time(max(c)[25h:5m]) or vector(0)"
    ) == {"a_bucket", "b", "c"}
    assert per_second("sum(rate(x_total[5m]))")
    assert not per_second("sum(rate(x_sum[1d])) / sum(rate(x_count[1d]))")
    assert not per_second("histogram_quantile(0.95, sum by (le) (rate(x_bucket[1d])))")
    assert not per_second("sum by (status) (increase(x_total[1d]))")


@pytest.mark.parametrize("panel", panels(), ids=lambda p: f"{p['id']}-{p['title']}")
def test_every_panel_has_one_unit_and_explicit_thresholds(panel: Panel) -> None:
    defaults = panel["fieldConfig"]["defaults"]
    assert defaults.get("unit") in RATE_UNITS | TIME_UNITS | COUNT_UNITS | SIZE_UNITS
    for override in panel["fieldConfig"].get("overrides", []):
        assert all(p["id"] != "unit" for p in override["properties"]), "one unit per panel"
    thresholds = defaults["thresholds"]
    steps = thresholds["steps"]
    assert thresholds["mode"] == "absolute" and steps and all(s["color"] for s in steps)
    assert steps[0]["value"] is None, "the base step (below the first threshold) comes first"
    values = [s["value"] for s in steps[1:]]
    assert values == sorted(set(values)), "thresholds ascend"
    if panel["type"] == "stat":
        assert defaults["color"]["mode"] == "thresholds"
        assert steps[0]["color"] == "green", "a stat is green while nothing is wrong"


@pytest.mark.parametrize("panel", panels(), ids=lambda p: f"{p['id']}-{p['title']}")
def test_no_panel_mixes_rates_with_other_units(panel: Panel) -> None:
    rates = {per_second(e) for e in exprs(panel)}
    unit = panel["fieldConfig"]["defaults"]["unit"]
    assert rates == {unit in RATE_UNITS}, f"{unit}: {exprs(panel)}"


def _alert_limit(expr: str) -> float:
    match = re.search(r">\s*(\d+(?:\s*\*\s*\d+)*)\s*$", expr.strip())
    assert match, f"no '> N' at the end of {expr!r}"
    limit = 1.0
    for factor in match[1].split("*"):
        limit *= float(factor)
    return limit


def test_stat_colours_turn_red_where_their_alert_fires() -> None:
    alerts = alert_rules()
    linked = 0
    for panel in panels():
        named = re.search(r"Red = alert (\w+)\.", panel.get("description", ""))
        if panel["type"] != "stat" or not named:
            continue
        limit = _alert_limit(alerts[named[1]])
        steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        red = [s["value"] for s in steps if s["color"] == "red"]
        # An alert on "> N" fires from N (a duration) or N + 1 (a count): red starts there.
        assert len(red) == 1 and limit <= red[0] <= limit + 1, (panel["title"], red, limit)
        assert all(s["value"] is None or s["value"] < red[0] for s in steps if s["color"] != "red")
        linked += 1
    assert linked == 5


def test_time_since_the_last_success_is_green_below_25h_and_red_from_26h() -> None:
    panel = next(p for p in panels() if p["title"] == "Time since the last successful cycle")
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [(s["color"], s["value"]) for s in steps] == [
        ("green", None), ("orange", 25 * 3600), ("red", 26 * 3600)]
    assert _alert_limit(alert_rules()["DocumentExpiryReminderNoSuccessfulCycle"]) == 26 * 3600


def test_panels_are_laid_out_on_the_grid_without_overlap() -> None:
    cells: dict[tuple[int, int], int] = {}
    for panel in panels():
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= GRID_COLUMNS, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, (panel["id"], cells.get((x, y)))
                cells[(x, y)] = panel["id"]
    assert len({p["id"] for p in panels()}) == len(panels())


def test_every_query_parses(tmp_path: Path) -> None:
    binary = shutil.which("promtool")
    assert binary, "promtool is missing: scripts/test.sh installs Debian's prometheus package"
    rules = [{"record": f"dashboard:panel_{p['id']}_{t['refId']}", "expr": t["expr"]}
             for p in panels() for t in p["targets"]]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run([binary, "check", "rules", str(path)], capture_output=True,
                             text=True, timeout=120, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout


def test_dashboard_shows_what_the_issue_lists() -> None:
    named = set().union(*(promql_metric_names(e) for p in panels() for e in exprs(p)))
    assert named >= {
        "profile_document_expiry_reminders_total",
        "profile_document_expiry_reminder_cycle_duration_seconds_bucket",
        "profile_document_expiry_reminder_backlog",
        "profile_document_expiry_reminder_errors_total",
        "profile_document_expiry_reminder_last_success_timestamp_seconds",
        "profile_outbox_unpublished_messages",
        "profile_outbox_oldest_unpublished_age_seconds",
        "profile_outbox_parked_messages",
        # the relay's own
        "profile_outbox_broker_connected",
        "profile_outbox_delivery_latency_seconds_bucket",
        "profile_outbox_broker_rtt_seconds",
        "profile_outbox_producer_queue_messages",
        "profile_outbox_producer_queue_bytes",
    }


@pytest.mark.slow
def test_every_query_names_only_metrics_the_code_exports(
    transactional_db: None, kafka: MockKafkaCluster, tmp_path: Path
) -> None:
    exported = exported_metric_names(tmp_path, kafka.bootstrap_servers)
    assert "profile_document_expiry_reminder_cycle_duration_seconds_bucket" in exported
    assert "profile_outbox_broker_rtt_seconds" in exported  # labelled: its family, no sample yet
    for panel in panels():
        for expr in exprs(panel):
            named = promql_metric_names(expr)
            assert named, expr
            assert named <= exported, f"panel {panel['title']!r}: {named - exported} not exported"
