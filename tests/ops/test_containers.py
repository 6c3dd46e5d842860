"""The container files, checked without a container engine: every compose file against the
Compose Specification's JSON Schema, the stack's healthchecks, ports, roles and mounts, the
Prometheus and Grafana wiring, and the build context that .dockerignore leaves.
hadolint lints docker/Dockerfile in scripts/test.sh. What only a real engine can show (the
image builds, the services start and turn healthy) is listed in docs/testing.md, "What CI checks"."""

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.conf import settings
from jsonschema import Draft202012Validator
from jsonschema.validators import validator_for

from core.roles import ADMIN_WEB_ROLE, RELAY_ROLE, WORKER_ROLE
from pin_profile import settings as production_settings
from tests.support.processes import ROOT

COMPOSE_SCHEMA = ROOT / "docker" / "compose-spec" / "compose-spec.json"
COMPOSE_SCHEMA_SHA256 = "d549057ebc2925f39f62799eab0db7b9e2c18b35b6c00595199116da3ed10e64"
COMPOSE = ROOT / "docker" / "compose.yml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PROMETHEUS_CONFIG = ROOT / "ops" / "prometheus" / "prometheus.yml"
GRAFANA = ROOT / "ops" / "grafana"
# Each long-running process of the image: its database role and its METRICS_ADDR port.
APP_SERVICES = {"worker": (WORKER_ROLE, 9108), "relay": (RELAY_ROLE, 9109),
                "admin": (ADMIN_WEB_ROLE, 9110)}


def compose_files() -> list[Path]:
    skip = {".git", ".venv", "artifacts", "node_modules"}
    found = []
    for directory, subdirectories, files in os.walk(ROOT):
        subdirectories[:] = [d for d in subdirectories if d not in skip]
        found += [Path(directory, f) for f in files
                  if re.fullmatch(r"(docker-)?compose(\.[\w-]+)?\.ya?ml", f)]
    return sorted(found)


def compose_validator() -> Any:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    cls = validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = load_yaml(COMPOSE)
    assert isinstance(document, dict)
    return document


def test_the_vendored_compose_schema_is_the_recorded_one() -> None:
    assert hashlib.sha256(COMPOSE_SCHEMA.read_bytes()).hexdigest() == COMPOSE_SCHEMA_SHA256
    assert isinstance(compose_validator(), Draft202012Validator)  # the schema's own dialect


@pytest.mark.parametrize("path", compose_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_compose_file_is_valid_against_the_compose_spec(path: Path) -> None:
    errors = [f"{e.json_path}: {e.message}" for e in compose_validator().iter_errors(load_yaml(path))]
    assert errors == []


def test_the_compose_schema_catches_misspelt_keys_and_values(compose: dict[str, Any]) -> None:
    broken = json.loads(json.dumps(compose))
    broken["services"]["worker"]["healthcheck"]["intervall"] = "30s"
    broken["services"]["admin"]["ports"] = [{"targt": 8000}]
    broken["services"]["relay"]["depends_on"]["kafka-1"]["condition"] = "service_finished"
    errors = list(compose_validator().iter_errors(broken))
    assert {e.json_path for e in errors} >= {"$.services.worker.healthcheck",
                                             "$.services.admin.ports[0]",
                                             "$.services.relay.depends_on"}


def test_the_compose_files_are_found() -> None:
    assert COMPOSE in compose_files()


def test_every_long_running_service_has_a_healthcheck(compose: dict[str, Any]) -> None:
    services = compose["services"]
    one_shots = {name for name, s in services.items() if s.get("restart") == "no"}
    assert one_shots == {"migrate"}
    for name, service in services.items():
        if name in one_shots:
            continue
        check = service.get("healthcheck", {})
        assert check.get("test") and not check.get("disable"), name
        assert check["test"][0] in {"CMD", "CMD-SHELL"}, name
    waited_for = {dep for s in services.values() for dep, how in s.get("depends_on", {}).items()
                  if how == {"condition": "service_completed_successfully"}}
    assert waited_for == one_shots


def test_app_services_run_as_their_role_and_probe_their_own_ops_port(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, (role, port) in APP_SERVICES.items():
        service = services[name]
        env = service["environment"]
        assert env["DATABASE_URL"].startswith(f"postgres://{role}@postgres:5432/"), name
        assert env["METRICS_ADDR"] == f"0.0.0.0:{port}", name
        probe = " ".join(service["healthcheck"]["test"])
        assert f"http://127.0.0.1:{port}/healthz" in probe, name
    assert services["migrate"]["environment"]["DATABASE_URL"].startswith("postgres://postgres@")


def test_the_admin_runs_the_tested_gunicorn_configuration(compose: dict[str, Any]) -> None:
    admin = compose["services"]["admin"]
    assert admin["entrypoint"][:3] == ["gunicorn", "-c", "python:pin_profile.gunicorn_conf"]
    assert "8000:8000" in admin["ports"][0]
    assert not any("9110" in p for p in admin["ports"])  # the ops port stays inside the network
    assert admin["environment"]["DJANGO_SECRET_KEY"].startswith("${DJANGO_SECRET_KEY:?")
    production = (ROOT / "requirements" / "base.txt").read_text()
    development = (ROOT / "requirements" / "dev.txt").read_text()
    pin = re.search(r"^gunicorn==\S+", production, re.MULTILINE)
    assert pin and re.search(rf"^{re.escape(pin[0])}\b", development, re.MULTILINE)  # the image's gunicorn


def test_published_ports_are_on_loopback_only(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for mapping in service.get("ports", []):
            assert str(mapping).startswith("127.0.0.1:"), (name, mapping)


def _mounts(service: dict[str, Any]) -> dict[str, Path]:
    """{container path: repository path} of the read-only bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target, mode = volume.split(":")
        assert mode == "ro"
        mounts[target] = (COMPOSE.parent / source).resolve()
    return mounts


def test_prometheus_loads_the_repository_rules_and_scrapes_every_ops_port(
    compose: dict[str, Any]
) -> None:
    prometheus = compose["services"]["prometheus"]
    mounts = _mounts(prometheus)
    assert mounts["/etc/prometheus"] == PROMETHEUS_CONFIG.parent
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    config = load_yaml(PROMETHEUS_CONFIG)
    for rule_file in config["rule_files"]:
        assert (PROMETHEUS_CONFIG.parent / rule_file).is_file()
    assert "alerts.yml" in config["rule_files"]
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {f"{name}:{port}" for name, (_, port) in APP_SERVICES.items()}


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard(compose: dict[str, Any]) -> None:
    mounts = _mounts(compose["services"]["grafana"])
    provisioning = mounts["/etc/grafana/provisioning"]
    assert provisioning == GRAFANA / "provisioning"
    [source] = load_yaml(provisioning / "datasources" / "prometheus.yml")["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"]
    assert source["url"] == "http://prometheus:9090"
    [provider] = load_yaml(provisioning / "dashboards" / "pin-profile.yml")["providers"]
    dashboards = mounts[provider["options"]["path"]]
    assert dashboards == GRAFANA
    panels = [json.loads(p.read_text())["panels"] for p in dashboards.glob("*.json")]
    assert panels and all(panels)


def test_prometheus_and_grafana_answer_only_after_their_dependencies(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services["prometheus"]["depends_on"]) == set(APP_SERVICES)
    assert services["grafana"]["depends_on"] == {"prometheus": {"condition": "service_healthy"}}
    for node in KAFKA_NODES:
        assert services["relay"]["depends_on"][node] == {"condition": "service_healthy"}


KAFKA_NODES = ("kafka-1", "kafka-2", "kafka-3")


def test_the_stack_runs_the_tested_kafka_release_on_three_nodes_with_durable_topics(
        compose: dict[str, Any]) -> None:
    """Apache Kafka's own image at the release the real-cluster tier runs (devtools/kafka/
    pom.xml), three voters, topics the relay's durability check accepts without the
    stand-ins' OUTBOX_ALLOW_UNDURABLE_TOPIC."""
    pinned = re.search(r"<kafka.version>([^<]+)</kafka.version>",
                       (ROOT / "devtools" / "kafka" / "pom.xml").read_text())
    assert pinned is not None
    services = compose["services"]
    for node_id, name in enumerate(KAFKA_NODES, start=1):
        node = services[name]
        assert node["image"] == f"apache/kafka:{pinned.group(1)}"
        env = node["environment"]
        assert env["KAFKA_NODE_ID"] == node_id
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == ",".join(
            f"{i}@{n}:9093" for i, n in enumerate(KAFKA_NODES, start=1))
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{name}:9092"
        assert (env["KAFKA_DEFAULT_REPLICATION_FACTOR"], env["KAFKA_MIN_INSYNC_REPLICAS"]) == (3, 2)
        assert env["KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE"] == "false"
    relay = services["relay"]["environment"]
    assert "OUTBOX_ALLOW_UNDURABLE_TOPIC" not in relay
    assert relay["KAFKA_BOOTSTRAP_SERVERS"] == ",".join(f"{n}:9092" for n in KAFKA_NODES)


# --- the build context and the Dockerfile ----------------------------------------------------


def _ignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore as (negated, regex) in order; `**` spans directories, `*` does not."""
    rules = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = ""
        for token in re.split(r"(\*\*/|\*\*|\*|\?)", pattern):
            regex += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(token, re.escape(token))
        rules.append((negated, re.compile(regex)))
    return rules


def is_ignored(relative: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last matching pattern wins; a match on a directory covers its files."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for negated, regex in rules:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            ignored = not negated
    return ignored


def context_size(rules: list[tuple[bool, re.Pattern[str]]]) -> tuple[int, int]:
    """(files, bytes) that `docker build` would send from the repository."""
    files = size = 0
    for directory, subdirectories, names in os.walk(ROOT):
        relative_dir = Path(directory).relative_to(ROOT).as_posix()
        prefix = "" if relative_dir == "." else relative_dir + "/"
        subdirectories[:] = [d for d in subdirectories if not is_ignored(prefix + d, rules)]
        for name in names:
            path = Path(directory, name)
            if not is_ignored(prefix + name, rules) and not path.is_symlink():
                files += 1
                size += path.stat().st_size
    return files, size


def test_the_ignore_matcher_follows_docker_rules() -> None:
    rules = [(False, re.compile(r"(?:.*/)?__pycache__")), (False, re.compile("artifacts")),
             (True, re.compile("artifacts/keep"))]
    assert is_ignored("__pycache__", rules) and is_ignored("a/b/__pycache__/x.pyc", rules)
    assert is_ignored("artifacts/static/base.css", rules)
    assert not is_ignored("artifacts/keep", rules) and not is_ignored("reminders/rules.py", rules)


def test_dockerignore_keeps_the_venv_and_secrets_out_of_the_build_context(
    capsys: pytest.CaptureFixture[str]
) -> None:
    rules = _ignore_rules()
    for path in (".venv/bin/python", ".git/HEAD", "artifacts/static/admin/css/base.css",
                 ".env", "docker/.env", "reminders/__pycache__/rules.cpython-311.pyc"):
        assert is_ignored(path, rules), path
    files, size = context_size(rules)
    all_files, all_size = context_size([])
    with capsys.disabled():
        print(f"\ndocker build context: {files} files, {size / 1e6:.1f} MB with .dockerignore; "  # noqa: T201
              f"{all_files} files, {all_size / 1e6:.1f} MB without")
    assert size < 5_000_000


def _copied_sources() -> list[str]:
    sources = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY "):
            arguments = [a for a in line.split()[1:] if not a.startswith("--")]
            sources += arguments[:-1]
    return sources


def test_every_copied_path_exists_and_reaches_the_build_context() -> None:
    rules = _ignore_rules()
    sources = _copied_sources()
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not is_ignored(source.rstrip("/"), rules), source


def test_the_image_copies_every_package_production_runs_and_no_devtools() -> None:
    local_apps = {app.split(".")[0] for app in production_settings.INSTALLED_APPS
                  if (ROOT / app.split(".")[0] / "__init__.py").is_file()}
    needed = {"manage.py", "pyproject.toml", "pin_profile", *local_apps}
    assert "devtools" in {app.split(".")[0] for app in settings.INSTALLED_APPS} - local_apps
    copied = set(_copied_sources())
    assert needed - copied == set()
    assert not {"devtools", "tests", "requirements/dev.txt"} & copied


def test_the_demo_data_comes_from_devtools_mounted_into_the_one_shot(compose: dict[str, Any]) -> None:
    migrate = compose["services"]["migrate"]
    assert _mounts(migrate) == {"/app/devtools": ROOT / "devtools"}
    assert migrate["environment"]["DJANGO_SETTINGS_MODULE"] == "pin_profile.settings_dev"
    for name, service in compose["services"].items():
        if name != "migrate":
            assert "/app/devtools" not in _mounts(service), name
