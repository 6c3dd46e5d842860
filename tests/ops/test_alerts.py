"""The alert rules and the dashboard: promtool checks and unit-tests the rules, and every
metric they name is one the worker or the relay exports."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.metrics import MetricWrapperBase

from outbox import metrics as outbox_metrics
from reminders import metrics
from tests.conftest import ROOT

RULES = ROOT / "ops" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "ops" / "prometheus" / "alerts.test.yml"
DASHBOARD = ROOT / "ops" / "grafana" / "document-expiry-reminders.json"
SEED_ALERTS = {
    "DocumentExpiryReminderNoSuccessfulCycle", "DocumentExpiryReminderBacklogNotDraining",
    "DocumentExpiryReminderErrors", "OutboxBacklogHigh", "OutboxRelayLagging",
    "OutboxMessagesParked",
}


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool is missing: scripts/test.sh installs Debian's prometheus package"
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True,
                          timeout=120, check=False, cwd=RULES.parent)


def test_rules_are_valid() -> None:
    checked = promtool("check", "rules", RULES)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 7 rules found" in checked.stdout


def test_rule_unit_tests_pass() -> None:
    tested = promtool("test", "rules", RULE_TESTS)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_is_unit_tested_both_ways() -> None:
    rules = RULES.read_text()
    tests = RULE_TESTS.read_text()
    alerts = set(re.findall(r"^\s+- alert: (\w+)$", rules, re.MULTILINE))
    assert alerts >= SEED_ALERTS
    for alert in alerts:
        blocks = re.findall(rf"alertname: {alert}\n\s+exp_alerts:(.*)", tests)
        assert any(b.strip() == "[]" for b in blocks), f"{alert}: no test that it stays quiet"
        assert any(b.strip() == "" for b in blocks), f"{alert}: no test that it fires"


def test_every_alert_has_a_runbook_section() -> None:
    for anchor in set(re.findall(r"runbook: (docs/runbooks/[\w.-]+\.md)#(\w+)", RULES.read_text())):
        page = (ROOT / anchor[0]).read_text()
        headings = {re.sub(r"[^a-z0-9]", "", h.lower())
                    for h in re.findall(r"^#+ (.+)$", page, re.MULTILINE)}
        assert anchor[1] in headings, f"{anchor[0]} has no section #{anchor[1]}"


def _exported_names() -> set[str]:
    collectors: list[MetricWrapperBase] = [
        metrics.REMINDERS_TOTAL, metrics.CYCLE_DURATION, metrics.ERRORS_TOTAL,
        metrics.CYCLES_TOTAL, metrics.LAST_SUCCESS, outbox_metrics.PUBLISHED_TOTAL,
        outbox_metrics.FAILED_TOTAL, outbox_metrics.PARKED_TOTAL,
    ]
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    names = {metrics.BACKLOG, *outbox_metrics.GAUGES}
    for collector in collectors:
        for family in collector.describe():
            names.update(family.name + s for s in suffixes[family.type])
    return names


def _named(text: str) -> set[str]:
    return set(re.findall(r"\b(profile_[a-z_]+)", text))


@pytest.mark.parametrize("path", [RULES, DASHBOARD], ids=["rules", "dashboard"])
def test_rules_and_dashboard_name_only_exported_metrics(path: Path) -> None:
    named = _named(path.read_text())
    assert named and named <= _exported_names(), named - _exported_names()


def test_dashboard_shows_what_the_issue_lists() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in ("profile_document_expiry_reminders_total",
                   "profile_document_expiry_reminder_cycle_duration_seconds_bucket",
                   "profile_document_expiry_reminder_backlog",
                   "profile_document_expiry_reminder_errors_total",
                   "profile_outbox_unpublished_messages",
                   "profile_outbox_oldest_unpublished_age_seconds"):
        assert metric in exprs
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_compose_prometheus_config_is_valid() -> None:
    checked = promtool("check", "config", RULES.parent / "prometheus.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
