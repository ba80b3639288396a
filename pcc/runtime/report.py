"""The run's summary: reward trend, mismatch, timing, and the contract's `expect` bounds checked against the run."""

from __future__ import annotations

import statistics

from .loop import PHASES
from .model import model_code

_OPS = {"<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b,
        ">": lambda a, b: a > b, "==": lambda a, b: a == b}


def _series(history: list[dict], key: str) -> list[float]:
    return [m[key] for m in history if m.get(key) is not None]


def observed(e, history: list[dict]) -> float | None:
    """The run's value for one expectation: the worst step in the direction the bound constrains."""
    worst = max if e.op in ("<=", "<") else min
    stat = (e.stat or "").replace(" ", "_")
    if e.metric == "same_version":
        key = "trainer_rollout_kl" if stat == "kl" else f"same_version_{stat}"
    elif e.metric == "baseline_drift":
        s = _series(history, f"same_version_{stat}")
        return max(abs(x - s[0]) for x in s) if s else None
    elif e.metric == "version_age":
        s = _series(history, "version_age")
        return (statistics.mean(s) if stat == "mean" else max(s)) if s else None
    elif e.metric == "clip_fraction":
        key = "tis_clip_frac"
    else:
        key = e.metric
    s = _series(history, key)
    return worst(s) if s else None


def expectations(contract, history: list[dict]) -> list[dict]:
    out = []
    for e in contract.expect:
        v = observed(e, history)
        out.append({"expect": f"{e.key} {e.op} {e.value:g}", "observed": v,
                    "ok": None if v is None else bool(_OPS[e.op](v, e.value))})
    return out


def summarize(run, history: list[dict], wall: float, error: str | None = None) -> dict:
    c = run.plan.contract
    r = _series(history, "reward")
    k = max(1, min(5, len(r) // 3))
    times = {p: sum(m["time"][p] for m in history) for p in PHASES}
    total = sum(times.values()) or 1.0
    return {
        "contract": c.name, "model": run.plan.catalog.name, "model_code": model_code(), "steps": len(history),
        "seed": run.cfg.seed,
        "status": "failed" if error else "ok", "error": error,
        "reward_first": statistics.mean(r[:k]) if r else None, "reward_last": statistics.mean(r[-k:]) if r else None,
        "exact_match_last": statistics.mean(_series(history, "exact_match")[-k:]) if r else None,
        "same_version_abs_dlogp_mean": statistics.mean(_series(history, "same_version_abs_dlogp_mean") or [0.0]),
        "same_version_abs_dlogp_p99_max": max(_series(history, "same_version_abs_dlogp_p99") or [0.0]),
        "reference_kl_last": history[-1]["reference_kl"] if history else None,
        "version_age_max": max(_series(history, "version_age") or [0]),
        "sync_bytes_per_step": statistics.mean(_series(history, "sync_bytes") or [0]),
        "phase_seconds": {p: round(t, 4) for p, t in times.items()},
        "phase_share": {p: round(t / total, 4) for p, t in times.items()},
        "wall_seconds": round(wall, 3), "steps_per_second": round(len(history) / wall, 4) if wall else None,
        "warm_start_cached": run.warm_cached,
        "expectations": expectations(c, history),
    }


def render(s: dict) -> str:
    code = {"transformers": " (transformers' model code)", "pcc": " (hand-written model)"}.get(s.get("model_code"), "")
    lines = [f"{s['contract']} on {s['model']}{code}: {s['steps']} steps, {s['status']}"
             + (f" ({s['error']})" if s["error"] else "")]
    if s["reward_first"] is not None:
        lines.append(f"  reward        {s['reward_first']:.3f} -> {s['reward_last']:.3f}"
                     f"  (exact match {s['exact_match_last']:.3f} at the end)")
        lines.append(f"  same-version |dlogp| mean {s['same_version_abs_dlogp_mean']:.5f}, "
                     f"worst p99 {s['same_version_abs_dlogp_p99_max']:.4f}; reference KL {s['reference_kl_last']:.4f}")
        lines.append(f"  version age max {s['version_age_max']}, sync {s['sync_bytes_per_step'] / 1e6:.2f} MB/step, "
                     f"{s['steps_per_second']:.2f} steps/s")
        lines.append("  time share    " + ", ".join(f"{p} {v:.0%}" for p, v in s["phase_share"].items() if v >= 0.005))
    for e in s["expectations"]:
        mark = "n/a " if e["ok"] is None else ("ok  " if e["ok"] else "FAIL")
        val = "not measured" if e["observed"] is None else f"{e['observed']:.4g}"
        lines.append(f"  expect {mark} {e['expect']}  (observed {val})")
    return "\n".join(lines)
