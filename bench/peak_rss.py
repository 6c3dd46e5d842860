"""A process's own peak RSS, and a runner that reports a child's.

`os.wait4`'s `ru_maxrss` (and getrusage's) is not the child's own peak: Linux carries the
parent's resident size into the child across fork (or vfork) and exec, so a 20 MB command
started by a benchmark holding 600 MB reports 600 MB. VmHWM, the high-water mark of the
process's own memory map, starts afresh at exec.

    python -m bench.peak_rss FILE manage.py run_expiry_reminders ...
    python -m bench.peak_rss FILE -m bench.timed_relay

runs the program in this process (as `python <argv>` would) and writes its VmHWM in MB to
FILE at exit.
"""

import atexit
import runpy
import sys
from pathlib import Path


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM), in MB."""
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("VmHWM:"))) / 1024  # kB


def main() -> None:
    report, *argv = sys.argv[1:]
    atexit.register(lambda: Path(report).write_text(f"{peak_rss_mb()}\n"))
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
