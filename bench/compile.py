"""Compile time of every shipped contract: load + resolve + checks, then each target's
lowering and the whole bundle, beside the floor of reading and parsing the contract
alone, measured in the same run.

    python bench/compile.py [--repeat N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from machine import machine

from pcc.bundle import bundle_files
from pcc.contract.io import load
from pcc.lower import TARGET_MODULES, lower
from pcc.plan import compile_file

ROOT = Path(__file__).resolve().parents[1]


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(machine())
    header = f"{'contract':<28} {'operators':>9} {'parse':>8} {'check':>8} " + \
        " ".join(f"{t:>11}" for t in TARGET_MODULES) + f" {'bundle':>9}"
    print(header)
    for path in sorted((ROOT / "contracts").glob("*.prec")):
        c = compile_file(str(path))  # warms the catalog cache: catalogs are built once per process
        parse = best(lambda: load(str(path)), args.repeat)
        check = best(lambda: compile_file(str(path)), args.repeat)
        def fresh(fn):
            def run():
                c.plan.__dict__.pop("_lowered", None)  # lowering is cached per Plan; time it cold
                fn()
            return run

        targets = [best(fresh(lambda t=t: lower(c.plan, t)), args.repeat) for t in TARGET_MODULES]
        whole = best(fresh(lambda: bundle_files(c.plan)), args.repeat)
        print(f"{path.stem:<28} {len(c.plan.catalog.operators):>9} {parse * 1e3:>6.1f}ms {check * 1e3:>6.0f}ms "
              + " ".join(f"{t * 1e3:>9.0f}ms" for t in targets) + f" {whole * 1e3:>7.0f}ms", flush=True)
    print("after: " + machine())


if __name__ == "__main__":
    main()
