"""What every bench prints about the machine it ran on, and the CPU-bound neighbours of `--busy`.

Imported by the bench scripts (run as `python bench/NAME.py`, so this folder is on sys.path)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time


def machine() -> str:
    """Cores (and how many this process may use), load average (1, 5, 15 min) and the time."""
    return (f"{os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), load average "
            + " ".join(f"{x:.2f}" for x in os.getloadavg()) + time.strftime(", %Y-%m-%d %H:%M %Z"))


def add_busy(parser) -> None:
    """`--busy [N]`: N CPU-bound processes (1 when N is left out) run beside the whole bench."""
    parser.add_argument("--busy", type=int, nargs="?", const=1, default=0, metavar="N",
                        help="run N CPU-bound processes beside the bench (default 1)")


@contextlib.contextmanager
def busy(n: int):
    """N processes spinning on a core each for the duration; a line saying so is printed."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    if n:
        print(f"beside {n} CPU-bound process{'es' if n > 1 else ''} (--busy {n})")
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
            h.wait()
