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


# A section cited by name, in code, configuration or docs: `docs/outbox-relay.md, "One batch"`
# (or 'One batch'), across comment lines too. The name begins a heading of that page or one of
# its bold items (`**One relay at a time**`); docs/history and the CHANGELOG cite pages as
# they were, and are left out.
SECTION = re.compile(r"((?:docs/)?[\w/-]*?[\w-]+\.md),?\s+(?:\"([^\"]{3,100}?)\"|'([^'\n]{3,100}?)')")
CONTINUED = re.compile(r"\n[ \t]*(?:#|--|//)?[ \t]*")
CITING = (".py", ".sql", ".sh", ".toml", ".yml", ".yaml", ".md", ".html", ".json", "Dockerfile")


def section_names(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    headings = (re.sub(r"^[\d.]+\s+", "", line.lstrip("#").strip())
                for line in text.splitlines() if line.startswith("#"))
    bold = (item.strip(" .:") for item in re.findall(r"\*\*([^*\n]+)\*\*", text))
    return {re.sub(r"[`*]", "", name).strip().lower() for name in (*headings, *bold)}


def cited_page(cited: str) -> Path | None:
    if "/" in cited or cited == "README.md":
        return ROOT / cited
    found = sorted((ROOT / "docs").glob(cited)) or sorted((ROOT / "docs").rglob(cited))
    return found[0] if len(found) == 1 else None


def citing_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "pyproject.toml"]
    for top in TOP:
        if top == "artifacts" or not (ROOT / top).is_dir():
            continue
        files += [path for path in sorted((ROOT / top).rglob("*"))
                  if path.is_file() and path.name.endswith(CITING)
                  and "history" not in path.parts and "__pycache__" not in path.parts
                  and path != Path(__file__)]
    return files


def test_every_section_a_file_cites_by_name_is_on_its_page() -> None:
    names: dict[Path, set[str]] = {}
    missing = []
    for source in citing_files():
        text = CONTINUED.sub(" ", source.read_text(encoding="utf-8", errors="replace"))
        for match in SECTION.finditer(text):
            page = cited_page(match.group(1))
            if page is None or not page.exists():
                continue  # a path the test above checks, or a page name of another project
            cited = re.sub(r"[`*]", "", match.group(2) or match.group(3)).strip().lower()
            sections = names.setdefault(page, section_names(page))
            if not any(name.startswith(cited) for name in sections):
                missing.append(f"{source.relative_to(ROOT)}: {page.relative_to(ROOT)}, "
                               f"\"{match.group(2) or match.group(3)}\"")
    assert not missing, "\n".join(missing)


def test_the_section_finder_reads_a_citation_across_comment_lines() -> None:
    text = CONTINUED.sub(" ", '# see (docs/outbox-relay.md, "A topic that keeps\n# what it"), '
                                "and design.md 'One arming'")
    assert [m.group(1) for m in SECTION.finditer(text)] == ["docs/outbox-relay.md", "design.md"]
    assert [m.group(2) or m.group(3) for m in SECTION.finditer(text)] == [
        "A topic that keeps what it", "One arming"]
