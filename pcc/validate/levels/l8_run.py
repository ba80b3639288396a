"""Level 8, a bounded RL run (the runtime's own loop, N steps), and level 9, its profile.

Level 8 tracks rewards, entropy, ratios and clip fractions, routes and version age per step,
and compares the contract's run-level expectations (version age, clip fraction, KL) with the
worst step. Level 9 reads where each step's time went and what each sync moved, and what a
sync moves at the contract's own model shapes (the converter plan).
"""

from __future__ import annotations

import math
import statistics

from pcc.runtime.loop import PHASES, Run, RunConfig

from . import Outcome

LOOK = ["version age against max_staleness and the sync interval (rollout activation timing)",
        "importance ratios and clip fractions rising with version age: staleness, not precision",
        "reward falling while same-version |dlogp| stays flat: learning dynamics, not the numerics",
        "the per-step curves (rl.png) against levels 4-6: the first step whose mismatch departs"]
_KEYS = {"version_age": ("version_age", max), "version_age max": ("version_age", max),
         "version_age mean": ("version_age", statistics.mean), "clip_fraction": ("tis_clip_frac", max),
         "trainer_rollout_kl": ("trainer_rollout_kl", max), "reference_kl": ("reference_kl", max)}


def history(ctx) -> list[dict]:
    if "history" not in ctx.shared:
        cfg = RunConfig(steps=ctx.cfg.steps, seed=ctx.cfg.seed, prompts=16, group=4, lr=ctx.cfg.lr, warm=ctx.cfg.warm)
        run = Run(ctx.plan, cfg, None)
        ctx.shared["history"] = [run.step(s) for s in range(cfg.steps)]
    return ctx.shared["history"]


def run(ctx) -> Outcome:
    o = Outcome(look=list(LOOK))
    h = history(ctx)
    for metric, (key, agg) in _KEYS.items():
        vals = [m[key] for m in h if m.get(key) is not None]
        if vals:
            o.figures[metric] = agg(vals)
    for key in ("reward", "entropy", "is_weight_mean", "ppo_clip_frac", "same_version_abs_dlogp_p99",
                "route_agreement", "grad_norm"):
        vals = [m[key] for m in h if m.get(key) is not None]
        if vals:
            o.figures[f"{key} first/last"] = [vals[0], vals[-1]]
    o.data["history"] = [{k: m.get(k) for k in ("step", "reward", "entropy", "version_age", "rollout_version",
                                                 "same_version_abs_dlogp_p99", "route_agreement", "ppo_clip_frac",
                                                 "tis_clip_frac", "is_weight_mean")} for m in h]
    bad = [f"step {m['step']} {k}" for m in h for k in ("loss", "grad_norm", "reward", "entropy")
           if not math.isfinite(m[k])]
    o.check("non-finite step metrics", "==", 0, len(bad))
    mixed = [m["step"] for m in h if len(m["versions_in_batch"]) != 1]
    o.check("batches spanning two versions", "==", 0, len(mixed))
    return o


def profile(ctx) -> Outcome:
    from pcc.lower.converter import converter_plan

    o = Outcome(look=["the largest phase share: conversion (scale construction), transfer, rollout, train",
                      "bytes per sync against the converter plan: an unexpected full-weight sync"])
    h = history(ctx)
    secs = {p: sum(m["time"][p] for m in h) for p in PHASES}
    total = sum(secs.values()) or 1.0
    o.figures["seconds per phase"] = {p: round(v, 4) for p, v in secs.items()}
    o.figures["share per phase"] = {p: round(v / total, 4) for p, v in secs.items()}
    syncs = [m["sync_bytes"] for m in h if "sync_bytes" in m]
    o.figures["bytes per sync (measured)"] = statistics.mean(syncs) if syncs else 0
    o.figures["bytes per sync at the contract's shapes"] = _contract_sync(ctx, converter_plan)
    o.data["phases"] = secs
    return o


def _contract_sync(ctx, converter_plan) -> dict:
    """What a sync moves on the contract's own model (the converter plan), not the CPU stand-in."""
    plan = ctx.plan
    if ctx.compiled.model_override is not None:
        from pcc.lower import compile_file

        full = compile_file(ctx.compiled.path)
        plan = full.plan if full.ok else plan
    return {"model": plan.catalog.name, **converter_plan(plan)["sync"]}
