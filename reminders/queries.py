"""Named SQL queries, loaded from `.sql` files whose blocks start with `-- name: description`."""

import re
from functools import cache
from pathlib import Path

_HEADER = re.compile(r"^-- ([a-z_]+): .+$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, str]:
    """Split a queries file into {name: sql}; a block runs until the next header."""
    headers = list(_HEADER.finditer(text))
    queries: dict[str, str] = {}
    for index, header in enumerate(headers):
        end = headers[index + 1].start() if index + 1 < len(headers) else len(text)
        sql = text[header.end() : end].strip().rstrip(";").strip()
        if header[1] in queries:
            raise ValueError(f"query {header[1]!r} is defined twice")
        queries[header[1]] = sql
    return queries


@cache
def load(path: Path) -> dict[str, str]:
    """The named queries of `path`, parsed once per process."""
    return parse_queries(path.read_text(encoding="utf-8"))
