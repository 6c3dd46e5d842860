"""The docs cannot drift silently: every repository path that README.md, docs/ and
pyproject.toml cite exists, and the alerts docs/design.md lists are the alerts
ops/prometheus/alerts.yml defines (read from the rules file: a new alert needs a line in the
design page, a removed one loses it)."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
TOP = ("tests", "docs", "scripts", "ops", "bench", "docker", "core", "reminders", "outbox",
       "audit", "devtools", "pin_profile", "requirements", ".ci", "artifacts", "deploy")
# A path: a top-level folder, then name parts; ends at a file with an extension or a folder.
FOLDERS = "|".join(map(re.escape, TOP))
PATH = re.compile(rf"(?<![\w./-])((?:{FOLDERS})/[\w.-]+(?:/[\w.-]+)*/?)")
# Written by a run or by the operator (docker/.env), not kept in the repository.
GENERATED = ("artifacts/", "bench/results/", "bench/.audit-logs/", "docker/.env")


def cited_paths(text: str) -> set[str]:
    found = set()
    for match in PATH.finditer(text):
        path = match.group(1).rstrip(".")
        if path.startswith(GENERATED) or "*" in path:
            continue
        found.add(path)
    return found


def sources() -> list[Path]:
    return [ROOT / "README.md", ROOT / "pyproject.toml", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_path_the_docs_cite_exists() -> None:
    missing = sorted(f"{source.relative_to(ROOT)}: {path}" for source in sources()
                     for path in cited_paths(source.read_text(encoding="utf-8"))
                     if not (ROOT / path).exists())
    assert not missing, "\n".join(missing)


def test_the_path_finder_sees_what_a_doc_writes() -> None:
    text = ("`tests/unit/test_rules.py`, scripts/test.sh, see docs/design.md. "
            "(ops/prometheus/) and artifacts/junit.xml, bench/results/*.json")
    assert cited_paths(text) == {"tests/unit/test_rules.py", "scripts/test.sh", "docs/design.md",
                                 "ops/prometheus/"}


def test_the_design_page_lists_the_alerts_the_rules_define() -> None:
    rules = yaml.safe_load((ROOT / "ops" / "prometheus" / "alerts.yml").read_text())
    defined = {rule["alert"] for group in rules["groups"] for rule in group["rules"]
               if "alert" in rule}
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    paragraph = design[design.index("**Alerts**"):].split("\n\n", 1)[0]
    named = set(re.findall(r"`([A-Z][A-Za-z]+)`", paragraph))
    assert defined, "no alert in ops/prometheus/alerts.yml"
    assert named == defined, (f"design.md's Alerts lack {sorted(defined - named)}; "
                              f"name alerts no rule defines: {sorted(named - defined)}")
