"""The promise, measured: mutate the shipped contracts N times, compile each as .prec and as YAML
through `pcc.lower.compile_file` + `bundle_files`, and count what happened.

    python bench/fuzz.py --n 2000            # CPU-size stand-in catalogs (what the test runs)
    python bench/fuzz.py --n 200 --real      # the contracts' own model catalogs (slower)

Prints how many mutated contracts checked and compiled, how many were rejected (by code),
and the failures that break the promise: tracebacks, twins that disagree. The mutations are
tests/test_fuzz_pipeline.py's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import test_fuzz_pipeline as F  # noqa: E402

from pcc.contract.io import load  # noqa: E402
from pcc.lower import compile_file  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--real", action="store_true", help="keep each contract's own model (no stand-in)")
    args = ap.parse_args()
    bases = {p: F._base(p) for p in F.CONTRACTS}
    moe = {p: load(str(p)).contract.routing_replay != "none" or "experts" in json.dumps(bases[p])
           for p in F.CONTRACTS}
    outcome, codes, broken = Counter(), Counter(), []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for path, seed in F._cases(args.n):
            base = bases[path]
            if args.real:  # mutate() swaps the model in; put the contract's own back
                import random

                d = F.mutate(base, random.Random(seed), moe[path])
                d["model"] = base["model"]
                case = Path(tmp) / f"c{seed}.prec"
                case.write_text(F._prec(d), encoding="utf-8")
                try:
                    c, _ = F._compile(case)
                    problem = None
                except Exception as exc:  # noqa: BLE001
                    c, problem = None, f"seed {seed}: {type(exc).__name__}: {exc}"
            else:
                problem = F.run_case(base, seed, moe[path], Path(tmp))
                c = compile_file(str(Path(tmp) / f"c{seed}.prec")) if not problem else None
            if problem:
                broken.append(f"{path.name}: {problem.splitlines()[0]}")
                outcome["broken"] += 1
                continue
            outcome["compiled" if c.ok else "rejected"] += 1
            codes.update({d.code for d in c.diagnostics if d.is_error})
    secs = time.perf_counter() - t0
    print(f"{'mutated contracts':<34}{args.n:>8}   ({'real catalogs' if args.real else 'stand-in catalogs'}, "
          f"{secs:.1f} s, {1000 * secs / args.n:.1f} ms each)")
    for k in ("compiled", "rejected", "broken"):
        print(f"  {k:<32}{outcome[k]:>8}")
    print("rejections by code (a contract counts once per code):")
    for code, n in sorted(codes.items()):
        print(f"  {code:<32}{n:>8}")
    for b in broken[:10]:
        print("BROKEN", b)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
