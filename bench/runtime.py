"""The embedded runtime: steps per second and phase shares for shipped contracts, and how sync time
grows with model size for full-weight (BF16 and block-FP8) versus adapter sync, with the point where
requantizing at every update starts to pay for itself. Everything is measured in this run, from an
empty warm-start cache (a fresh directory per invocation unless --cache names one), with PCC_THREADS
intra-op threads (default 1, as `pcc run`); cores, load average and date are printed before and after.

    python bench/runtime.py                 # 30 steps per contract
    python bench/runtime.py --steps 10 --no-sizes
    python bench/runtime.py --warm-start --no-runs --no-sizes   # warm-start quality per seed x thread count
    python bench/runtime.py --validate --no-runs --no-sizes   # every shipped contract through pcc validate 1-8
    # the tests' configuration over 1-ulp perturbations of the warm start's initial weights:
    python bench/runtime.py --validate --no-runs --no-sizes --short --prompts 16 --ulps 0-3 --contracts k3_mxfp4_lora

The --warm-start table trains the runtime's warm start (tiny_moe) for each seed under 1 and 2 intra-op
threads, next to the old fixed-step recipe (200 steps, constant lr 2e-3) as the baseline, and prints
held-out expected exact match and the sampled reward of RL step 0 on tiny_cpu (block-FP8 rollout).

The --validate table runs each shipped contract on its CPU-size stand-in (`--model auto`) through
levels 1-8 with the contract's own expectations, and prints the headline figures and every failed check;
--seeds and --ulps repeat it over seeds and over 1-ulp perturbations of the warm start's initial weights
(another machine's rounding), to show which verdicts are properties of the contract and which are not.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from machine import machine

import torch

from pcc.models import load_catalog
from pcc.models.builtin import catalog_from_config
from pcc.runtime import warmstart as W
from pcc.runtime.contract import compile_for_runtime
from pcc.runtime.loop import PHASES, Run, RunConfig
from pcc.runtime.model import Arch, init_weights
from pcc.runtime.rollout import RolloutEngine
from pcc.runtime.session import set_threads
from pcc.runtime.task import ReverseTask
from pcc.runtime.sync import convert_adapter, manifest, receive, transfer
from pcc.runtime.trainer import Trainer
from pcc.runtime.weights import bridge_tensors

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ["tiny_cpu", "bf16_baseline", "unified_fp8", "miles_mode1", "glm52_fp8_rollout", "qwen38_nvfp4_lora",
             "k3_mxfp4_lora", "int4_qat_w4a16"]  # each on its stand-in (--model auto)
SIZES = (128, 384, 768)  # hidden size; 4 layers, 8 experts, expert width hidden/2


def bench_contracts(steps: int) -> None:
    print(f"\n== {steps}-step runs (prompts 64 x 8 samples) ==")
    head = (f"{'contract':20} {'warm s':>6} {'held-out EM':>11} {'wall s':>7} {'steps/s':>8} "
            f"{'reward first->last':>19} {'|dlogp| mean':>12}  phase share")
    print(head + "\n" + "-" * (len(head) + 50))
    for name in CONTRACTS:
        plan = compile_for_runtime(str(ROOT / "contracts" / f"{name}.prec"), "auto").plan
        t0 = time.perf_counter()
        run = Run(plan, RunConfig(steps=steps), None)
        warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        hist = [run.step(s) for s in range(steps)]
        wall = time.perf_counter() - t0
        r = [m["reward"] for m in hist]
        tot = {p: sum(m["time"][p] for m in hist) for p in PHASES}
        total = sum(tot.values())
        share = ", ".join(f"{p} {v / total:.0%}" for p, v in tot.items() if v / total >= 0.01)
        k = max(1, steps // 6)
        info = run.warm_info
        built = "cached" if info["cached"] else f"{warm:6.1f}"
        print(f"{name:20} {built:>6} {info['held_out']['exact']:11.3f} {wall:7.1f} {steps / wall:8.2f} "
              f"{statistics.mean(r[:k]):9.3f} -> "
              f"{statistics.mean(r[-k:]):.3f}"
              f" {statistics.mean(m['same_version_abs_dlogp_mean'] for m in hist):12.2e}  {share}")


OLD_RECIPE = {"steps": 200, "batch": 64, "lr": 2e-3}  # the fixed-step recipe before the stopping criterion


def _rl_step0(plan, seed: int, recipe: dict) -> dict:
    run = Run(plan, RunConfig(steps=1, seed=seed, warm=recipe), None)
    return run.step(0)


def bench_warm_start(seeds: list[int], threads: list[int]) -> None:
    plan = compile_for_runtime(str(ROOT / "contracts" / "tiny_cpu.prec")).plan
    arch, task = Arch.from_catalog(plan.catalog), ReverseTask()
    held = W.held_out(task, W.RECIPE["held_out"])
    print(f"\n== warm start on tiny_moe: runtime recipe (stop at held-out expected exact match "
          f"{W.RECIPE['target']}) vs the old fixed 200 steps ==")
    head = (f"{'recipe':8} {'threads':>7} {'seed':>4} {'steps':>5} {'attempt':>7} {'s':>5} {'held-out EM':>11} "
            f"{'greedy EM':>9}  {'RL step 0 reward':>16} {'exact':>6}")
    print(head + "\n" + "-" * len(head))
    before = torch.get_num_threads()
    try:
        for label, recipe in (("target", None), ("old 200", OLD_RECIPE)):
            for n in threads:
                torch.set_num_threads(n)
                for seed in seeds:
                    info, t0 = {}, time.perf_counter()
                    w, _ = W.warm_start(arch, task, seed, recipe, info=info)
                    dt = time.perf_counter() - t0
                    q = W.quality(arch, w, task, held)
                    m = _rl_step0(plan, seed, W.RECIPE if recipe is None else recipe)
                    print(f"{label:8} {n:7} {seed:4} {info['steps']:5} {info.get('attempt', 0):7} {dt:5.1f} "
                          f"{q['exact']:11.3f} {q['greedy_exact']:9.3f}  {m['reward']:16.3f} {m['exact_match']:6.3f}",
                          flush=True)
    finally:
        torch.set_num_threads(before)


SHORT = {"steps": 20, "batch": 32, "lr": 2e-3}  # the tests' warm start (tests/validate): the loss plateau


@contextlib.contextmanager
def _ulp_perturbed(k: int):
    """Warm starts whose initial weights differ from the real ones by one float32 ulp in a seeded random
    direction per element (k = 0: unchanged): what another machine's rounding does to the first step. Each k
    gets its own warm-start cache (the key does not know about the perturbation)."""
    orig, cache = W.init_weights, os.environ["PCC_CACHE"]

    def init(arch, seed):
        w = orig(arch, seed)
        g = torch.Generator().manual_seed(1000 + k)
        return {n: t * (1 + 2.0 ** -23 * (torch.randint(0, 2, t.shape, generator=g) * 2 - 1)) for n, t in w.items()}

    if k:
        W.init_weights = init
        os.environ["PCC_CACHE"] = f"{cache}/ulp{k}"
    try:
        yield
    finally:
        W.init_weights, os.environ["PCC_CACHE"] = orig, cache


def bench_validate(steps: int, names: list[str], seeds: list[int], ulps: list[int], short: bool,
                   prompts: int) -> None:
    from pcc.validate.context import ValidateConfig
    from pcc.validate.ladder import validate

    warm = "the tests' 20-step warm start" if short else "the runtime's warm start"
    print(f"\n== pcc validate --levels 1-8 --model auto, {warm}, {prompts} prompts x 2 "
          f"(level 8: {steps} steps) ==")
    head = (f"{'contract':26} {'model':16} {'seed':>4} {'ulp':>3} {'result':6} {'s':>4} {'L4 p99':>7} {'bound':>6} "
            f"{'L5 dec/pre':>10} {'routes':>6} {'L6 cos':>6} {'ratio':>5} {'drift':>6} {'L7 cos':>6}  failed checks")
    print(head + "\n" + "-" * (len(head) + 30))
    for name in names:
        path = ROOT / "contracts" / f"{name}.prec"
        for seed in seeds:
            for k in ulps:
                cfg = ValidateConfig(steps=steps, seed=seed, prompts=prompts,
                                     **({"warm": dict(SHORT)} if short else {}))
                t0 = time.perf_counter()
                with _ulp_perturbed(k), tempfile.TemporaryDirectory() as out:
                    r = validate(str(path), list(range(1, 9)), Path(out), model="auto", keep_going=True,
                                 plots=False, cfg=cfg)
                by = {lv["level"]: lv for lv in r["levels"]}
                f = {lv: by.get(lv, {}).get("figures", {}) for lv in (4, 5, 6, 7)}
                bound = next((c["value"] for c in by.get(4, {}).get("checks", []) if c["metric"].endswith("p99")),
                             None)
                bad = [f"L{lv['level']} {c['metric']} {_num(c['observed'])} (want {c['op']} {c['value']})"
                       for lv in r["levels"] for c in lv["checks"] if c["ok"] is not True]
                bad += [f"L{lv['level']} error: {lv['error']}" for lv in r["levels"] if lv["status"] == "error"]
                print(f"{name:26} {r['model'] or '-':16} {seed:4} {k:3} {'pass' if r['ok'] else 'FAIL':6} "
                      f"{time.perf_counter() - t0:4.0f} {_num(f[4].get('same_version abs_dlogp p99')):>7} "
                      f"{_num(bound):>6} {_num(f[5].get('decode vs prefill abs_dlogp p99')):>10} "
                      f"{_num(f[5].get('route_agreement')):>6} {_num(f[6].get('change cosine')):>6} "
                      f"{_num(f[6].get('change ratio')):>5} {_num(f[6].get('baseline_drift abs_dlogp p99')):>6} "
                      f"{_num(f[7].get('lowest gradient cosine')):>6}  " + "; ".join(bad), flush=True)


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
    ap.add_argument("--contracts", help="--validate: these shipped contracts (comma-separated; default all)")
    ap.add_argument("--ulps", default="0", help="--validate: initial-weight ulp perturbations, e.g. 0-3 (0: none)")
    ap.add_argument("--short", action="store_true", help="--validate: the tests' 20-step warm start")
    ap.add_argument("--prompts", type=int, default=32, help="--validate: fixed prefixes (the ladder's default 32)")
    ap.add_argument("--warm-start", action="store_true", help="warm-start quality per seed and thread count")
    ap.add_argument("--seeds", help="--warm-start seeds (default 0-9), --validate seeds (default 0)")
    ap.add_argument("--threads", default="1,2", help="--warm-start intra-op thread counts")
    ap.add_argument("--cache", help="warm-start cache directory (default: a fresh empty one)")
    a = ap.parse_args()
    os.environ["PCC_CACHE"] = a.cache or tempfile.mkdtemp(prefix="pcc-bench-cache-")
    if not a.cache:
        atexit.register(shutil.rmtree, os.environ["PCC_CACHE"], True)
    set_threads()
    print(f"{machine()}; PCC_THREADS={torch.get_num_threads()}; warm-start cache {os.environ['PCC_CACHE']} "
          f"({'empty' if not any((Path(os.environ['PCC_CACHE']) / 'warmstart').glob('*')) else 'not empty'}); "
          f"torch {torch.__version__}")
    if a.warm_start:
        bench_warm_start(_ints(a.seeds or "0-9"), _ints(a.threads))
    if not a.no_runs:
        bench_contracts(a.steps)
    if a.validate:
        names = a.contracts.split(",") if a.contracts else sorted(p.stem for p in (ROOT / "contracts").glob("*.prec"))
        bench_validate(a.validate_steps, names, _ints(a.seeds or "0"), _ints(a.ulps), a.short, a.prompts)
    if not a.no_sizes:
        bench_sizes()
    print("after: " + machine())


def _ints(spec: str) -> list[int]:
    out = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


if __name__ == "__main__":
    main()
