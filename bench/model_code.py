"""The runtime's two model codes on the same weights and batches: transformers' modeling code with pcc's
linears swapped in (`pcc/runtime/hf_model.py`, the default) against the hand-written model
(`pcc/runtime/model.py`, `PCC_MODEL_CODE=pcc`), the baseline. Each row times one call of the work a run
does, with BF16 GEMMs (the warm start's execution), on one intra-op thread (as `pcc run`), interleaved
in alternating order, best of --rounds:

- fwd+bwd 512x10: the trainer's re-score and backward of one RL step (64 prompts x 8 samples);
- fwd+bwd 64x10: one warm-start step;
- generate 512: the rollout's prefill of 6 prompt tokens and 4 cached decode steps.

    python bench/model_code.py
    python bench/model_code.py --rounds 9 --models tiny_moe
"""

from __future__ import annotations

import argparse

import torch
from machine import add_busy, busy, interleaved, machine

from pcc.models import load_catalog
from pcc.runtime import hf_model
from pcc.runtime.model import Arch, KVCache, init_weights, pcc_forward
from pcc.runtime.warmstart import _Plain


def cases(arch: Arch):
    w = {k: v.requires_grad_(True) for k, v in init_weights(arch, 0).items()}
    ex = _Plain(w)
    g = torch.Generator().manual_seed(0)
    big, small = (torch.randint(0, arch.vocab, (n, 10), generator=g) for n in (512, 64))

    def fwd_bwd(fwd, toks):
        def run():
            for t in w.values():
                t.grad = None
            logits, _ = fwd(arch, ex, toks)
            torch.log_softmax(logits, -1).mean().backward()
        return run

    def generate(fwd):
        @torch.no_grad()
        def run():
            cache = KVCache(arch.layers)
            fwd(arch, ex, big[:, :6], cache)
            for t in range(6, 10):
                fwd(arch, ex, big[:, t:t + 1], cache)
        return run

    for label, make in (("fwd+bwd 512x10", lambda f: fwd_bwd(f, big)), ("fwd+bwd 64x10", lambda f: fwd_bwd(f, small)),
                        ("generate 512", generate)):
        yield label, {"transformers": make(hf_model.forward), "pcc": make(pcc_forward)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--models", default="tiny_moe,tiny_shared_moe,tiny_dense")
    add_busy(ap)
    args = ap.parse_args()
    if hf_model.unavailable():
        raise SystemExit(f"transformers' model code cannot run here: {hf_model.unavailable()}")
    torch.set_num_threads(1)
    print(machine())
    rows = []
    with busy(args.busy):
        for name in args.models.split(","):
            arch = Arch.from_catalog(load_catalog(name))
            hf_model.build(arch)
            for label, methods in cases(arch):
                best = interleaved(methods, args.rounds, warm=True)
                rows.append((name, label, best["pcc"], best["transformers"]))
    print(f"{'model':<16} {'work':<16} {'pcc ms':>9} {'transformers ms':>16} {'pcc / transformers':>19}")
    print("-" * 80)
    for name, label, a, b in rows:
        print(f"{name:<16} {label:<16} {a * 1e3:9.1f} {b * 1e3:16.1f} {a / b:19.2f}")
    print("after: " + machine())


if __name__ == "__main__":
    main()
