"""`pcc experiment trainer-variants`: the seed's Table 5 on the embedded runtime.

The rollout stays at the contract's quantized scheme; the trainer runs as (a) BF16,
(b) forward QDQ, (c) forward and backward QDQ, (d) the emulated real low-precision
GEMM, each against the rollout's per-operator scheme, from the same warm start over
the same prompts and sampling seeds. Reported per variant: same-version
trainer-rollout |dlogp| and KL to the BF16 reference (the BF16 execution of the
warm-start weights), at step 0 and averaged over the steps.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from .loop import Run, RunConfig
from .precision import VARIANTS

LABELS = {"bf16": "(a) BF16", "fwd_qdq": "(b) forward QDQ", "fwd_bwd_qdq": "(c) forward + backward QDQ",
          "real": "(d) emulated real GEMM"}


def trainer_variants(plan, cfg: RunConfig, progress=None) -> dict:
    if not plan.quantized("rollout"):
        raise ValueError(f"contract '{plan.contract.name}': its rollout is not quantized, so the trainer variants "
                         "have nothing to match; use a contract with a low-precision rollout (e.g. unified_fp8.prec)")
    rows = []
    for v in VARIANTS:
        run = Run(plan, replace(cfg, variant=v), None)
        hist = [run.step(s) for s in range(cfg.steps)]
        if progress is not None:
            progress(v)
        mean = lambda k: statistics.mean(m[k] for m in hist)  # noqa: E731
        rows.append({"variant": v, "label": LABELS[v],
                     "abs_dlogp_mean": mean("same_version_abs_dlogp_mean"),
                     "abs_dlogp_p99": mean("same_version_abs_dlogp_p99"),
                     "trainer_rollout_kl": mean("trainer_rollout_kl"),
                     "reference_kl_step0": hist[0]["reference_kl"], "reference_kl": mean("reference_kl"),
                     "reward": mean("reward"), "route_agreement": mean("route_agreement") if run.arch.is_moe else None})
    base = rows[0]
    quant = rows[1:]
    finding = {
        "mismatch_lower": all(r["abs_dlogp_mean"] < base["abs_dlogp_mean"] for r in quant),
        "mismatch_ratio_worst": max(r["abs_dlogp_mean"] for r in quant) / max(base["abs_dlogp_mean"], 1e-30),
        "reference_kl_higher_step0": all(r["reference_kl_step0"] > base["reference_kl_step0"] for r in quant),
    }
    finding["reproduced"] = finding["mismatch_lower"] and finding["reference_kl_higher_step0"]
    return {"contract": plan.contract.name, "model": plan.catalog.name, "steps": cfg.steps, "seed": cfg.seed,
            "variants": rows, "finding": finding}


def render(res: dict) -> str:
    head = (f"{'trainer':28} {'|dlogp| mean':>12} {'|dlogp| p99':>11} {'tr-ro KL':>9} {'ref KL@0':>9} "
            f"{'ref KL':>8} {'reward':>7}")
    lines = [f"Table 5 on {res['model']} ({res['contract']}, {res['steps']} steps, seed {res['seed']}); "
             f"rollout at the contract's scheme", head, "-" * len(head)]
    for r in res["variants"]:
        lines.append(f"{r['label']:28} {r['abs_dlogp_mean']:12.2e} {r['abs_dlogp_p99']:11.2e} "
                     f"{r['trainer_rollout_kl']:9.2e} {r['reference_kl_step0']:9.2e} {r['reference_kl']:8.4f} "
                     f"{r['reward']:7.3f}")
    f = res["finding"]
    lines.append(f"quantized-forward variants agree with the rollout better than BF16: {f['mismatch_lower']} "
                 f"(worst |dlogp| ratio {f['mismatch_ratio_worst']:.3f}); their KL to the BF16 reference is higher: "
                 f"{f['reference_kl_higher_step0']}")
    lines.append("finding reproduced" if f["reproduced"] else "finding NOT reproduced")
    return "\n".join(lines)
