"""Every configuration value is taken as written: a value starting with `$` is never read as the
name of another variable (django-environ's interpolation is off, core.config.Environment).

The variables are the ones docs/configuration.md documents, read from its tables, so a variable
documented later is covered too. Each is set, alone, to `$PIN_LITERAL_TARGET` while that variable
holds a value that would pass; then every reader of the configuration runs (the Django settings,
the worker's, the relay's, the ops server's, gunicorn's), and the value must come out as written,
or be refused by a ConfigError naming the variable (its parser does not take a `$`)."""

import dataclasses
import json
import os
import re
import runpy
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path, PurePath

import pytest

from core.config import ConfigError, Environment
from core.health import Verdict
from core.ops_server import Probes, ops_server_from_env
from outbox.config import DEPRECATED_VARIABLES, load_relay_settings
from reminders.config import load_settings

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION = ROOT / "docs" / "configuration.md"
TARGET = "PIN_LITERAL_TARGET"
LITERAL = f"${TARGET}"


def documented_variables() -> list[str]:
    """The variables in the first column of docs/configuration.md's tables."""
    names: set[str] = set()
    for line in CONFIGURATION.read_text().splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1]))
    return sorted(names)


def test_the_documented_variables_are_found() -> None:
    found = documented_variables()
    assert len(found) >= 50, found
    assert {"DJANGO_SECRET_KEY", "DATABASE_URL", "REMINDER_RETENTION_DAYS", "KAFKA_SASL_PASSWORD",
            "OUTBOX_LINGER", "FORWARDED_ALLOW_IPS"} <= set(found)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("kafka-tls")
    paths = {name: folder / f"{name}.pem" for name in ("ca", "certificate", "key")}
    for path in paths.values():
        path.write_text("not checked before the producer starts\n")
    return {name: str(path) for name, path in paths.items()}


def context(variable: str, files: dict[str, str]) -> dict[str, str]:
    """An environment in which `variable` is read (the relay secured, so its TLS and SASL
    variables count), every other value valid."""
    if variable == "KAFKA_SASL_PLAINTEXT_ALLOW":  # read for PLAIN over SASL_PLAINTEXT only
        return {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
                "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_MECHANISM": "PLAIN",
                "KAFKA_SASL_USERNAME": "relay", "KAFKA_SASL_PASSWORD": "relay-password"}
    return {
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092", "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "KAFKA_SASL_USERNAME": "relay",
        "KAFKA_SASL_PASSWORD": "relay-password",
        "KAFKA_SSL_CERTIFICATE_LOCATION": files["certificate"],
        "KAFKA_SSL_KEY_LOCATION": files["key"],
    }


@contextmanager
def process_environment(environ: Mapping[str, str]) -> Iterator[None]:
    """os.environ replaced by `environ` for the block (the Django settings read os.environ)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def django_settings(environ: Mapping[str, str]) -> object:
    """pin_profile.settings run afresh on `environ`: its settings (upper-case names)."""
    with process_environment(environ):
        module = runpy.run_path(str(ROOT / "pin_profile" / "settings.py"),
                                run_name="pin_profile_settings_read")
    return {name: value for name, value in module.items() if name.isupper()}


def ops_server(environ: Mapping[str, str]) -> object:
    probes = Probes(liveness=lambda: Verdict(True, "ok"), readiness=lambda: Verdict(True, "ok"))
    server = ops_server_from_env(environ, probes)
    if server is None:
        return None
    server.stop()
    return server.address


READERS: dict[str, Callable[[Mapping[str, str]], object]] = {
    "pin_profile.settings": django_settings,
    "reminders.config": load_settings,
    "outbox.config": load_relay_settings,
    "core.ops_server": ops_server,
}


def holds(value: object, literal: str) -> bool:
    """`literal` is, as written, one of the values read (searched through containers,
    dataclasses and paths)."""
    if isinstance(value, str):
        return value == literal
    if isinstance(value, PurePath):
        return str(value) == literal
    if isinstance(value, Mapping):
        return any(holds(v, literal) for v in value.values())
    if isinstance(value, list | tuple | set | frozenset):
        return any(holds(v, literal) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(holds(getattr(value, f.name), literal) for f in dataclasses.fields(value))
    return False


def read_by_gunicorn(environ: Mapping[str, str]) -> str:
    """gunicorn's own settings on `environ` (it reads FORWARDED_ALLOW_IPS when imported): its
    output, or its error."""
    done = subprocess.run(
        [sys.executable, "-c", "import json; from gunicorn.config import Config; "
         "print(json.dumps({k: s.get() for k, s in Config().settings.items()}, default=str))"],
        env={**environ, "PATH": os.environ.get("PATH", "")}, capture_output=True, text=True,
        timeout=60, check=False)
    return done.stdout + done.stderr


def verdict(variable: str, environ: Mapping[str, str]) -> str:
    """How the readers take `variable`=LITERAL in `environ`: refused by name, read as written (by
    which), or ignored as deprecated; fails the test otherwise."""
    found_in: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # OUTBOX_CLAIM_TTL's
        for name, read in READERS.items():
            try:
                value = read(environ)
            except ConfigError as refused:
                assert refused.name == variable, f"{name} refused another variable: {refused}"
                return "refused by name"  # its parser takes no `$`
            if holds(value, LITERAL):
                found_in.append(name)
    if found_in:
        return f"read as written by {', '.join(found_in)}"
    if variable in DEPRECATED_VARIABLES:
        return "ignored, deprecated"  # read by nothing: a warning says so
    output = read_by_gunicorn(environ)
    assert repr(LITERAL) in output or json.dumps(LITERAL) in output, \
        f"{variable}={LITERAL} was read as written by no reader: {output}"
    return "read as written by gunicorn"


@pytest.mark.parametrize("variable", documented_variables())
def test_a_value_starting_with_a_dollar_is_read_as_written_or_refused_by_name(
        variable: str, files: dict[str, str]) -> None:
    base = context(variable, files)
    # With the variable it names set, an interpolation would pass unnoticed where the value is
    # taken; with it unset, it would fail as something other than the variable's refusal.
    named = {**base, variable: LITERAL, TARGET: base.get(variable, "a-value-that-would-pass")}
    unnamed = {**base, variable: LITERAL}
    assert verdict(variable, named) == verdict(variable, unnamed)


def test_django_environ_alone_would_have_read_another_variable() -> None:
    # What the override turns off: django-environ 0.14 reads `$NAME` as NAME's value.
    import environ

    reader = environ.Env()
    reader.ENVIRON = {"DJANGO_SECRET_KEY": LITERAL, TARGET: "another-value"}
    assert reader.str("DJANGO_SECRET_KEY") == "another-value"
    ours = Environment({"DJANGO_SECRET_KEY": LITERAL, TARGET: "another-value"})
    assert ours.str("DJANGO_SECRET_KEY") == LITERAL
    assert ours.list("DJANGO_SECRET_KEY") == [LITERAL]
    assert ours.str("UNSET", default="d") == "d" and ours.list("UNSET", default=[]) == []
    with pytest.raises(ConfigError, match="UNSET: not set"):
        ours.str("UNSET")
