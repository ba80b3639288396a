"""`pcc diff` speed on two frontier-size contracts: the K3-style kimi_k2 contract
(~70k operators) against the same contract moved from MXFP4 to NVFP4 on B200
(69,120 routed-expert tensors change), beside a baseline measured in the same run:
the naive per-tensor comparison of the two `pcc plan` JSON documents (dump both
plans, index every tensor's scheme per component in dicts, compare the dicts).
Compiling the two contracts is the same for both and is reported on its own.
Columns: `compare` is the Plan-vs-Plan comparison alone; `bytes` the two
`pcc.plan.explain` calls behind the memory/bytes-per-sync deltas; `engines` the
two plans lowered for each available engine target; `pcc diff` all of it with
consequences and text rendering (what the command does after compiling). The columns of a
pair run interleaved, in an order that alternates each round, each keeping its best of the rounds.

    python bench/diff.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from machine import interleaved, machine

from pcc.diff import diff_plans
from pcc.diff.compare import compare
from pcc.diff.engines import engine_changes
from pcc.diff.render import render
from pcc.plan import compile_file
from pcc.plan.dump import plan_json
from pcc.plan.explain import explain

ROOT = Path(__file__).resolve().parent.parent
PAIRS = {
    "k3 mxfp4 -> nvfp4": ("contracts/k3_mxfp4_lora.prec", "tests/diff/pairs/k3_nvfp4_lora.prec"),
    "k3 unchanged": ("contracts/k3_mxfp4_lora.prec", "contracts/k3_mxfp4_lora.prec"),
}


def naive(pa, pb) -> int:
    """Per-tensor dict comparison of the two canonical plan documents: tensors that differ."""
    def index(plan) -> dict[str, dict[str, tuple]]:
        doc = json.loads(plan_json(plan))
        out: dict[str, dict[str, tuple]] = {}
        for comp, entries in doc["components"].items():
            for e in entries:
                spec = json.dumps(doc["schemes"][e["scheme"]], sort_keys=True)
                for t in e["tensors"]:
                    out.setdefault(t, {})[comp] = (spec, e["gemm"], e["accumulate"], e["output"])
        return out

    a, b = index(pa), index(pb)
    return sum(a.get(t) != b.get(t) for t in set(a) | set(b))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(machine())
    print(f"best of {args.repeat} rounds, the columns of each pair interleaved in alternating order")
    print(f"{'pair':<18} {'operators':>9} {'changed':>8} {'compile A+B':>11} {'compare':>8} {'bytes':>7} "
          f"{'engines':>8} {'pcc diff':>9} {'naive plan-json diff':>21} {'speedup':>8}")
    for label, (a, b) in PAIRS.items():
        t = time.perf_counter()
        ca, cb = compile_file(str(ROOT / a)), compile_file(str(ROOT / b))
        compile_s = time.perf_counter() - t
        assert ca.ok and cb.ok, "bench contracts must check"
        def cold(fn):
            def run():
                for c in (ca, cb):
                    c.plan.__dict__.pop("_lowered", None)  # lowering is cached per Plan; time it cold
                return fn()
            return run

        t = interleaved({"pcc diff": cold(lambda: render(diff_plans(ca.plan, cb.plan), "text")),
                         "compare": lambda: compare(ca.plan, cb.plan),
                         "bytes": lambda: (explain(ca.plan), explain(cb.plan)),
                         "engines": cold(lambda: engine_changes(ca.plan, cb.plan)),
                         "naive": lambda: naive(ca.plan, cb.plan)}, args.repeat)
        ours, compare_s, bytes_s, engines_s, theirs = (t["pcc diff"], t["compare"], t["bytes"], t["engines"],
                                                       t["naive"])
        changed = naive(ca.plan, cb.plan)
        full = diff_plans(ca.plan, cb.plan)
        found = sum(r["tensors"] for rows in full["components"].values() for r in rows if r["family"] != "kv_cache")
        assert found == changed or not full["changed"] and changed == 0, (found, changed)
        bytes_s = bytes_s if full["consequences"]["bytes"] else 0.0
        engines_s = engines_s if full["changed"] else 0.0
        print(f"{label:<18} {len(ca.plan.catalog.operators):>9} {changed:>8} {compile_s * 1e3:>9.0f}ms "
              f"{compare_s * 1e3:>6.0f}ms {bytes_s * 1e3:>5.0f}ms {engines_s * 1e3:>6.0f}ms {ours * 1e3:>7.0f}ms "
              f"{theirs * 1e3:>19.0f}ms {theirs / ours:>7.1f}x", flush=True)
    print("after: " + machine())


if __name__ == "__main__":
    main()
