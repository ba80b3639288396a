"""The rollout engine: its own weights as the sync delivered them, sampling, and what it records.

It never sees trainer tensors: a version reaches it only as the converted tensors
of a manifest (`activate`), which it decodes into what its kernels consume (codes +
scales for real low-precision GEMMs, reconstructed values for weight-only ones).
Activation is atomic: a version is verified whole and swapped in with one
assignment, so a generation batch always runs on exactly one version.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pcc.numerics import Quantized, quantize, scaled_gemm
from pcc.numerics import formats as fm

from .calibrate import NVFP4_RANGE, quantize_static, static_targets

from .linear import Gemm
from .model import Arch, KVCache, bf16, forward, model_code
from .precision import kv_gemms, rollout_gemms
from .sync import verify
from .weights import convert_full, decode_operator


# An FP8 KV cache is quantized with static per-tensor k_scale / v_scale. pcc's checkpoint carries
# none, and SGLang (BaseKVCacheMethod) then uses 1.0 for both: so does this engine.
KV_STATIC = {"fp8_e4m3": fm.E4M3, "fp8_e5m2": fm.E5M2}
KV_SCALE = 1.0


@dataclass
class Weights:
    """One activated version: what arrived, the rollout checkpoint tensors, and their decoded forms."""

    version: int
    tensors: dict[str, torch.Tensor]  # rollout checkpoint layout: codes, scales, wide tensors, adapter tensors
    values: dict[str, torch.Tensor]  # float32 reconstructed weights (weight-only and wide GEMMs, norms, embed)
    quantized: dict[str, Quantized]  # codes + scales, for real low-precision GEMMs
    adapters: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    manifest: dict = field(default_factory=dict)
    wire: dict[str, torch.Tensor] = field(default_factory=dict)  # the tensors as transferred
    base: "Weights | None" = None  # the full-weight version an adapter sits on
    input_scales: dict[str, torch.Tensor] = field(default_factory=dict)  # static NVFP4 activation scales


@dataclass
class Batch:
    """Trajectories of one generation call, all at one weight version."""

    tokens: torch.Tensor  # [N, P + G]
    prompt_len: int
    logp: torch.Tensor  # behaviour log-prob of each generated token [N, G]
    logits: torch.Tensor  # behaviour log-softmax rows [N, G, V], for exact KL diagnostics
    routes: list[torch.Tensor]  # per MoE layer, expert ids [N, P + G - 1, k]
    version: torch.Tensor  # per generated token [N, G]


class RolloutEngine:
    def __init__(self, arch: Arch, plan, lora_scaling: float = 0.0):
        self.arch, self.plan = arch, plan
        self.gemms: dict[str, Gemm] = rollout_gemms(plan)
        self.kv = kv_gemms(plan)
        self.lora_scaling = lora_scaling
        self.active: Weights | None = None
        # An unquantized KV cache holds the activations' dtype: BF16 in the hand-written model (which rounds
        # K and V to BF16 already), FP32 in transformers' FP32 model (a BF16 cache there would be a
        # rollout-only rounding the trainer, which has no cache, never makes).
        self.kv_wide = bf16 if model_code() == "pcc" else (lambda t: t)

    # -- versions -------------------------------------------------------------------------
    def decode(self, man: dict, received: dict[str, torch.Tensor], base: Weights | None = None) -> Weights:
        """Verify a transfer against its manifest and build that version (nothing is activated here).

        Over a BF16 bridge the rollout side rebuilds its low-precision policy from the BF16
        weights (quantize + pack at install); otherwise the checkpoint tensors arrive converted."""
        verify(man, received)
        if man["moves"] == "adapter":
            if base is None:
                raise RuntimeError(f"version {man['version']}: an adapter needs an active base version")
            base = base.base or base
            ad = {}
            for k in received:
                if k.endswith(".lora_A.weight"):
                    mod = k.removesuffix(".lora_A.weight")
                    ad[mod + ".weight"] = (received[k].float(), received[mod + ".lora_B.weight"].float())
            return Weights(man["version"], {**base.tensors, **received}, base.values, base.quantized, ad, man,
                           received, base, base.input_scales)
        tensors = convert_full(self.plan, received) if man.get("bridge") == "bf16" else received
        values, quantized = {}, {}
        for i, op in enumerate(self.plan.catalog.operators):
            if op.family == "kv_cache":
                continue
            w = decode_operator(self.plan, i, tensors)
            g = self.gemms[op.tensor]
            if isinstance(w, torch.Tensor):
                values[op.tensor] = w
            elif g.mode == "real" and {"weight", "activation"} <= g.roles:
                quantized[op.tensor] = w
            else:
                values[op.tensor] = w.dequantize(torch.float32)
        # quantize_static is NVFP4's; a MIXED_PRECISION FP8 member's static scale is not simulated here
        scales = {op: tensors[name].float().reshape(()) for op, name in static_targets(self.plan).items()
                  if self.plan.layouts[self.plan.index[op]].input_range == NVFP4_RANGE}
        return Weights(man["version"], dict(tensors), values, quantized, {}, man, received, None, scales)

    def activate(self, man: dict, received: dict[str, torch.Tensor]) -> Weights:
        """Verify, decode, then swap in atomically; on any error the active version is untouched."""
        new = self.decode(man, received, self.active)
        self.active = new
        return new

    # -- execution --------------------------------------------------------------------------
    def _exec(self, w: Weights) -> "_RolloutExec":
        return _RolloutExec(self, w)

    @torch.no_grad()
    def generate(self, prompts: torch.Tensor, new_tokens: int, temperature: float, gen: torch.Generator) -> Batch:
        w = self.active
        ex = self._exec(w)
        cache = KVCache(self.arch.layers)
        logits, routes = forward(self.arch, ex, prompts, cache)
        route_parts = [[r] for r in routes.used]
        toks, lps, rows = [], [], []
        last = logits[:, -1]
        for t in range(new_tokens):
            lsm = torch.log_softmax(last / temperature, -1)
            nxt = torch.multinomial(lsm.exp(), 1, generator=gen)
            toks.append(nxt)
            lps.append(lsm.gather(-1, nxt))
            rows.append(lsm)
            if t + 1 < new_tokens:
                logits, routes = forward(self.arch, ex, nxt, cache)
                last = logits[:, -1]
                for parts, r in zip(route_parts, routes.used):
                    parts.append(r)
        gen_toks = torch.cat(toks, 1)
        n = prompts.shape[0]
        return Batch(torch.cat([prompts, gen_toks], 1), prompts.shape[1], torch.cat(lps, 1),
                     torch.stack(rows, 1), [torch.cat(p, 1) for p in route_parts],
                     torch.full((n, new_tokens), w.version, dtype=torch.long))

    @torch.no_grad()
    def score(self, w: Weights, tokens: torch.Tensor, prompt_len: int, temperature: float) -> torch.Tensor:
        """Log-probs of the generated tokens under version `w`, prefilled the way the engine scores."""
        logits, _ = forward(self.arch, self._exec(w), tokens[:, :-1], KVCache(self.arch.layers))
        lsm = torch.log_softmax(logits[:, prompt_len - 1:] / temperature, -1)
        return lsm.gather(-1, tokens[:, prompt_len:, None]).squeeze(-1)


class _RolloutExec:
    def __init__(self, eng: RolloutEngine, w: Weights):
        self.eng, self.w = eng, w

    def weight(self, name: str) -> torch.Tensor:
        return self.w.values[name]

    def linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        g = self.eng.gemms[name]
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        q, static = self.w.quantized.get(name), self.w.input_scales.get(name)
        if q is not None:  # real low-precision GEMM: quantized activation x stored codes + scales
            qx = quantize_static(x2, g.scheme, static) if static is not None else \
                quantize(x2.float().contiguous(), g.scheme, "activation", name=f"{name} rollout activation")
            y = scaled_gemm(qx, q)
        elif static is not None and "activation" in g.roles:
            y = quantize_static(x2, g.scheme, static).dequantize(torch.float32) @ self.w.values[name].t()
        else:
            y = g.operand(x2, "activation", name) @ self.w.values[name].t()
        y = bf16(y) if g.output == "bf16" else y
        ad = self.w.adapters.get(name)
        if ad is not None:
            a, b = ad
            y = bf16(y + bf16(bf16(bf16(x2) @ a.t()) @ b.t()) * self.eng.lora_scaling)
        return y.reshape(*shape[:-1], y.shape[-1])

    def kv(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        g = self.eng.kv.get(layer)
        if g is None:
            return self.eng.kv_wide(k), self.eng.kv_wide(v)
        fmt = KV_STATIC.get(g.scheme.format)
        if fmt is not None:  # SGLang: fp8(k / k_scale), static per tensor
            return tuple(fm.decode_fp8(fm.encode_fp8(t.float() / KV_SCALE, fmt)) * KV_SCALE for t in (k, v))
        return (g.operand(k, "activation", f"layer {layer} k cache"),
                g.operand(v, "activation", f"layer {layer} v cache"))
