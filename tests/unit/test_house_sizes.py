"""The house's sizes, kept: no function over 60 lines and no class over 250 anywhere in the
code, the benchmarks and the tests (migrations aside: Django writes them); outbox/ in at most
twelve product modules. Cyclomatic complexity has its bound in ruff (C901, pyproject.toml)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pin_profile", "core", "reminders", "outbox", "audit", "devtools", "bench", "tests")
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 250
MAX_OUTBOX_MODULES = 12


def python_files() -> list[Path]:
    return [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
            if "migrations" not in path.parts]


def oversized(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > bound:
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {lines} lines "
                             f"(at most {bound})")
    return found


def test_no_function_or_class_is_over_its_bound() -> None:
    files = python_files()
    assert len(files) > 100, "the walk found too few files to mean anything"
    found = [line for path in files for line in oversized(path)]
    assert not found, "\n".join(found)


def test_outbox_is_at_most_twelve_product_modules() -> None:
    modules = sorted(path.name for path in (ROOT / "outbox").glob("*.py")
                     if path.name != "__init__.py")
    assert (ROOT / "outbox" / "__init__.py").read_text() == "", "outbox/__init__.py holds code"
    assert len(modules) <= MAX_OUTBOX_MODULES, modules


def test_the_size_check_sees_a_long_function(tmp_path: Path) -> None:
    source = tmp_path / "long.py"
    source.write_text("def f() -> None:\n" + "    pass\n" * MAX_FUNCTION_LINES)
    assert oversized(source, tmp_path) == [f"long.py:1 f: {MAX_FUNCTION_LINES + 1} lines (at most 60)"]
