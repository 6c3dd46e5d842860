#!/usr/bin/env bash
# The production environment's SBOM, CycloneDX 1.6 JSON, written by cyclonedx-bom (pinned in
# requirements/dev.in) to artifacts/sbom.cdx.json (or the path given): every package of
# requirements/base.txt at its pinned version with its hashes, the project (pyproject.toml) as
# the root component. That lock is the production environment: the image installs it with
# --require-hashes and holds exactly its packages (tests/ops/test_image.py). About a second;
# tests/ops/test_sbom.py checks what it lists. VENV: the venv with cyclonedx-py (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
output="${1:-artifacts/sbom.cdx.json}"
mkdir -p "$(dirname "$output")"
# No dependency graph from a lock (cyclonedx-py warns so); the schema check costs 15 s: the test
# checks what matters instead.
PYTHONWARNINGS=ignore::UserWarning "${VENV:-.venv}/bin/cyclonedx-py" requirements \
    --pyproject pyproject.toml --mc-type application --sv 1.6 --output-reproducible \
    --no-validate --of JSON -o "$output" requirements/base.txt
