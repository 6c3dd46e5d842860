"""Named SQL queries, loaded from `.sql` files whose blocks start with `-- name: description`.

Every app keeps its statements in `<app>/sql/*.sql`; `query_files()` finds all of them, so that
one test plans every statement of the project.
"""

import re
from functools import cache
from pathlib import Path

from django.apps import apps

_HEADER = re.compile(r"^-- ([a-z_]+): .+$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, str]:
    """Split a queries file into {name: sql}; a block runs until the next header."""
    headers = list(_HEADER.finditer(text))
    queries: dict[str, str] = {}
    for index, header in enumerate(headers):
        end = headers[index + 1].start() if index + 1 < len(headers) else len(text)
        # Comment lines right under the header continue its description, not the statement.
        body = text[header.end() : end].strip().splitlines()
        while body and body[0].lstrip().startswith("--"):
            body.pop(0)
        sql = "\n".join(body).strip().rstrip(";").strip()
        if header[1] in queries:
            raise ValueError(f"query {header[1]!r} is defined twice")
        queries[header[1]] = sql
    return queries


@cache
def load(path: Path) -> dict[str, str]:
    """The named queries of `path`, parsed once per process."""
    return parse_queries(path.read_text(encoding="utf-8"))


class QueryFile:
    """The named queries of one file: `QUERIES["claim_batch"]` is that block's SQL."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __getitem__(self, name: str) -> str:
        return load(self.path)[name]


def query_files() -> list[Path]:
    """Every file of named queries under an installed app's `sql/` folder (scripts such as the
    roles script have no named block and are left out)."""
    found: list[Path] = []
    for config in apps.get_app_configs():
        folder = Path(config.path) / "sql"
        found += [path for path in sorted(folder.glob("*.sql")) if load(path)]
    return found
