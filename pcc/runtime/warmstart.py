"""A short supervised warm start, so RL starts from a policy that sometimes succeeds. It trains plain
BF16 weights; the contract's numerics start with RL.

Why a stopping criterion and not a step count: learning to reverse is a phase transition. The loss sits
on a plateau (digits at chance) for 40-200 steps, then held-out exact match climbs from 0.05 to 0.8 in
10-30 steps. Where the transition falls depends on the seed and, through rounding, on the arithmetic
order (thread count, CPU kernels), so a fixed step count lands anywhere from "never right" to "always
right". The recipe therefore trains until the policy reaches a stated quality, measured on prompts it
never trains on: the expected exact match of temperature-1 sampling under the BF16 policy,
mean over held-out prompts of prod_i p(answer_i | prompt, answer_<i) (exact, by teacher forcing, no
sampling noise). It is measured every `eval_every` steps, and every step once it is within 4x of the
target, so training stops within one step of crossing it. A stream that does not reach the target in
`steps` steps is abandoned and training restarts from another seed stream (`attempts`); if none does,
the warm start fails loudly rather than hand RL a policy of unknown quality.

A recipe without `target` trains exactly `steps` steps (a deliberately barely-trained policy: on the
loss plateau, which is flat, so it is not on the knife edge either).

The result is cached in `$PCC_CACHE/warmstart/` (default `~/.cache/pcc`), keyed by a hash of its
inputs (architecture, task, seed, recipe) and of what computes it (the source of this module and of
the modules it runs: model, task, checkpoint; the torch version; the intra-op thread count and CPU
kernel level, which set the arithmetic order). Each file carries its own key and a SHA-256 over its
tensors in its safetensors metadata; a file that fails to parse, names another key, has other tensors
than the architecture's, or whose digest differs is reported (`CacheWarning`) and rebuilt, never used.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from pcc import resources
from pcc.lang.diagnostics import PccError

from . import checkpoint as _checkpoint
from . import hf_model as _hf_model
from . import model as _model
from . import task as _task
from .checkpoint import save_tensors
from .model import Arch, bf16, forward, init_weights
from .task import DIGIT0, ReverseTask

# Missing keys of any recipe take these values (so an old-style {"steps", "batch", "lr"} recipe is a
# fixed-step run with constant learning rate and Adam's default betas).
DEFAULTS = {"steps": 200, "batch": 64, "lr": 2e-3, "warmup": 0, "betas": [0.9, 0.999], "target": None,
            "held_out": 128, "eval_every": 5, "attempts": 1}

# The runtime's recipe. Numbers (tiny_moe, measured on 10 seeds, bench/runtime.py --warm-start):
# - lr 3e-3 with a 20-step linear warmup and beta2 0.98: the transition falls at steps 60-150 (at the
#   old constant 2e-3 / beta2 0.999: 45-230, 200 steps being mid-transition for seed 0); 5e-3 fails to
#   leave the plateau on some seeds within 500 steps.
# - target 0.3: held-out expected exact match; sampled at temperature 1 that is a partial reward of
#   about 0.8, so groups of 8 samples almost always hold both right and wrong answers (RL has a signal)
#   and there is room to improve. It is 6x the plateau's ceiling (< 0.05) and well below saturation.
# - steps 600: 4x the slowest transition seen; 3 attempts, so a stream that stalls costs time, not quality.
RECIPE = {"steps": 600, "batch": 64, "lr": 3e-3, "warmup": 20, "betas": [0.9, 0.98], "target": 0.3,
          "held_out": 128, "eval_every": 5, "attempts": 3}

HELD_OUT_SEED = 314159  # the held-out prompts: one fixed set, whatever the run's seed
_CODE = (sys.modules[__name__], _model, _hf_model, _task, _checkpoint)


class WarmStartError(PccError, RuntimeError):
    """No seed stream reached the recipe's target."""


class CacheWarning(UserWarning):
    """A warm-start cache file was unusable (damaged, or not what its name says) and is rebuilt."""


def cache_dir() -> Path:
    return resources.cache_dir("warmstart")


def recipe_of(recipe: dict | None) -> dict:
    """The full recipe: `recipe` over DEFAULTS (None: the runtime's RECIPE)."""
    out = dict(DEFAULTS)
    out.update(RECIPE if recipe is None else recipe)
    out["betas"] = [float(b) for b in out["betas"]]
    return out


def code_hash() -> str:
    """SHA-256 of the source of every module whose code computes the warm start."""
    h = hashlib.sha256()
    for mod in _CODE:
        h.update(mod.__name__.encode() + b"\0" + Path(mod.__file__).read_bytes() + b"\0")
    return h.hexdigest()


def environment() -> dict:
    """What sets the arithmetic order besides the code: torch, its intra-op threads, its CPU kernel level,
    and the model code (`model.model_code()`: transformers', at its version, or the hand-written one)."""
    cap = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")()
    code = _model.model_code()
    if code == "transformers":
        import transformers

        code += " " + transformers.__version__
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu": cap, "model": code}


def cache_key(arch: Arch, task: ReverseTask, seed: int, recipe: dict | None) -> str:
    doc = {"arch": dataclasses.asdict(arch), "task": dataclasses.asdict(task), "seed": seed,
           "recipe": recipe_of(recipe), "code": code_hash(), "env": environment()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:24]


class _Plain:
    """BF16 execution of float32 weights, for supervised training."""

    def __init__(self, w):
        self.w = w

    def linear(self, name, x):
        return bf16(bf16(x) @ bf16(self.w[name]).t())

    def weight(self, name):
        return self.w[name]

    def kv(self, layer, k, v):
        return k, v


# -- held-out prompts and the quality measure --------------------------------------------------------
def _code(task: ReverseTask, seq: torch.Tensor) -> list[tuple[int, ...]]:
    return [tuple(r) for r in (seq[:, 1:1 + task.digits] - DIGIT0).tolist()]


def held_out(task: ReverseTask, n: int) -> torch.Tensor:
    """n distinct supervised sequences that training never sees."""
    gen, rows, seen = torch.Generator().manual_seed(HELD_OUT_SEED), [], set()
    n = min(n, 10 ** task.digits // 2)
    while len(rows) < n:
        seq = task.sequences(n, gen)
        for code, row in zip(_code(task, seq), seq):
            if code not in seen and len(rows) < n:
                seen.add(code)
                rows.append(row)
    return torch.stack(rows)


def _train_batch(task: ReverseTask, n: int, gen: torch.Generator, banned: set) -> torch.Tensor:
    parts, have = [], 0
    while have < n:
        seq = task.sequences(n, gen)
        keep = torch.tensor([c not in banned for c in _code(task, seq)])
        parts.append(seq[keep])
        have += int(keep.sum())
    return torch.cat(parts)[:n]


@torch.no_grad()
def quality(arch: Arch, w: dict[str, torch.Tensor], task: ReverseTask, seqs: torch.Tensor) -> dict:
    """The BF16 policy on supervised sequences: `exact`, the expected exact match of temperature-1
    sampling (mean over prompts of the product of the answer tokens' teacher-forced probabilities);
    `position`, the mean probability of the right token per answer position; `greedy_exact`."""
    p = task.prompt_len
    logits, _ = forward(arch, _Plain(w), seqs[:, :-1])
    lsm = torch.log_softmax(logits[:, p - 1:], -1)
    lp = lsm.gather(-1, seqs[:, p:, None]).squeeze(-1)
    return {"exact": float(lp.sum(1).exp().mean()), "position": [round(float(x), 4) for x in lp.exp().mean(0)],
            "greedy_exact": float((lsm.argmax(-1) == seqs[:, p:]).all(1).float().mean())}


# -- training ----------------------------------------------------------------------------------------
def _streams(seed: int, attempt: int) -> tuple[int, int]:
    """(init seed, data seed) of an attempt. Attempt 0 is (seed, seed + 1); later ones are derived."""
    if attempt == 0:
        return seed, seed + 1
    h = hashlib.sha256(f"pcc-warmstart:{seed}:{attempt}".encode()).digest()
    return int.from_bytes(h[:4], "little"), int.from_bytes(h[4:8], "little")


def _train(arch: Arch, task: ReverseTask, seed: int, r: dict, progress=None) -> tuple[dict, dict]:
    held = held_out(task, r["held_out"])
    banned = set(_code(task, held))
    p, target, record = task.prompt_len, r["target"], {"attempts": []}
    for attempt in range(max(1, int(r["attempts"]))):
        init_seed, data_seed = _streams(seed, attempt)
        w = init_weights(arch, init_seed)
        for t in w.values():
            t.requires_grad_(True)
        opt = torch.optim.Adam(w.values(), lr=r["lr"], betas=tuple(r["betas"]))
        gen = torch.Generator().manual_seed(data_seed)
        ex, near, reached, q, steps = _Plain(w), False, False, None, 0
        for step in range(r["steps"]):
            for g in opt.param_groups:
                g["lr"] = r["lr"] * min(1.0, (step + 1) / r["warmup"]) if r["warmup"] else r["lr"]
            seq = _train_batch(task, r["batch"], gen, banned)
            logits, _ = forward(arch, ex, seq[:, :-1])
            loss = F.cross_entropy(logits[:, p - 1:].reshape(-1, arch.vocab), seq[:, p:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps = step + 1
            if progress is not None:
                progress(steps, r["steps"], float(loss.detach()))
            if target is not None and (near or steps % r["eval_every"] == 0):
                q = quality(arch, w, task, held)
                if q["exact"] >= target:
                    reached = True
                    break
                near = q["exact"] >= target / 4
        if q is None or steps % r["eval_every"]:
            q = quality(arch, w, task, held)
        record["attempts"].append({"init_seed": init_seed, "data_seed": data_seed, "steps": steps,
                                   "held_out_exact": round(q["exact"], 4)})
        if target is None or reached:
            record.update(steps=steps, attempt=attempt, held_out=q, loss=round(float(loss.detach()), 4))
            return {k: v.detach().clone() for k, v in w.items()}, record
    raise WarmStartError(f"the warm start reached no held-out exact match >= {target} in {r['attempts']} "
                         f"attempt(s) of {r['steps']} steps: {record['attempts']}")


# -- the cache ---------------------------------------------------------------------------------------
def digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _load(path: Path, key: str, arch: Arch) -> tuple[dict, dict] | None:
    """(weights, record) from a cache file that is whole and what its name says, else None (and a warning)."""
    if not path.is_file():
        return None
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        shapes = {k: tuple(v.shape) for k, v in tensors.items()}
        if meta.get("key") != key:
            problem = f"written for key {meta.get('key')!r}"
        elif shapes != arch.tensors() or any(v.dtype != torch.float32 for v in tensors.values()):
            problem = "its tensors are not the architecture's"
        elif digest(tensors) != meta.get("sha256"):
            problem = "its tensors do not match the SHA-256 it was written with"
        else:  # in the architecture's order, as training returns them: a cached warm start is the trained one
            return {k: tensors[k] for k in arch.tensors()}, json.loads(meta.get("record", "{}"))
    except Exception as exc:  # noqa: BLE001 - a damaged file raises whatever the parser meets first
        problem = f"unreadable ({type(exc).__name__}: {exc})"
    warnings.warn(f"warm-start cache {path} is not usable ({problem}); rebuilding it", CacheWarning, stacklevel=3)
    return None


def warm_start(arch: Arch, task: ReverseTask, seed: int, recipe: dict | None = None,
               progress=None, info: dict | None = None) -> tuple[dict[str, torch.Tensor], bool]:
    """(weights, cached?) of the recipe's supervised warm start (module docstring). `info`, when given,
    receives the training record: steps, attempt, held-out quality, key, code hash, environment."""
    r = recipe_of(recipe)
    key = cache_key(arch, task, seed, r)
    path = cache_dir() / f"{key}.safetensors"
    got = _load(path, key, arch)
    if got is not None:
        weights, record = got
        if info is not None:
            info.update(record, cached=True)
        return weights, True
    weights, record = _train(arch, task, seed, r, progress)
    record.update(key=key, code=code_hash()[:16], env=environment(), recipe=r)
    save_tensors(path, weights, {"key": key, "sha256": digest(weights), "record": json.dumps(record)})
    if info is not None:
        info.update(record, cached=False)
    return weights, False


__all__ = ["RECIPE", "DEFAULTS", "warm_start", "quality", "held_out", "cache_dir", "cache_key", "code_hash",
           "CacheWarning", "WarmStartError"]
