"""The image built and run (docs/deployment.md, "The image, tested"): docker/Dockerfile built by
Debian's buildah on a stand-in for python:3.11-slim-bookworm made from Debian's packages
(scripts/image.sh), then run as a platform runs it, as its unprivileged user: what it says it is
(its OCI labels, `--version`), what it leaves out (devtools, development packages), `check --deploy`
with the two documented variables, `migrate` and `apply_db_roles` on a fresh database of the
test server, one cycle as the worker role, one relay pass as the relay role to a Tansu broker,
and the events read back from the topic. Every command goes through the image's own
entrypoint, read from its configuration (`buildah run` does not apply it).

One test on purpose: the build is the cost (minutes cold), and xdist could split several."""

import secrets
import subprocess
import time
import tomllib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from packaging.utils import canonicalize_name

from core.roles import RELAY_ROLE, WORKER_ROLE
from devtools.demo_data import PERSON_DOCUMENTS_SQL
from devtools.read_topic import read_topic
from tests.support.contract import assert_event_valid
from tests.support.image import (
    BASE_CA_LABEL,
    CA_BUNDLE,
    Container,
    ImageConfig,
    build_image,
    image_config,
    require_buildah,
)
from tests.support.ledger import AS_OF, expiring_in
from tests.support.locks import PRODUCTION_LOCK, pins
from tests.support.processes import ROOT
from tests.support.tansu_support import TansuBroker

pytestmark = [pytest.mark.image, pytest.mark.slow]

APP_UID = "10001"
# What the user must not be able to change: the code, the installed packages, the static files.
READ_ONLY = ("/app", "/app/manage.py", "/app/reminders", "/app/artifacts/static",
             "/usr/local/lib/python3.11/site-packages")


def server_url(database: str, role: str | None = None) -> str:
    """A URL to `database` on the test database's server (the xdist worker's own, if any)."""
    settings = connection.settings_dict
    return (f"postgres://{role or settings['USER']}@{settings['HOST'] or '127.0.0.1'}:"
            f"{settings['PORT'] or 5432}/{database}")


@contextmanager
def fresh_database() -> Iterator[str]:
    """An empty database on the test server, dropped after the block; its name."""
    name = f"image_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url("postgres"), autocommit=True) as admin:
        admin.execute(f"create database {name}")
    try:
        yield name
    finally:
        with psycopg.connect(server_url("postgres"), autocommit=True) as admin:
            admin.execute(f"drop database if exists {name} with (force)")


def sql(url: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def insert_documents(url: str, expiring: dict[uuid.UUID, list[int]]) -> None:
    """Per owner, one Active document expiring in each of the given days after AS_OF."""
    rows = [(uuid.uuid4(), owner, uuid.uuid4(), "Passport", "45 ** ****12", expiring_in(days),
             "Active", b"\x00secret", AS_OF - timedelta(days=400), AS_OF - timedelta(days=400))
            for owner, days_list in expiring.items() for days in days_list]
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
        cursor.executemany(
            "insert into profile.person_documents (id, owner_user_id, person_id, type,"
            " number_mask, expires_at, status, payload_cipher, created_at, updated_at)"
            " values (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", rows)


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          timeout=30, check=True).stdout.strip()


def succeeded(done: subprocess.CompletedProcess[str], what: str) -> str:
    assert done.returncode == 0, f"{what} exited {done.returncode}:\n{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_image_builds_and_runs_check_migrate_a_cycle_and_a_relay_pass(
    tansu: TansuBroker, capsys: pytest.CaptureFixture[str],
    transactional_db: None,  # the test server: the run's own cluster under TEST_OWN_CLUSTER=1
) -> None:
    require_buildah()
    built = build_image()
    config = image_config(built.name)
    check_how_it_runs(config)
    version, head = check_the_labels_say_what_it_is(config)

    started = time.monotonic()
    with Container(built.name) as container, fresh_database() as database:
        check_its_user_cannot_change_the_code(container, config)
        check_it_says_its_version_and_holds_the_production_lock_only(container, config,
                                                                     version, head)
        check_deploy_is_clean(container, config)
        image = ImageOnADatabase(container, config, database)
        due, outbox = migrate_and_run_a_cycle_as_the_worker(image)
        relay_and_read_the_events_back(image, tansu, due, outbox)
    ran = time.monotonic() - started

    steps = ", ".join(f"{what} {seconds:.1f}" for what, seconds in container.timings)
    with capsys.disabled():
        print(f"\nimage {built.name}: build {built.seconds:.0f} s "  # noqa: T201
              f"({'; '.join(line.removeprefix('image.sh: ') for line in built.log.splitlines())}); "
              f"runs {ran:.0f} s ({steps})")


@dataclass
class ImageOnADatabase:
    """The image's commands on the fresh database."""

    container: Container
    config: ImageConfig
    database: str

    def manage(self, *args: str, role: str | None = None, **env: str) -> str:
        """`args` through the image's own entrypoint, on the fresh database as `role`."""
        done = self.container.run([*self.config.entrypoint, *args],
                                  env={"DATABASE_URL": server_url(self.database, role), **env})
        return succeeded(done, " ".join(args))


def check_how_it_runs(config: ImageConfig) -> None:
    """Its entrypoint, default command, user, working directory, settings and ports."""
    assert config.entrypoint == ["python", "manage.py"]
    assert config.cmd == ["run_expiry_reminders", "--loop"]
    assert (config.user, config.working_dir) == (APP_UID, "/app")
    assert config.env["DJANGO_SETTINGS_MODULE"] == "pin_profile.settings"
    assert config.exposed_ports == {"9108/tcp", "9109/tcp", "8000/tcp", "9110/tcp", "9111/tcp"}


def check_the_labels_say_what_it_is(config: ImageConfig) -> tuple[str, str]:
    """What it is, from the build arguments scripts/image.sh passes: pyproject.toml's version,
    the commit and its time; no licence (none chosen). The version and the commit."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    head = git("rev-parse", "HEAD")
    oci = {k.removeprefix("org.opencontainers.image."): v for k, v in config.labels.items()
           if k.startswith("org.opencontainers.image.")}
    assert oci.pop("source")
    assert oci == {"title": "pin-profile-reminders", "description": oci["description"],
                   "version": version, "revision": head,
                   "created": git("show", "-s", "--format=%cI", "HEAD")}
    assert config.env["PIN_PROFILE_REVISION"] == head
    return version, head


def check_its_user_cannot_change_the_code(container: Container, config: ImageConfig) -> None:
    """The image's user, which cannot change the code; the CA bundle the build mounted for pip
    is not in the image (the file there is the base's own, from ca-certificates)."""
    who = succeeded(container.run(["sh", "-c", "id -u; id -g; cd /tmp && python -c "
                                   "'import django, sys; print(sys.prefix)'"]), "id")
    assert who.split() == [APP_UID, APP_UID, "/usr/local"]
    writable = container.run(["sh", "-c", 'for p in "$@"; do [ -w "$p" ] && echo "$p"; done; :',
                              "-", *READ_ONLY])
    assert succeeded(writable, "test -w").split() == []
    in_image = succeeded(container.run(["sha256sum", str(CA_BUNDLE)]), "sha256sum").split()[0]
    assert in_image == config.labels[BASE_CA_LABEL]


def check_it_says_its_version_and_holds_the_production_lock_only(
    container: Container, config: ImageConfig, version: str, head: str
) -> None:
    """It says its version and commit; it has no devtools and exactly the production lock's
    packages (beside the base's own pip and setuptools)."""
    said = succeeded(container.run([*config.entrypoint, "--version"]), "--version")
    assert said.startswith(f"pin-profile-reminders {version} (commit {head}, Django ")
    no_devtools = container.run(["sh", "-c", "test ! -e /app/devtools && test ! -e /app/tests"
                                 " && ! python -c 'import devtools' 2>/dev/null"])
    assert no_devtools.returncode == 0, "devtools or tests are in the image"
    frozen = succeeded(container.run(["python", "-m", "pip", "list", "--format=freeze"]), "pip list")
    installed = {(canonicalize_name(name), version)
                 for name, version in (line.split("==") for line in frozen.split() if "==" in line)}
    tools = {p for p in installed if p[0] in {"pip", "setuptools", "wheel"}}
    assert installed - tools == pins(PRODUCTION_LOCK)


def check_deploy_is_clean(container: Container, config: ImageConfig) -> None:
    """`check --deploy` with the two documented variables."""
    deploy = container.run([*config.entrypoint, "check", "--deploy", "--fail-level", "WARNING"],
                           env={"DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
                                "DJANGO_ALLOWED_HOSTS": "admin.example.com"})
    assert "System check identified no issues" in succeeded(deploy, "check --deploy")


def migrate_and_run_a_cycle_as_the_worker(image: ImageOnADatabase) -> tuple[uuid.UUID,
                                                                            dict[str, str]]:
    """migrate, apply_db_roles, documents of three owners (two due), one cycle; the owner with
    two documents due, and the outbox (message id -> key)."""
    url = server_url(image.database)
    image.manage("migrate", "--no-input")
    sql(url, PERSON_DOCUMENTS_SQL.read_text())  # the profile service's table
    image.manage("apply_db_roles")
    due, also_due, not_due = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    insert_documents(url, {due: [6, 0], also_due: [29], not_due: [200]})

    image.manage("run_expiry_reminders", "--as-of", AS_OF.isoformat(), role=WORKER_ROLE)
    outbox = dict(sql(url, "select id::text, message_key from profile.outbox_messages"))
    assert sorted(outbox.values()) == sorted([str(due), str(also_due)])
    return due, outbox


def relay_and_read_the_events_back(image: ImageOnADatabase, tansu: TansuBroker, due: uuid.UUID,
                                   outbox: dict[str, str]) -> None:
    """One relay pass as the relay role; every event on the topic, valid, one per owner."""
    # Tansu keeps one copy whatever a topic says: a single-broker stand-in (docs/outbox-relay.md)
    image.manage("publish_outbox", role=RELAY_ROLE, KAFKA_BOOTSTRAP_SERVERS=tansu.bootstrap_servers,
                 OUTBOX_ALLOW_UNDURABLE_TOPIC="on")
    records = read_topic(tansu.bootstrap_servers)
    assert {r.message_id: r.key for r in records} == outbox
    for record in records:
        assert_event_valid(record.json())  # and the broker validated it on the way in
    [event] = [r.json() for r in records if r.key == str(due)]
    assert len(event["documents"]) == 2  # one event per owner, with both its documents
    assert sql(server_url(image.database), "select count(*) from profile.outbox_messages m"
               " where profile.outbox_published_at(m) is null") == [(0,)]
