"""The alert rules and their runbooks: promtool checks and unit-tests the rules; every alert
links an absolute runbook URL (rendered from a configurable base) and describes its value;
every rule names only metrics the code exports (scraped); and the runbooks quote what the
software really prints, with commands that really parse."""

import ast
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import get_commands, load_command_class
from django.db import connection

from core.db import apply_sql_file
from core.roles import RELAY_ROLE, ROLES_SQL, WORKER_ROLE
from devtools.mock_kafka import MockKafkaCluster
from tests.support.exported_metrics import exported_metric_names, promql_metric_names
from tests.support.processes import ROOT, command_env, manage_py

RULES = ROOT / "ops" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "ops" / "prometheus" / "alerts.test.yml"
RENDER = ROOT / "ops" / "prometheus" / "render_alerts.py"
RUNBOOKS = ROOT / "docs" / "runbooks"
OPERATOR_DOCS = [*sorted(RUNBOOKS.glob("*.md")), ROOT / "docs" / "operations.md"]
PLACEHOLDER_BASE = "https://runbooks.example.invalid/pin-profile/docs/runbooks"
SEED_ALERTS = {
    "DocumentExpiryReminderNoSuccessfulCycle", "DocumentExpiryReminderBacklogNotDraining",
    "DocumentExpiryReminderErrors", "OutboxBacklogHigh", "OutboxRelayLagging",
    "OutboxMessagesParked",
}
PRODUCT_SKIP = {".venv", "tests", "bench", "migrations", "ops", "docker"}
DEADLINE_S = 60.0

Rule = dict[str, Any]


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool is missing: scripts/test.sh installs Debian's prometheus package"
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True,
                          timeout=120, check=False, cwd=RULES.parent)


def rules(path: Path = RULES) -> list[Rule]:
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def alerts(path: Path = RULES) -> dict[str, Rule]:
    return {r["alert"]: r for r in rules(path) if "alert" in r}


def duration_s(text: str) -> int:
    """promtool's eval_time, e.g. `5h1m`, in seconds."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"(\d+)([dhms])", text)
    assert "".join(n + u for n, u in parts) == text, text
    return sum(int(n) * units[u] for n, u in parts)


def rule_test_evaluations(alert: str) -> list[list[tuple[int, bool]]]:
    """Per unit test of `alert`: its (eval time in seconds, firing?) in time order."""
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    found = []
    for test in tests:
        evals = [(duration_s(str(e["eval_time"])), bool(e["exp_alerts"]))
                 for e in test.get("alert_rule_test", []) if e["alertname"] == alert]
        if evals:
            found.append(sorted(evals))
    return found


# --- the rules ----------------------------------------------------------------------------


def test_rules_are_valid() -> None:
    checked = promtool("check", "rules", RULES)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 13 rules found" in checked.stdout


def test_rule_unit_tests_pass() -> None:
    tested = promtool("test", "rules", RULE_TESTS)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_is_unit_tested_both_ways() -> None:
    assert set(alerts()) >= SEED_ALERTS
    for alert in alerts():
        outcomes = {firing for test in rule_test_evaluations(alert) for _, firing in test}
        assert outcomes == {True, False}, f"{alert}: needs a test that it fires and one that it does not"


def test_errors_alert_outlasts_an_hour_without_a_fix_and_clears_on_a_clean_cycle() -> None:
    for evals in rule_test_evaluations("DocumentExpiryReminderErrors"):
        firing = [t for t, f in evals if f]
        if firing and any(t >= firing[0] + 2 * 3600 for t in firing) \
                and any(not f and t > firing[-1] for t, f in evals):
            return
    pytest.fail("no unit test where DocumentExpiryReminderErrors still fires 2 h after it "
                "started and then clears")


def test_every_alert_links_its_runbook_section_under_the_base() -> None:
    for name, rule in alerts().items():
        url = rule["annotations"]["runbook_url"]
        assert url.startswith(PLACEHOLDER_BASE + "/"), url
        page, _, anchor = url[len(PLACEHOLDER_BASE) + 1:].partition("#")
        assert anchor == name.lower(), url
        headings = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                    for h in re.findall(r"^#+ (.+)$", (RUNBOOKS / page).read_text(), re.MULTILINE)}
        assert anchor in headings, f"{page} has no section #{anchor}"


def test_every_alert_describes_its_value() -> None:
    for name, rule in alerts().items():
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        if not rule["expr"].strip().startswith("absent("):  # absent() is always 1
            assert "$value" in annotations["description"], name


def render(base: str, output: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RUNBOOK_BASE_URL"}
    return subprocess.run([sys.executable, str(RENDER), "--output", str(output)],
                          env={**env, "RUNBOOK_BASE_URL": base}, capture_output=True,
                          text=True, timeout=60, check=False)


def test_rendered_rules_link_runbooks_under_the_given_base(tmp_path: Path) -> None:
    base = "https://git.corp.test/pin/pin-profile/-/blob/v1.4/docs/runbooks"
    rendered = tmp_path / "pin-profile.yml"
    done = render(base + "/", rendered)
    assert done.returncode == 0, done.stderr
    checked = promtool("check", "rules", rendered)
    assert checked.returncode == 0 and "SUCCESS: 13 rules found" in checked.stdout, checked.stdout
    urls = [r["annotations"]["runbook_url"] for r in alerts(rendered).values()]
    assert len(urls) == len(alerts()) and all(u.startswith(base + "/docu") or
                                              u.startswith(base + "/outbox") for u in urls)
    header, _, body = rendered.read_text().partition("\n")
    assert header == f"# Rendered from alerts.yml by render_alerts.py with RUNBOOK_BASE_URL={base}"
    assert body.replace(base, PLACEHOLDER_BASE) == RULES.read_text()  # only the base changed


@pytest.mark.parametrize("base", ["", "docs/runbooks", "ftp://host/runbooks",
                                  "https://host/run books", "https://"])
def test_render_refuses_a_base_that_is_not_an_absolute_url(base: str, tmp_path: Path) -> None:
    done = render(base, tmp_path / "out.yml")
    assert done.returncode == 2 and done.stderr.startswith("RUNBOOK_BASE_URL: "), done.stderr
    assert not (tmp_path / "out.yml").exists()


@pytest.mark.slow
def test_rules_name_only_metrics_the_code_exports(
    transactional_db: None, kafka: MockKafkaCluster, tmp_path: Path
) -> None:
    exported = exported_metric_names(tmp_path, kafka.bootstrap_servers)
    recorded = {r["record"] for r in rules() if "record" in r}
    for rule in rules():
        named = promql_metric_names(rule["expr"])
        assert named, rule["expr"]
        assert named - recorded <= exported, f"{rule.get('alert') or rule['record']}: " \
            f"{named - recorded - exported} not exported"


def test_compose_prometheus_config_is_valid() -> None:
    checked = promtool("check", "config", RULES.parent / "prometheus.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr


# --- the runbooks -------------------------------------------------------------------------


def operator_docs() -> str:
    return "\n".join(p.read_text() for p in OPERATOR_DOCS)


def manage_py_commands(text: str) -> list[tuple[str, list[str]]]:
    """Every `manage.py NAME ARGS` the docs show, up to a pipe, comment or end of span."""
    found = []
    for name, rest in re.findall(r"manage\.py ([a-z_]+)([^`\n|#;)]*)", text):
        args = [a for a in shlex.split(rest.replace("[", "").replace("]", ""))
                if not re.match(r"^\d*>", a)]  # shell redirections
        found.append((name, args))
    return found


def test_every_manage_py_command_in_the_runbooks_exists_and_parses() -> None:
    commands = manage_py_commands(operator_docs())
    available = get_commands()
    for name, args in commands:
        assert name in available, f"manage.py {name}: no such command"
        if "--help" in args:
            continue  # argparse prints the help and exits
        command = load_command_class(available[name], name)
        command.create_parser("manage.py", name).parse_args(args)  # CommandError if not
    requeues = {tuple(a[:1]) for n, a in commands if n == "requeue_outbox"}
    assert requeues >= {(), ("--id",), ("--all",)}, "the re-queue commands, with their flags"


def product_string_literals() -> set[str]:
    literals: set[str] = set()
    for path in ROOT.rglob("*.py"):
        if PRODUCT_SKIP & set(path.relative_to(ROOT).parts):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                literals.add(node.value)
    return literals


def test_every_log_event_the_runbooks_quote_is_one_the_code_logs() -> None:
    events = set(re.findall(r'"event":"([^"]+)"', operator_docs())) - {"..."}
    assert len(events) >= 10
    assert events <= product_string_literals(), events - product_string_literals()


def grant_error_spans(text: str) -> list[str]:
    return [s for s in re.findall(r"`([^`\n]+)`", text)
            if "UndefinedTable" in s or "InsufficientPrivilege" in s]


def test_runbooks_name_missing_grants_by_the_errors_they_raise() -> None:
    text = operator_docs()
    for match in re.finditer(r"permission denied", text):
        start, end = text.rfind("`", 0, match.start()), text.find("`", match.end())
        assert "InsufficientPrivilege" in text[start:end], text[start - 80:end + 80]
    assert any("UndefinedTable" in s for s in grant_error_spans(text))


# What each grant scenario revokes (restored by roles.sql), and the commands run under it.
GRANT_SCENARIOS: dict[str, tuple[list[str], list[str]]] = {
    "never granted in this database": (
        [f"revoke usage on schema profile from {WORKER_ROLE}, {RELAY_ROLE}"],
        ["run", "health", "loop", "relay pass", "requeue list"]),
    "ledger and outbox grants missing": (
        [f"revoke all on profile.document_expiry_reminders from {WORKER_ROLE}",
         f"revoke all on profile.outbox_messages from {RELAY_ROLE}"],
        ["run", "loop", "relay pass", "requeue list"]),
    "run history grants missing": (
        [f"revoke all on profile.document_expiry_reminder_runs from {WORKER_ROLE}"],
        ["health"]),
}
COMMANDS = {
    "run": (WORKER_ROLE, ["run_expiry_reminders"], 4),
    "health": (WORKER_ROLE, ["check_reminders_health"], 4),
    "relay pass": (RELAY_ROLE, ["publish_outbox"], 4),
    "requeue list": (RELAY_ROLE, ["requeue_outbox"], 4),
}


def _readable(output: str) -> str:
    """Output as an operator reads it: JSON log lines by their event and error, one space."""
    lines = []
    for line in output.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            lines.append(line)
            continue
        lines.append(f"{record.get('event')} {record.get('error', '')}")
    return " ".join(" ".join(lines).split())


def _env(role: str) -> dict[str, str]:
    return command_env(role, KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:9", OUTBOX_DELIVERY_TIMEOUT="2s")


def _run_loop_until_it_retries(tmp_path: Path) -> str:
    log = tmp_path / "loop.log"
    with log.open("w") as stderr:
        process = subprocess.Popen([*manage_py(), "run_expiry_reminders", "--loop"],
                                   env=_env(WORKER_ROLE), stdout=subprocess.DEVNULL,
                                   stderr=stderr, text=True)
    try:
        end = time.monotonic() + DEADLINE_S
        while not re.search(r'"event":"[^"]+, retrying"', log.read_text()):
            assert process.poll() is None and time.monotonic() < end, log.read_text()
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    return log.read_text()


@pytest.fixture
def revoked() -> Iterator[list[str]]:
    """Revoke the given statements' grants; roles.sql gives everything back afterwards."""
    statements: list[str] = []
    yield statements
    apply_sql_file(ROLES_SQL)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", GRANT_SCENARIOS)
def test_runbooks_quote_what_missing_grants_really_print(
    scenario: str, transactional_db: None, revoked: list[str], tmp_path: Path
) -> None:
    statements, commands = GRANT_SCENARIOS[scenario]
    with connection.cursor() as cursor:
        for statement in statements:
            revoked.append(statement)
            cursor.execute(statement)
    outputs = []
    for command in commands:
        if command == "loop":
            outputs.append(_run_loop_until_it_retries(tmp_path))
            continue
        role, args, exit_code = COMMANDS[command]
        done = subprocess.run([*manage_py(), *args], env=_env(role), capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == exit_code, (command, done.stdout, done.stderr)
        outputs.append(done.stdout + done.stderr)
    printed = _readable("\n".join(outputs))
    quoted = [s for s in grant_error_spans(operator_docs())
              if " ".join(s.split()) in printed]
    assert quoted, f"the runbooks quote nothing of what {scenario} prints: {printed[:2000]}"
    _matched[scenario] = set(quoted)
    if len(_matched) == len(GRANT_SCENARIOS):
        unmatched = set(grant_error_spans(operator_docs())) - set().union(*_matched.values())
        assert not unmatched, f"quoted in the runbooks, printed by no scenario: {unmatched}"


_matched: dict[str, set[str]] = {}
