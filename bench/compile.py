"""Compile time of every shipped contract (contracts/ and its per-target folders): load +
resolve + checks, then each target's lowering ('-' where it does not apply) and the whole
bundle, beside the floor of reading and parsing the contract alone, measured in the same
run. The columns of a contract run interleaved, in an order that alternates each round,
each keeping its best of the rounds.

    python bench/compile.py [--repeat N] [--contracts 'verl/*.prec']
"""

from __future__ import annotations

import argparse
from pathlib import Path

from machine import interleaved, machine

from pcc.bundle.write import bundle_files
from pcc.contract.io import load
from pcc.lower import TARGET_MODULES, Unsupported, lower
from pcc.plan import compile_file

ROOT = Path(__file__).resolve().parents[1]


def _lowers(plan, name: str) -> bool:
    """Does target `name` apply to this contract (a megatron contract has no FSDP lowering)? A table
    cell '-' where not."""
    try:
        lower(plan, name)
    except Unsupported:
        return False
    finally:
        plan.__dict__.pop("_lowered", None)
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--contracts", default="**/*.prec", help="which contracts, a glob under contracts/")
    args = ap.parse_args()
    print(machine())
    print(f"best of {args.repeat} rounds, the columns of each contract interleaved in alternating order")
    header = f"{'contract':<28} {'operators':>9} {'parse':>8} {'check':>8} " + \
        " ".join(f"{t:>11}" for t in TARGET_MODULES) + f" {'bundle':>9}"
    print(header)
    for path in sorted((ROOT / "contracts").glob(args.contracts)):  # the targets' own folders too
        label = str(path.relative_to(ROOT / "contracts").with_suffix(""))
        c = compile_file(str(path))  # warms the catalog cache: catalogs are built once per process
        def fresh(fn):
            def run():
                c.plan.__dict__.pop("_lowered", None)  # lowering is cached per Plan; time it cold
                fn()
            return run

        targets = [name for name in TARGET_MODULES if _lowers(c.plan, name)]
        t = interleaved({"parse": lambda: load(str(path)), "check": lambda: compile_file(str(path)),
                         **{name: fresh(lambda name=name: lower(c.plan, name)) for name in targets},
                         "bundle": fresh(lambda: bundle_files(c.plan))}, args.repeat)
        print(f"{label:<28} {len(c.plan.catalog.operators):>9} {t['parse'] * 1e3:>6.1f}ms "
              f"{t['check'] * 1e3:>6.0f}ms "
              + " ".join(f"{t[name] * 1e3:>9.0f}ms" if name in t else f"{'-':>11}" for name in TARGET_MODULES)
              + f" {t['bundle'] * 1e3:>7.0f}ms", flush=True)
    print("after: " + machine())


if __name__ == "__main__":
    main()
