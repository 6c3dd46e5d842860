"""deploy/kubernetes rendered by kustomize (scripts/kustomize.sh) and checked: every object
against the schemas of a Kubernetes release (kubernetes-validate, strict: an unknown field is
an error), the custom resources (ServiceMonitor, PrometheusRule) by their structure and
promtool, the PrometheusRule against the rules it is generated from, every pod against the
security policy, and every probe path, port, command and environment variable against what
the code serves and reads (docs/operations.md, "Deploy on Kubernetes")."""

import ast
import copy
import inspect
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gunicorn.config
import kubernetes_validate
import pytest
import yaml
from django.core.management import get_commands, load_command_class

from core.exit_codes import ExitCode
from core.health import Verdict
from core.ops_server import OpsServer, Probes, parse_listen_addr
from outbox.config import RelaySettings
from tests.support.processes import ROOT

KUBERNETES = ROOT / "deploy" / "kubernetes"
BASE, OVERLAY = KUBERNETES / "base", KUBERNETES / "overlays" / "example"
PROMETHEUS_RULE = BASE / "prometheusrule.yaml"
ALERTS = ROOT / "ops" / "prometheus" / "alerts.yml"
RENDER = ROOT / "ops" / "prometheus" / "render_alerts.py"
PLACEHOLDER_BASE = "https://runbooks.example.invalid/pin-profile/docs/runbooks"
# The Kubernetes release whose schemas the objects must meet: the newest kubernetes-validate has.
KUBERNETES_VERSION = "1.37.0"
PRODUCT = ("core", "reminders", "outbox", "audit", "pin_profile")
APP_UID = 10001
# Each long-running process: the command it runs (after the image's `python manage.py`).
PROCESSES = {"worker": "run_expiry_reminders", "relay": "publish_outbox", "admin": "gunicorn",
             "audit": "audit_reminders"}

Object = dict[str, Any]


def kustomize() -> str:
    binary = os.environ.get("KUSTOMIZE") or shutil.which("kustomize")
    assert binary, "kustomize is missing: scripts/test-env.sh builds it (scripts/kustomize.sh)"
    return binary


def render(directory: Path) -> list[Object]:
    done = subprocess.run([kustomize(), "build", str(directory)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [o for o in yaml.safe_load_all(done.stdout) if o]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Object]]:
    return {"base": render(BASE), "overlay": render(OVERLAY)}


@pytest.fixture(scope="module")
def overlay(rendered: dict[str, list[Object]]) -> list[Object]:
    return rendered["overlay"]


def of_kind(objects: list[Object], kind: str) -> dict[str, Object]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_specs(objects: list[Object]) -> Iterator[tuple[str, Object]]:
    """(component, pod spec) of every Deployment and Job."""
    for o in objects:
        if o["kind"] in ("Deployment", "Job"):
            yield o["metadata"]["labels"]["app.kubernetes.io/component"], o["spec"]["template"]["spec"]


# What the code reads and serves, derived from the code itself.

def variables_the_code_names() -> set[str]:
    """Every string constant of the product's modules shaped like an environment variable."""
    shaped = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
    found = set()
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" not in path.parts:
                found |= {node.value for node in ast.walk(ast.parse(path.read_text()))
                          if isinstance(node, ast.Constant) and isinstance(node.value, str)
                          and shaped.fullmatch(node.value)}
    return found


def variables_libraries_read(name: str) -> bool:
    """gunicorn's own variables (its config module names them); the OpenTelemetry SDK reads
    every OTEL_* (core/tracing.py)."""
    return name.startswith("OTEL_") or f'"{name}"' in inspect.getsource(gunicorn.config)


def paths_served(paths: set[str]) -> dict[str, int]:
    """Each path's status from the real ops server (core/ops_server.py), probes answering ok."""
    ok = Probes(liveness=lambda: Verdict(True, "ok"), readiness=lambda: Verdict(True, "ok"))
    server = OpsServer("127.0.0.1", 0, ok).start()
    statuses = {}
    try:
        for path in paths:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{server.address[1]}{path}", timeout=5) as r:
                    statuses[path] = r.status
            except urllib.error.HTTPError as exc:
                statuses[path] = exc.code
    finally:
        server.stop()
    return statuses


def runs_the_ops_server(container: Object) -> str | None:
    """Why the container's command would not serve METRICS_ADDR, or None when it does."""
    argv = container.get("command") or ["python", "manage.py", *container.get("args", [])]
    if argv[0] == "gunicorn":
        config = argv[argv.index("-c") + 1].removeprefix("python:")
        module = ROOT / Path(*config.split(".")).with_suffix(".py")
        return None if "ops_server_from_env" in module.read_text() else f"{config} serves no ops port"
    name, *args = argv[2:]
    app = get_commands().get(name)
    if app is None or app == "devtools":
        return f"manage.py {name}: no such production command"
    parser = load_command_class(app, name).create_parser("manage.py", name)
    try:
        options = parser.parse_args(args)
    except SystemExit:
        return f"manage.py {name} {' '.join(args)}: the command refuses these arguments"
    if not getattr(options, "loop", False):
        return f"manage.py {' '.join([name, *args])} without --loop serves nothing"
    return None


def problems(objects: list[Object]) -> list[str]:
    """What the manifests name that the code does not serve or read; empty when all is true."""
    found = []
    known = variables_the_code_names()
    config_maps = of_kind(objects, "ConfigMap")
    secrets = of_kind(objects, "Secret")
    probes: list[tuple[str, str]] = []
    for component, spec in pod_specs(objects):
        for container in spec["containers"]:
            where = f"{component}/{container['name']}"
            found += environment_problems(where, container, known, config_maps, secrets)
            if component == "migrate":
                continue
            ops_port_found, container_probes = ops_port_problems(where, container)
            found += ops_port_found
            probes += container_probes
    statuses = paths_served({path for _, path in probes})
    found += [f"{where} {path}: the ops server answers {statuses[path]}"
              for where, path in probes if statuses[path] != 200]
    return found


def environment_problems(where: str, container: Object, known: set[str],
                         config_maps: dict[str, Object], secrets: dict[str, Object]) -> list[str]:
    """Variables no code reads, Secret keys and ConfigMaps that are not there."""
    found = []
    names = [e["name"] for e in container.get("env", [])]
    for source in container.get("envFrom", []):
        names += list(config_maps.get(source["configMapRef"]["name"], {}).get("data", {}))
    for name in names:
        if name not in known and not variables_libraries_read(name):
            found.append(f"{where}: {name} is read by no code")
    for entry in container.get("env", []):
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref and ref["key"] not in secrets.get(ref["name"], {}).get("data", {}):
            found.append(f"{where}: {entry['name']} from a Secret key that is not there")
    for source in container.get("envFrom", []):
        if source["configMapRef"]["name"] not in config_maps:
            found.append(f"{where}: no ConfigMap {source['configMapRef']['name']}")
    return found


def ops_port_problems(where: str, container: Object) -> tuple[list[str], list[tuple[str, str]]]:
    """What is wrong with a long-running container's METRICS_ADDR, ops port and probes; and
    its probes, (where, path), for paths_served to answer."""
    found: list[str] = []
    probes: list[tuple[str, str]] = []
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    metrics_addr = next((e["value"] for e in container.get("env", [])
                         if e["name"] == "METRICS_ADDR"), None)
    if metrics_addr is None:
        return [f"{where}: no METRICS_ADDR: no probes, no metrics"], probes
    host, port = parse_listen_addr("METRICS_ADDR", metrics_addr)
    if host not in ("0.0.0.0", "", "::"):  # noqa: S104 (the kubelet probes the pod's address)
        found.append(f"{where}: METRICS_ADDR {metrics_addr} is not reachable from the kubelet")
    if ports.get("ops") != port:
        found.append(f"{where}: the port named ops is {ports.get('ops')}, METRICS_ADDR's {port}")
    if (why := runs_the_ops_server(container)) is not None:
        found.append(f"{where}: {why}")
    for kind in ("livenessProbe", "readinessProbe"):
        probe = container.get(kind, {}).get("httpGet")
        if probe is None:
            found.append(f"{where}: no {kind}")
            continue
        probe_port = ports.get(probe["port"], probe["port"])
        if probe_port != port:
            found.append(f"{where}: {kind} on port {probe['port']}, not METRICS_ADDR's {port}")
        probes.append((f"{where}: {kind}", probe["path"]))
    return found, probes


# The tests.

def test_the_base_and_the_overlay_render(rendered: dict[str, list[Object]]) -> None:
    for objects in rendered.values():
        assert {"Deployment", "Job", "Service", "PodDisruptionBudget", "ServiceMonitor",
                "PrometheusRule"} <= {o["kind"] for o in objects}
        assert set(PROCESSES) == {c for c, _ in pod_specs(objects)} - {"migrate"}


def schema_errors(o: Object) -> list[str]:
    """The object against the schema of its kind in KUBERNETES_VERSION, one line an error."""
    try:
        kubernetes_validate.validate(o, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(map(str, exc.path))
        return [f"{o['kind']} {o['metadata']['name']}: {where}: {exc.message}"]
    return []


def test_every_object_meets_the_kubernetes_schemas(rendered: dict[str, list[Object]]) -> None:
    custom = {"monitoring.coreos.com/v1"}  # no schema in kubernetes-validate: checked below
    errors = [error for objects in rendered.values() for o in objects
              if o["apiVersion"] not in custom for error in schema_errors(o)]
    assert errors == []


def test_the_schema_check_catches_a_misspelt_field(overlay: list[Object]) -> None:
    [worker] = [o for o in overlay if o["metadata"]["name"].endswith("-worker")]
    container = worker["spec"]["template"]["spec"]["containers"][0]
    broken = {**worker, "spec": {**worker["spec"], "template": {"spec": {"containers": [
        {**container, "livenesProbe": container["livenessProbe"]}]}}}}
    assert schema_errors(broken) == [
        "Deployment pin-profile-reminders-worker: spec/template/spec/containers/0: Additional "
        "properties are not allowed ('livenesProbe' was unexpected)"]


def test_probes_ports_commands_and_variables_are_what_the_code_serves_and_reads(
    overlay: list[Object],
) -> None:
    assert problems(overlay) == []


def test_a_manifest_naming_what_the_code_lacks_is_caught(overlay: list[Object]) -> None:
    broken = copy.deepcopy(overlay)
    containers = {c: s["containers"][0] for c, s in pod_specs(broken)}
    containers["admin"]["readinessProbe"]["httpGet"]["path"] = "/ready"
    containers["worker"]["env"][-1]["name"] = "REMINDER_CLAIM_CONNECTION"
    containers["relay"]["ports"][0]["containerPort"] = 9190
    containers["audit"]["args"].remove("--loop")
    assert sorted(problems(broken)) == sorted([
        "worker/app: REMINDER_CLAIM_CONNECTION is read by no code",
        "relay/app: the port named ops is 9190, METRICS_ADDR's 9109",
        "relay/app: livenessProbe on port ops, not METRICS_ADDR's 9109",
        "relay/app: readinessProbe on port ops, not METRICS_ADDR's 9109",
        "audit/app: manage.py audit_reminders --against-topic without --loop serves nothing",
        "admin/app: readinessProbe /ready: the ops server answers 404",
    ])


def test_every_pod_runs_unprivileged_with_resources(overlay: list[Object]) -> None:
    for component, spec in pod_specs(overlay):
        pod = spec["securityContext"]
        assert (pod["runAsUser"], pod["runAsGroup"], pod["runAsNonRoot"]) == (APP_UID, APP_UID, True)
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, component
        assert spec["automountServiceAccountToken"] is False, component
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, component
            assert context["allowPrivilegeEscalation"] is False, component
            assert context["capabilities"] == {"drop": ["ALL"]}, component
            assert {"cpu", "memory"} <= set(container["resources"]["requests"]), component
            assert "memory" in container["resources"]["limits"], component
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            [tmp] = [v for v in spec["volumes"] if v["name"] == mounts["/tmp"]]  # noqa: S108
            assert "emptyDir" in tmp, component  # gunicorn's heartbeat files, tempfile


def test_pods_stop_after_the_work_they_finish_on_sigterm(overlay: list[Object]) -> None:
    """The grace outlasts what a process finishes on SIGTERM: the worker's batch (at most the
    statement timeout), the relay's acknowledgements (OUTBOX_SHUTDOWN_GRACE)."""
    settings_py = (ROOT / "pin_profile" / "settings.py").read_text()
    statement_ms = re.search(r'"DB_STATEMENT_TIMEOUT_MS", \w+, ([\d_]+)\)', settings_py)
    assert statement_ms
    grace = {c: s["terminationGracePeriodSeconds"] for c, s in pod_specs(overlay) if c != "migrate"}
    assert grace["worker"] > int(statement_ms[1]) / 1000
    assert grace["relay"] >= RelaySettings().shutdown_grace.total_seconds() + 30
    assert min(grace.values()) > 30  # Kubernetes' default; gunicorn's graceful_timeout is 30 s


def test_the_relay_runs_a_leader_and_a_standby_and_disruptions_spare_one(overlay: list[Object]) -> None:
    deployments = of_kind(overlay, "Deployment")
    assert deployments["pin-profile-reminders-relay"]["spec"]["replicas"] == 2
    budgets = {b["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]: b["spec"]
               for b in of_kind(overlay, "PodDisruptionBudget").values()}
    assert budgets == {"relay": {"maxUnavailable": 1, "selector": budgets["relay"]["selector"]},
                       "admin": {"minAvailable": 1, "selector": budgets["admin"]["selector"]}}


def test_the_worker_replicas_show_the_connection_budget() -> None:
    text = (BASE / "worker.yaml").read_text()
    before = text.split("\n  replicas:", 1)[0].rsplit("spec:", 1)[1]
    assert "REMINDER_CLAIM_CONNECTIONS" in before and "2 while a cycle claims" in before


def test_the_migrate_job_migrates_then_grants_as_the_schema_owner(overlay: list[Object]) -> None:
    [job] = of_kind(overlay, "Job").values()
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["python manage.py migrate --no-input && python manage.py apply_db_roles"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_the_migrate_job_is_not_tried_again_where_a_person_must_act(overlay: list[Object]) -> None:
    """The exit codes that fail the Job at once are those no retry mends (core/exit_codes.py),
    and name the Job's one container."""
    [job] = of_kind(overlay, "Job").values()
    [container] = job["spec"]["template"]["spec"]["containers"]
    rules = job["spec"]["podFailurePolicy"]["rules"]
    [fail] = [r for r in rules if r["action"] == "FailJob"]
    assert fail["onExitCodes"] == {"containerName": container["name"], "operator": "In",
                                   "values": [ExitCode.USAGE, ExitCode.REFUSED]}
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]} in rules


def test_the_service_monitor_scrapes_every_ops_port(overlay: list[Object]) -> None:
    [monitor] = of_kind(overlay, "ServiceMonitor").values()
    services = of_kind(overlay, "Service")
    matched = [s for s in services.values() if monitor["spec"]["selector"]["matchLabels"].items()
               <= s["metadata"]["labels"].items()]
    assert [s["metadata"]["name"] for s in matched] == ["pin-profile-reminders-ops"]
    [service] = matched
    assert service["spec"]["clusterIP"] == "None"
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    [port] = service["spec"]["ports"]
    selected = [c for o in overlay if o["kind"] == "Deployment"
                if service["spec"]["selector"].items() <= o["spec"]["template"]["metadata"]["labels"].items()
                for c in o["spec"]["template"]["spec"]["containers"]]
    assert len(selected) == len(PROCESSES)
    assert all(port["targetPort"] in {p["name"] for p in c["ports"]} for c in selected)
    assert paths_served({endpoint["path"]}) == {"/metrics": 200}


def test_the_prometheus_rule_is_generated_from_the_alert_rules() -> None:
    """Never written twice: the file is render_alerts.py's output; re-run it when this fails:
    RUNBOOK_BASE_URL=<placeholder> python3 ops/prometheus/render_alerts.py --prometheusrule
    --output deploy/kubernetes/base/prometheusrule.yaml."""
    done = subprocess.run(["python3", str(RENDER), "--prometheusrule"], capture_output=True,
                          text=True, timeout=60, check=True,
                          env={**os.environ, "RUNBOOK_BASE_URL": PLACEHOLDER_BASE})
    assert PROMETHEUS_RULE.read_text() == done.stdout, "stale: re-run render_alerts.py --prometheusrule"
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())


def test_the_prometheus_rule_passes_promtool(overlay: list[Object], tmp_path: Path) -> None:
    [rule] = of_kind(overlay, "PrometheusRule").values()
    assert (rule["apiVersion"], set(rule)) == ("monitoring.coreos.com/v1",
                                               {"apiVersion", "kind", "metadata", "spec"})
    assert set(rule["spec"]) == {"groups"}
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(rule["spec"]))
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/test.sh installs Debian's prometheus package"
    done = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
