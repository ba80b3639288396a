"""The embedded runtime: steps per second and phase shares for shipped contracts, and how sync time
grows with model size for full-weight (BF16 and block-FP8) versus adapter sync, with the point where
requantizing at every update starts to pay for itself. Everything is measured in this run.

    python bench/runtime.py                 # 30 steps per contract
    python bench/runtime.py --steps 10 --no-sizes
    python bench/runtime.py --validate --no-runs --no-sizes   # every shipped contract through pcc validate 1-8

The --validate table runs each shipped contract on its CPU-size stand-in (`--model auto`) through
levels 1-8 with the contract's own expectations, and prints the headline figures and every failed check.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PCC_CACHE", str(Path(tempfile.gettempdir()) / "pcc-bench-cache"))

import torch  # noqa: E402

from pcc.models import load_catalog  # noqa: E402
from pcc.models.builtin import catalog_from_config  # noqa: E402
from pcc.runtime.contract import compile_for_runtime  # noqa: E402
from pcc.runtime.loop import PHASES, Run, RunConfig  # noqa: E402
from pcc.runtime.model import Arch, init_weights  # noqa: E402
from pcc.runtime.rollout import RolloutEngine  # noqa: E402
from pcc.runtime.task import ReverseTask  # noqa: E402
from pcc.runtime.sync import convert_adapter, manifest, receive, transfer  # noqa: E402
from pcc.runtime.trainer import Trainer  # noqa: E402
from pcc.runtime.weights import bridge_tensors  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ["tiny_cpu", "bf16_baseline", "unified_fp8", "miles_mode1", "glm52_fp8_rollout", "qwen38_nvfp4_lora",
             "k3_mxfp4_lora", "int4_qat_w4a16"]  # each on its stand-in (--model auto)
SIZES = (128, 384, 768)  # hidden size; 4 layers, 8 experts, expert width hidden/2


def bench_contracts(steps: int) -> None:
    print(f"\n== {steps}-step runs (prompts 64 x 8 samples) ==")
    head = f"{'contract':20} {'wall s':>7} {'steps/s':>8} {'reward first->last':>19} {'|dlogp| mean':>12}  phase share"
    print(head + "\n" + "-" * (len(head) + 50))
    for name in CONTRACTS:
        plan = compile_for_runtime(str(ROOT / "contracts" / f"{name}.prec"), "auto").plan
        run = Run(plan, RunConfig(steps=steps), None)
        t0 = time.perf_counter()
        hist = [run.step(s) for s in range(steps)]
        wall = time.perf_counter() - t0
        r = [m["reward"] for m in hist]
        tot = {p: sum(m["time"][p] for m in hist) for p in PHASES}
        total = sum(tot.values())
        share = ", ".join(f"{p} {v / total:.0%}" for p, v in tot.items() if v / total >= 0.01)
        k = max(1, steps // 6)
        print(f"{name:20} {wall:7.1f} {steps / wall:8.2f} {statistics.mean(r[:k]):9.3f} -> "
              f"{statistics.mean(r[-k:]):.3f}"
              f" {statistics.mean(m['same_version_abs_dlogp_mean'] for m in hist):12.2e}  {share}")


def bench_validate(steps: int) -> None:
    from pcc.validate.context import ValidateConfig
    from pcc.validate.ladder import validate

    print(f"\n== pcc validate --levels 1-8 --model auto, every shipped contract (level 8: {steps} steps) ==")
    head = (f"{'contract':26} {'model':16} {'result':6} {'s':>5} {'L4 p99':>7} {'bound':>6} {'L5 dec/pre':>10} "
            f"{'routes':>6}  failed checks")
    print(head + "\n" + "-" * (len(head) + 30))
    for path in sorted((ROOT / "contracts").glob("*.prec")):
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as out:
            r = validate(str(path), list(range(1, 9)), Path(out), model="auto", keep_going=True, plots=False,
                         cfg=ValidateConfig(steps=steps))
        by = {lv["level"]: lv for lv in r["levels"]}
        f4, f5 = by.get(4, {}).get("figures", {}), by.get(5, {}).get("figures", {})
        bound = next((c["value"] for c in by.get(4, {}).get("checks", []) if c["metric"].endswith("p99")), None)
        bad = [f"L{lv['level']} {c['metric']} {_num(c['observed'])} (want {c['op']} {c['value']})"
               for lv in r["levels"] for c in lv["checks"] if c["ok"] is not True]
        bad += [f"L{lv['level']} error: {lv['error']}" for lv in r["levels"] if lv["status"] == "error"]
        print(f"{path.stem:26} {r['model'] or '-':16} {'pass' if r['ok'] else 'FAIL':6} {time.perf_counter() - t0:5.0f} "
              f"{_num(f4.get('same_version abs_dlogp p99')):>7} {_num(bound):>6} "
              f"{_num(f5.get('decode vs prefill abs_dlogp p99')):>10} {_num(f5.get('route_agreement')):>6}  "
              + "; ".join(bad))


def _num(x) -> str:
    return "-" if x is None else f"{x:.3g}" if isinstance(x, float) else str(x)


def _catalog(h: int):
    cfg = dict(load_catalog("tiny_moe").config)
    cfg.update(hidden_size=h, moe_intermediate_size=h // 2, intermediate_size=2 * h, head_dim=h // 4)
    return catalog_from_config(f"tiny_moe_h{h}", cfg)


def _timed(fn, reps: int = 5):
    best = None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return out, best


def _sync_seconds(plan, weights, trainer=None) -> tuple[float, int]:
    """Seconds per update for convert + transfer + verify + install, and the bytes the rollout then holds."""
    bridge = plan.contract.sync.bridge
    eng = RolloutEngine(Arch.from_catalog(plan.catalog), plan, trainer.scaling if trainer else 0.0)
    if trainer is not None:  # adapter: the base is installed once, then only the adapter moves
        base = bridge_tensors(plan, weights, bridge)
        eng.activate(manifest(0, "full_weights", base, bridge), base)

    def once():
        if trainer is not None:
            t, man = convert_adapter(trainer.adapters), None
            man = manifest(1, "adapter", t)
        else:
            t = bridge_tensors(plan, weights, bridge)
            man = manifest(1, "full_weights", t, bridge)
        w = eng.decode(man, receive(transfer(t, 64 << 20)), eng.active)
        return sum(x.numel() * x.element_size() for k, x in w.tensors.items() if ".lora_" not in k)

    held, dt = _timed(once)
    return dt, held


def _read_bandwidth() -> float:
    """Bytes per second this machine streams through memory (a large tensor sum), for the decode model."""
    x = torch.ones(64 << 20, dtype=torch.float32)
    _, dt = _timed(lambda: float(x.sum()), 5)
    return x.numel() * 4 / dt


def bench_sizes() -> None:
    bw = _read_bandwidth()
    print(f"\n== sync per update vs model size (convert + transfer + verify + install; "
          f"memory read {bw / 1e9:.1f} GB/s) ==")
    head = (f"{'hidden':>6} {'params':>8} {'bf16 full ms':>12} {'fp8 full ms':>11} {'adapter ms':>10} "
            f"{'fp8/adapter':>11} {'fp8 extra ms':>12} {'saved/decode ms':>15} {'break-even decodes':>18}")
    print(head + "\n" + "-" * len(head))
    for h in SIZES:
        cat = _catalog(h)
        arch = Arch.from_catalog(cat)
        w = init_weights(arch, 0)
        n = sum(t.numel() for t in w.values())
        p_bf16 = compile_for_runtime(str(ROOT / "contracts/bf16_baseline.prec"), catalog=cat).plan
        p_fp8 = compile_for_runtime(str(ROOT / "contracts/unified_fp8.prec"), catalog=cat).plan
        p_lora = compile_for_runtime(str(ROOT / "contracts/qwen38_nvfp4_lora.prec"), catalog=cat).plan
        t_bf16, b_bf16 = _sync_seconds(p_bf16, w)
        t_fp8, b_fp8 = _sync_seconds(p_fp8, w)
        t_ad, _ = _sync_seconds(p_lora, w, Trainer(arch, p_lora, w, 1e-4))
        saved = (b_bf16 - b_fp8) / bw  # weight bytes a memory-bound decode step no longer reads
        extra = t_fp8 - t_bf16  # what requantizing costs per update beyond a BF16 refresh
        print(f"{h:6} {n / 1e6:7.1f}M {t_bf16 * 1e3:12.1f} {t_fp8 * 1e3:11.1f} {t_ad * 1e3:10.2f} "
              f"{t_fp8 / t_ad:11.0f} {extra * 1e3:12.1f} {saved * 1e3:15.3f} {extra / saved:18.0f}")
    passes = ReverseTask().answer_len  # forward passes over the weights per generated batch (prefill + decodes)
    print(f"break-even decodes: weight-reading forward passes per update for FP8's halved weight reads to repay\n"
          f"its requantization. It falls with model size (per-tensor overheads dominate small models): this task\n"
          f"makes {passes} passes per update, below every break-even, so its FP8 refresh costs more than it saves\n"
          f"(the seed's small-model warning); rollouts of a few hundred tokens per update cross over at these sizes.\n"
          f"Adapter sync stays flat with model size.")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--no-sizes", action="store_true")
    ap.add_argument("--no-runs", action="store_true")
    ap.add_argument("--validate", action="store_true", help="run every shipped contract through pcc validate 1-8")
    ap.add_argument("--validate-steps", type=int, default=6, help="level-8 RL steps per contract")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if not a.no_runs:
        bench_contracts(a.steps)
    if a.validate:
        bench_validate(a.validate_steps)
    if not a.no_sizes:
        bench_sizes()


if __name__ == "__main__":
    main()
