"""The production environment's SBOM (scripts/sbom.sh, which scripts/test.sh runs into
artifacts/): CycloneDX, the project as its root component, and exactly the production lock's
packages at their pinned versions, with their hashes; no development package."""

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.utils import canonicalize_name

from tests.support.locks import DEVELOPMENT_LOCK, PRODUCTION_LOCK, lock_entries, pins
from tests.support.processes import ROOT

SBOM_SH = ROOT / "scripts" / "sbom.sh"


@pytest.fixture(scope="module")
def sbom(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    output: Path = tmp_path_factory.mktemp("sbom") / "sbom.cdx.json"
    subprocess.run([str(SBOM_SH), str(output)], env={**os.environ, "VENV": sys.prefix},
                   capture_output=True, timeout=120, check=True)
    document: dict[str, Any] = json.loads(output.read_text())
    return document


def test_the_sbom_describes_the_project(sbom: dict[str, Any]) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert (sbom["bomFormat"], sbom["specVersion"]) == ("CycloneDX", "1.6")
    root = sbom["metadata"]["component"]
    assert (root["type"], root["name"], root["version"]) == ("application", "pin-profile-reminders", version)


def test_the_sbom_lists_every_production_package_at_its_pin_and_no_development_one(
    sbom: dict[str, Any],
) -> None:
    listed = {(canonicalize_name(c["name"]), c["version"]) for c in sbom["components"]}
    assert listed == pins(PRODUCTION_LOCK)
    development_only = set(lock_entries(DEVELOPMENT_LOCK)) - set(lock_entries(PRODUCTION_LOCK))
    assert development_only  # pytest, mypy, ...: there is something to leave out
    assert {name for name, _ in listed} & development_only == set()
    for component in sbom["components"]:
        assert component["purl"] == f"pkg:pypi/{canonicalize_name(component['name'])}@{component['version']}"
        [distribution] = component["externalReferences"]
        assert len(distribution["hashes"]) == lock_entries(PRODUCTION_LOCK)[
            canonicalize_name(component["name"])].hashes
