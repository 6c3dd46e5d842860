"""Seconds by test file from a run's JUnit file, the slowest first (docs/testing.md's table):

    .venv/bin/python -m tests.support.durations artifacts/junit.xml [HOW_MANY]"""

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def seconds_by_file(junit: Path) -> dict[str, float]:
    """Each file's tests' time (setup, call and teardown), by the file's path."""
    by_file: defaultdict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):  # noqa: S314
        path = case.get("classname", "").replace(".", "/") + ".py"
        by_file[path] += float(case.get("time", "0"))
    return dict(by_file)


def main(argv: list[str]) -> None:
    by_file = seconds_by_file(Path(argv[1]))
    slowest = sorted(by_file.items(), key=lambda item: -item[1])
    for path, seconds in slowest[:int(argv[2]) if len(argv) > 2 else None]:
        sys.stdout.write(f"{seconds:8.1f}  {path}\n")
    sys.stdout.write(f"{sum(by_file.values()):8.1f}  in all\n")


if __name__ == "__main__":
    main(sys.argv)
