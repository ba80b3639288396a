"""The trainer: parameters, master weights and optimizer moments at the plan's dtypes, each GEMM at its scheme.

Parameters hold values of the plan's `params` dtype (BF16 by default) and receive
FP32 gradients (`grads fp32`, Megatron's main grads); the optimizer updates a
master copy at `master` precision with moments stored at `moments` precision and
casts the result back. With `trainable lora` the base is frozen and only the
adapter (and its optimizer state) exists to train.
"""

from __future__ import annotations

import math

import torch

from pcc.numerics import qdq

from .linear import plan_linear
from .model import Arch, bf16, forward
from .precision import trainer_gemms

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def store(t: torch.Tensor, dtype: str) -> torch.Tensor:
    """Values as a tensor of `dtype` holds them (in float32 storage); FP8 state is E4M3 with a per-tensor scale."""
    if dtype == "fp8":
        return qdq(t, "fp8_tensor", "weight") if bool(t.abs().max() > 0) else t
    return t.to(DTYPES[dtype]).to(torch.float32)


class Trainer:
    def __init__(self, arch: Arch, plan, weights: dict[str, torch.Tensor], lr: float, variant: str | None = None,
                 seed: int = 0):
        self.arch, self.plan, self.lr = arch, plan, lr
        c = plan.contract
        self.cfg = c.trainer
        self.gemms = trainer_gemms(plan, variant)
        self.lora = c.trainable.kind == "lora"
        self.version = 0
        self.params = {k: store(v.float(), self.cfg.params) for k, v in weights.items()}
        ops = plan.catalog.operators
        self.adapters: dict[str, torch.Tensor] = {}
        if self.lora:
            r = c.trainable.rank
            self.scaling = (c.trainable.alpha or r) / r
            g = torch.Generator().manual_seed(seed + 7)
            for i in plan.trainable:
                mod = ops[i].tensor.removesuffix(".weight")
                out_f, in_f = ops[i].shape
                self.adapters[mod + ".lora_A.weight"] = torch.randn(r, in_f, generator=g) / math.sqrt(in_f)
                self.adapters[mod + ".lora_B.weight"] = torch.zeros(out_f, r)
            self.trained = self.adapters
        else:
            self.scaling = 0.0
            names = {ops[i].tensor for i in plan.trainable}
            self.trained = {k: v for k, v in self.params.items() if k in names}
        if not self.trained:
            raise ValueError(f"contract '{c.name}': 'trainable {c.trainable.kind}' leaves nothing to train")
        self.master = {k: store(v.clone(), self.cfg.master) for k, v in self.trained.items()}
        self.m = {k: torch.zeros_like(v) for k, v in self.trained.items()}
        self.v = {k: torch.zeros_like(v) for k, v in self.trained.items()}
        self.steps = 0
        for t in self.trained.values():
            t.requires_grad_(True)

    # -- forward ------------------------------------------------------------------------
    def linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        fp, dg, wg = self.gemms[name]
        y = plan_linear(x, self.params[name], fp, dg, wg, name)
        mod = name.removesuffix(".weight")
        a = self.adapters.get(mod + ".lora_A.weight")
        if a is not None:
            b = self.adapters[mod + ".lora_B.weight"]
            y = bf16(y + bf16(bf16(bf16(x) @ bf16(a).t()) @ bf16(b).t()) * self.scaling)
        return y

    def weight(self, name: str) -> torch.Tensor:
        return self.params[name]

    def kv(self, layer, k, v):  # the trainer has no KV cache
        return k, v

    def logprobs(self, tokens: torch.Tensor, prompt_len: int, temperature: float, replay=None):
        """Log-probs of the generated tokens, the full log-softmax rows, and the routes, at this version."""
        logits, routes = forward(self.arch, self, tokens[:, :-1], replay=replay)
        lsm = torch.log_softmax(logits[:, prompt_len - 1:] / temperature, -1)
        return lsm.gather(-1, tokens[:, prompt_len:, None]).squeeze(-1), lsm, routes

    # -- update -------------------------------------------------------------------------
    def step(self, loss: torch.Tensor, clip: float = 1.0) -> float:
        """Backward, clip the global gradient norm, one optimizer step on the master copy; version += 1."""
        for t in self.trained.values():
            t.grad = None
        loss.backward()
        grads = {k: (t.grad if t.grad is not None else torch.zeros_like(t)) for k, t in self.trained.items()}
        # fsum: the correctly rounded sum, whatever the order the parameters come in (two runs that must clip and
        # log the same norm may hold them in two orders: a cached warm start's file sorted them once)
        norm = math.sqrt(math.fsum(float(g.pow(2).sum()) for g in grads.values()))
        scale = min(1.0, clip / (norm + 1e-12))
        self.steps += 1
        b1, b2, eps = 0.9, 0.999, 1e-8
        with torch.no_grad():
            for k, t in self.trained.items():
                g = grads[k] * scale
                if self.cfg.optimizer.kind == "sgd":
                    upd = g
                else:
                    self.m[k] = store(b1 * self.m[k] + (1 - b1) * g, self.cfg.moments)
                    self.v[k] = store(b2 * self.v[k] + (1 - b2) * g * g, self.cfg.moments)
                    mh = self.m[k] / (1 - b1 ** self.steps)
                    vh = self.v[k] / (1 - b2 ** self.steps)
                    upd = mh / (vh.sqrt() + eps)
                self.master[k] = store(self.master[k] - self.lr * upd, self.cfg.master)
                t.copy_(self.master[k] if self.lora else store(self.master[k], self.cfg.params))
        self.version += 1
        return norm

    # -- state ---------------------------------------------------------------------------
    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.params.items()}

    def state(self) -> dict[str, torch.Tensor]:
        out = {f"param.{k}": v.detach() for k, v in self.params.items()}
        for pre, d in (("adapter.", self.adapters), ("master.", self.master), ("m.", self.m), ("v.", self.v)):
            out.update({pre + k: v.detach() for k, v in d.items()})
        return {k: v.contiguous() for k, v in out.items()}

    def load_state(self, st: dict[str, torch.Tensor], version: int, steps: int) -> None:
        with torch.no_grad():
            for k in self.params:
                self.params[k].copy_(st[f"param.{k}"])
            for k in self.adapters:
                self.adapters[k].copy_(st[f"adapter.{k}"])
            for pre, d in (("master.", self.master), ("m.", self.m), ("v.", self.v)):
                for k in d:
                    d[k] = st[pre + k].clone()
        self.version, self.steps = version, steps
