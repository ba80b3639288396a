"""The report's PNGs: |dlogp| histogram, |dlogp| by position (and as context grows), route
agreement by layer, version age per step. Each is written only when its level ran."""

from __future__ import annotations

import os
from pathlib import Path

from pcc.runtime.plots import save_png


def _level(report: dict, n: int) -> dict | None:
    return next((lv for lv in report["levels"] if lv["level"] == n and lv["status"] != "skipped" and lv["data"]), None)


def _bound(lv: dict, metric: str):
    return next((c["value"] for c in lv["checks"] if c["metric"] == metric and c["op"] in ("<=", ">=")), None)


def _save(fig, out: Path, name: str, written: list) -> None:
    """Laid out, written whole (`save_png`) and closed."""
    fig.tight_layout()
    written.append(save_png(fig, out / name, dpi=110))


def plot(report: dict, out: Path) -> list[str]:
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    out, written = Path(out), []
    l4, l5, l8 = _level(report, 4), _level(report, 5), _level(report, 8)
    title = f"{report['contract']} on {report['model']} ({report['engine']})"
    if l4:
        a = np.asarray(l4["data"]["abs_dlogp"], dtype=float)
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        floor = 1e-7
        lo = max(floor, a[a > 0].min()) if (a > 0).any() else floor
        bins = np.logspace(np.log10(lo), np.log10(max(a.max(), lo * 10)), 40)
        ax.hist(np.clip(a, lo, None), bins=bins, color="#4c72b0")
        ax.set_xscale("log")
        p99 = l4["figures"].get("same_version abs_dlogp p99")
        ax.axvline(p99, color="#dd8452", ls="--", label=f"p99 {p99:.3g}")
        b = _bound(l4, "same_version abs_dlogp p99")
        if b is not None:
            ax.axvline(b, color="#c44e52", label=f"bound {b:g}")
        zeros = int((a == 0).sum())
        ax.set_xlabel("same-version |dlogp| per token" + (f" ({zeros} exact zeros in the first bin)" if zeros else ""))
        ax.set_ylabel("tokens")
        ax.set_title(f"Level 4: trainer vs rollout, same tokens\n{title}", fontsize=9)
        ax.legend(fontsize=8)
        _save(fig, out, "dlogp_hist.png", written)

        pos = l4["data"]["by_position"]
        panels = 2 if l5 and "context_drift" in l5["data"] else 1
        fig, axes = plt.subplots(1, panels, figsize=(6.4 * panels, 3.8), squeeze=False)
        ax = axes[0][0]
        x = np.arange(len(pos["mean"]))
        ax.plot(x, pos["p99"], marker="o", label="p99")
        ax.plot(x, pos["mean"], marker=".", label="mean")
        if b is not None:
            ax.axhline(b, color="#c44e52", label=f"bound {b:g}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("generated token position")
        ax.set_ylabel("|dlogp|")
        ax.set_title("Level 4: |dlogp| tail by position", fontsize=9)
        ax.legend(fontsize=8)
        if panels == 2:
            ax = axes[0][1]
            ax.plot(l5["data"]["context_drift"], label="trainer vs rollout (prefill)")
            ax.plot(l5["data"]["decode_vs_prefill"], label="rollout decode vs prefill")
            ax.set_xlabel("position in the long context (after the first prompt)")
            ax.set_ylabel("mean |dlogp|")
            ax.set_title("Level 5: drift as context grows", fontsize=9)
            ax.legend(fontsize=8)
        _save(fig, out, "dlogp_by_position.png", written)
    if l5 and l5["data"].get("route_agreement_by_layer"):
        ra = l5["data"]["route_agreement_by_layer"]
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        first = l5["figures"].get("route_first_differing_layer")
        colors = ["#c44e52" if first is not None and i == first else "#4c72b0" for i in range(len(ra))]
        ax.bar(range(len(ra)), ra, color=colors)
        b = _bound(l5, "route_agreement")
        if b is not None:
            ax.axhline(b, color="#dd8452", ls="--", label=f"bound {b:g} (mean over layers)")
            ax.legend(fontsize=8)
        ax.set_ylim(min(0.5, min(ra) - 0.05), 1.01)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("MoE layer" + (f" (first differing: {first})" if first is not None else ""))
        ax.set_ylabel("tokens with the same experts")
        ax.set_title(f"Level 5: route agreement by layer\n{title}", fontsize=9)
        _save(fig, out, "routes_by_layer.png", written)
    if l8:
        h = l8["data"]["history"]
        steps = [m["step"] for m in h]
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        ax.step(steps, [m["version_age"] for m in h], where="mid", label="version age (trainer - rollout)")
        b = _bound(l8, "version_age")
        if b is not None:
            ax.axhline(b, color="#c44e52", ls="--", label=f"bound {b:g}")
        ax.set_xlabel("RL step")
        ax.set_ylabel("versions")
        ax.set_ylim(-0.5, max([m["version_age"] for m in h] + [b or 0]) + 1.5)
        ax2 = ax.twinx()
        ax2.plot(steps, [m["reward"] for m in h], color="#55a868", marker=".", label="reward")
        ax2.set_ylabel("reward")
        lines = ax.get_legend_handles_labels()
        lines2 = ax2.get_legend_handles_labels()
        ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="lower right")
        ax.set_title(f"Level 8: version age and reward per step\n{title}", fontsize=9)
        _save(fig, out, "version_age.png", written)
    return written
