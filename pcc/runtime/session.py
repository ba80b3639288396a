"""One `pcc run`: the loop with a progress bar, then the run directory's summary, plots and final checkpoints."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from pcc.lang.outputs import write_atomic

from .checkpoint import save_model, save_tensors, write_json
from .contract import ContractError
from .loop import InjectedCrash, Run, RunConfig
from .report import render, summarize
from .rundir import identity, prepare, writer_lock
from .settings import SettingError
from .sync import SyncError

MAX_THREADS = 1024


def set_threads() -> None:
    """One intra-op thread unless PCC_THREADS says otherwise: the model's GEMMs are small, and on a
    shared 2-core machine a second thread costs more in contention than it gains."""
    import torch

    text = os.environ.get("PCC_THREADS", "1")
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_THREADS:
        raise SettingError(f"PCC_THREADS={text!r}: expected a whole number from 1 to {MAX_THREADS}")
    torch.set_num_threads(n)
    from .model import model_code

    model_code()  # PCC_MODEL_CODE, checked before anything runs (SettingError)


def _bar(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=initial, unit="step", file=sys.stderr, dynamic_ncols=True)


def execute(compiled, cfg: RunConfig, out: Path, resume: bool = False, plots: bool = True,
            progress: bool | None = None, force: bool = False) -> dict:
    """Run and write `out`; returns the summary (status "failed" with the error when a sync was refused).
    `out` is checked first (pcc.runtime.rundir): an existing run is continued only with `resume`, started
    again only with `force`, and a directory of other files never written into."""
    if plots:
        from .plots import require

        require()
    ref = compiled.plan.contract.model
    if compiled.model_override is None and ref is not None and ref.path is not None:
        raise ContractError(f"{compiled.path}: its model is the checkpoint {ref.path}, but the embedded runtime trains "
                            "its own warm-started weights, never a checkpoint's: the run would not be of that model; "
                            "pass --model with a catalog of the same structure (tiny_dense, tiny_moe, "
                            "tiny_shared_moe) to run the contract's precision on it")
    cfg.check()
    set_threads()
    out = Path(out)
    ident = identity(_lock(compiled.plan), compiled.model_override, cfg)
    with writer_lock(out):  # a second `pcc run` into the same directory is refused while this one runs
        prepare(out, ident, resume, force)
        out.mkdir(parents=True, exist_ok=True)
        return _execute(compiled, cfg, out, ident, resume, plots, progress)


def _execute(compiled, cfg: RunConfig, out: Path, ident: dict, resume: bool, plots: bool,
             progress: bool | None) -> dict:
    t0 = time.perf_counter()
    run = Run(compiled.plan, cfg, out, resume=resume)
    write_json(out / "run.json", {"contract": compiled.path, "model_override": compiled.model_override,
                                  "identity": ident,
                                  "config": {k: v for k, v in vars(cfg).items() if k != "fault"},
                                  "fault": vars(cfg.fault) if cfg.fault else None})
    bar = _bar(cfg.steps, run.start, sys.stderr.isatty() if progress is None else progress)
    error = None
    try:
        for s in range(run.start, cfg.steps):
            m = run.step(s)
            if bar is not None:
                bar.set_postfix(reward=f"{m['reward']:.3f}", dlogp=f"{m.get('same_version_abs_dlogp_mean', 0):.2e}",
                                age=m["version_age"])
                bar.update(1)
    except SyncError as exc:
        error = str(exc)
    except InjectedCrash:
        if bar is not None:
            bar.close()
        raise
    if bar is not None:
        bar.close()
    summary = summarize(run, run.history, time.perf_counter() - t0, error)
    summary["plan_lock"] = _lock(compiled.plan)
    summary["model_override"] = compiled.model_override
    summary["rollout_version"] = run.rollout.active.version
    summary["warm_start"] = {k: run.warm_info.get(k) for k in ("cached", "steps", "attempt", "held_out", "key")}
    write_json(out / "summary.json", summary)
    write_atomic(out / "summary.txt", render(summary) + "\n")
    save_model(out / "model", run.trainer.weights() | run.arch.buffers(), compiled.plan.catalog.config)
    save_tensors(out / "rollout" / "model.safetensors", run.rollout.active.tensors,
                 {"version": str(run.rollout.active.version)})
    if plots and run.history:
        from .plots import plot

        summary["plots"] = plot(run.history, out)
        write_json(out / "summary.json", summary)
    return summary


def _lock(plan) -> str:
    from pcc.plan.dump import lock_hash, plan_dict

    return lock_hash(plan_dict(plan))
