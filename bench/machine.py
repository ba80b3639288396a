"""What every bench prints about the machine it ran on, the CPU-bound neighbours of `--busy`, and how
benches time competitors: interleaved, in an order that alternates each round, each keeping its best.

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


def order(names: list, r: int) -> list:
    """Round r's order of the methods: as given on even rounds, reversed on odd ones, so a burst of load
    from other processes hits every method alike."""
    return names if r % 2 == 0 else names[::-1]


def interleaved(methods: dict, rounds: int, warm: bool = False) -> dict[str, float]:
    """Best seconds of each method (a callable) over `rounds` rounds in alternating `order`; `warm`:
    each runs once first, untimed (allocators, worker threads)."""
    if warm:
        for fn in methods.values():
            fn()
    best = dict.fromkeys(methods, float("inf"))
    for r in range(rounds):
        for name in order(list(methods), r):
            t = time.perf_counter()
            methods[name]()
            best[name] = min(best[name], time.perf_counter() - t)
    return best
