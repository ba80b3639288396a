"""PNG plots of a run's curves (matplotlib; not a core dependency, so a clear error names it when missing)."""

from __future__ import annotations

import os
from pathlib import Path

from pcc.lang.diagnostics import PccError
from pcc.lang.outputs import atomic_path

CURVES = (
    ("reward", ("reward", "exact_match"), "reward"),
    ("mismatch", ("same_version_abs_dlogp_mean", "same_version_abs_dlogp_p99", "staleness_abs_dlogp_mean"), "|dlogp|"),
    ("kl", ("trainer_rollout_kl", "reference_kl"), "KL (nats/token)"),
    ("routing", ("route_agreement", "route_agreement_min"), "agreement"),
    ("corrections", ("tis_clip_frac", "ppo_clip_frac", "version_age"), "fraction / versions"),
)


class PlotError(PccError, RuntimeError):
    """Plots were asked for and matplotlib is missing (the message says how to get it)."""


def require():
    """pyplot, or a PlotError that says how to get it (checked before a run starts, not after)."""
    try:
        os.environ.setdefault("MPLBACKEND", "Agg")
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError("plots need matplotlib, which is not installed: pip install 'matplotlib>=3.7' "
                        "(or run with --no-plots)") from None
    return plt


def save_png(fig, path: Path, dpi: int) -> str:
    """`fig` written to `path` as a PNG, whole or not at all (`atomic_path`), and closed; its file name."""
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")
    plt.close(fig)
    return path.name


def plot(history: list[dict], out: Path) -> list[str]:
    """Write one PNG per curve group into `out`; returns the file names."""
    plt = require()
    steps = [m["step"] for m in history]
    written = []
    for name, keys, ylabel in CURVES:
        series = [(k, [m.get(k) for m in history]) for k in keys]
        series = [(k, v) for k, v in series if any(x is not None for x in v)]
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for k, v in series:
            ax.plot(steps, [float("nan") if x is None else x for x in v], label=k, marker=".")
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        written.append(save_png(fig, Path(out) / f"{name}.png", dpi=100))
    if history and history[-1].get("same_version_abs_dlogp_by_position"):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for m in (history[0], history[-1]):
            ax.plot(m["same_version_abs_dlogp_by_position"], marker="o", label=f"step {m['step']}")
        ax.set_xlabel("generated token position")
        ax.set_ylabel("mean same-version |dlogp|")
        ax.legend(fontsize=7)
        fig.tight_layout()
        written.append(save_png(fig, Path(out) / "mismatch_by_position.png", dpi=100))
    return written
