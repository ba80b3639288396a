"""A small decoder-only transformer named like the Hugging Face checkpoints the catalogs describe.

The architecture is written once, as a function of a weight source (`Exec`), so the
rollout engine and the trainer run the same model over their own representations:
RoPE attention with grouped KV heads (and Qwen3's per-head q/k RMSNorm), RMSNorm,
and an MoE MLP with softmax top-k routing (Qwen3-MoE) or a dense SwiGLU MLP (Llama).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

SUPPORTED = {"qwen3_moe": True, "qwen3": True, "llama": False, "mistral": False}  # model_type -> q/k norm


class ArchError(ValueError):
    """The catalog describes a model this runtime cannot build."""


@dataclass(frozen=True)
class Arch:
    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int
    experts: int
    topk: int
    moe_intermediate: int
    norm_topk: bool
    eps: float
    theta: float
    qk_norm: bool

    @classmethod
    def from_catalog(cls, catalog) -> "Arch":
        cfg = catalog.config.get("text_config", catalog.config)
        mt = cfg.get("model_type", "")
        if mt not in SUPPORTED:
            raise ArchError(f"model '{catalog.name}' (model_type {mt!r}) is not an architecture the embedded runtime "
                            f"builds ({', '.join(SUPPORTED)}); run with --model tiny_moe or tiny_dense")
        if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
            raise ArchError(f"model '{catalog.name}': mixed dense/MoE layers are not supported by the embedded runtime")
        heads = cfg["num_attention_heads"]
        moe = bool(cfg.get("num_experts"))
        return cls(mt, cfg["hidden_size"], cfg["num_hidden_layers"], heads, cfg.get("num_key_value_heads", heads),
                   cfg.get("head_dim") or cfg["hidden_size"] // heads, cfg["vocab_size"],
                   cfg.get("intermediate_size", 0),
                   cfg.get("num_experts", 0) if moe else 0, cfg.get("num_experts_per_tok", 0) if moe else 0,
                   cfg.get("moe_intermediate_size", 0), bool(cfg.get("norm_topk_prob", True)),
                   float(cfg.get("rms_norm_eps", 1e-6)), float(cfg.get("rope_theta", 10000.0)), SUPPORTED[mt])

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def tensors(self) -> dict[str, tuple[int, ...]]:
        """Every weight tensor, HF name -> shape [out, in]."""
        h, hd, out = self.hidden, self.head_dim, {"model.embed_tokens.weight": (self.vocab, self.hidden)}
        for i in range(self.layers):
            p = f"model.layers.{i}."
            out[p + "input_layernorm.weight"] = (h,)
            out[p + "post_attention_layernorm.weight"] = (h,)
            if self.qk_norm:
                out[p + "self_attn.q_norm.weight"] = (hd,)
                out[p + "self_attn.k_norm.weight"] = (hd,)
            out[p + "self_attn.q_proj.weight"] = (self.heads * hd, h)
            out[p + "self_attn.k_proj.weight"] = (self.kv_heads * hd, h)
            out[p + "self_attn.v_proj.weight"] = (self.kv_heads * hd, h)
            out[p + "self_attn.o_proj.weight"] = (h, self.heads * hd)
            if self.is_moe:
                out[p + "mlp.gate.weight"] = (self.experts, h)
                for e in range(self.experts):
                    q = f"{p}mlp.experts.{e}."
                    out[q + "gate_proj.weight"] = (self.moe_intermediate, h)
                    out[q + "up_proj.weight"] = (self.moe_intermediate, h)
                    out[q + "down_proj.weight"] = (h, self.moe_intermediate)
            else:
                out[p + "mlp.gate_proj.weight"] = (self.intermediate, h)
                out[p + "mlp.up_proj.weight"] = (self.intermediate, h)
                out[p + "mlp.down_proj.weight"] = (h, self.intermediate)
        out["model.norm.weight"] = (h,)
        out["lm_head.weight"] = (self.vocab, h)
        return out

    def check_catalog(self, catalog) -> None:
        """The plan's operators must be exactly this model's tensors (plus the KV-cache pseudo tensors)."""
        mine = self.tensors()
        theirs = {op.tensor: tuple(op.shape) for op in catalog.operators if op.family != "kv_cache"}
        if mine != theirs:
            missing = sorted(set(theirs) - set(mine))[:3]
            extra = sorted(set(mine) - set(theirs))[:3]
            shapes = sorted(n for n in set(mine) & set(theirs) if mine[n] != theirs[n])[:3]
            raise ArchError(f"catalog '{catalog.name}' does not match the runtime model: not built {missing}, "
                            f"not in catalog {extra}, shape differs {shapes}")


def init_weights(arch: Arch, seed: int) -> dict[str, torch.Tensor]:
    """Float32 initial weights: N(0, 0.02), output projections scaled by depth, norms at one."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in arch.tensors().items():
        if len(shape) == 1:
            out[name] = torch.ones(shape)
            continue
        std = 0.02 / math.sqrt(2 * arch.layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
        out[name] = torch.randn(shape, generator=g) * std
    return out


class Exec(Protocol):
    """One execution's weights and numerics: the rollout engine's or the trainer's."""

    def linear(self, name: str, x: torch.Tensor) -> torch.Tensor: ...

    def weight(self, name: str) -> torch.Tensor: ...

    def kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


def bf16(x: torch.Tensor) -> torch.Tensor:
    """Round to BF16 and back: what a BF16 tensor between two kernels holds."""
    return x.to(torch.bfloat16).to(torch.float32)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return bf16(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (HF "rotate_half" layout) of x [B, H, T, D] at positions pos [T]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


@dataclass
class Routes:
    """Per MoE layer: the experts used [B, T, k], and the ones this execution's router would pick."""

    used: list[torch.Tensor]
    own: list[torch.Tensor]


class KVCache:
    """Per-layer K and V as the rollout engine stores them (already quantized by Exec.kv)."""

    def __init__(self, layers: int):
        self.k: list[torch.Tensor | None] = [None] * layers
        self.v: list[torch.Tensor | None] = [None] * layers

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k[layer] is not None:
            k, v = torch.cat([self.k[layer], k], 2), torch.cat([self.v[layer], v], 2)
        self.k[layer], self.v[layer] = k, v
        return k, v

    @property
    def length(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[2]


def _attention(arch: Arch, ex: Exec, i: int, x: torch.Tensor, pos: torch.Tensor, cache: KVCache | None):
    b, t, _ = x.shape
    p, hd = f"model.layers.{i}.self_attn.", arch.head_dim
    q = ex.linear(p + "q_proj.weight", x).view(b, t, arch.heads, hd).transpose(1, 2)
    k = ex.linear(p + "k_proj.weight", x).view(b, t, arch.kv_heads, hd).transpose(1, 2)
    v = ex.linear(p + "v_proj.weight", x).view(b, t, arch.kv_heads, hd).transpose(1, 2)
    if arch.qk_norm:
        q = rms_norm(q, ex.weight(p + "q_norm.weight"), arch.eps)
        k = rms_norm(k, ex.weight(p + "k_norm.weight"), arch.eps)
    q, k = bf16(rope(q, pos, arch.theta)), bf16(rope(k, pos, arch.theta))
    if cache is not None:
        k, v = ex.kv(i, k, v)
        k, v = cache.append(i, k, v)
    rep = arch.heads // arch.kv_heads
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    tk = k.shape[2]
    mask = torch.ones(t, tk, dtype=torch.bool).tril(tk - t)
    s = s.masked_fill(~mask, float("-inf"))
    o = bf16(torch.softmax(s, -1) @ v).transpose(1, 2).reshape(b, t, arch.heads * hd)
    return ex.linear(p + "o_proj.weight", o)


def _moe(arch: Arch, ex: Exec, i: int, x: torch.Tensor, forced: torch.Tensor | None, routes: Routes):
    b, t, h = x.shape
    p = f"model.layers.{i}.mlp."
    probs = torch.softmax(ex.linear(p + "gate.weight", x).float(), -1)  # router in fp32 after its GEMM
    own = probs.topk(arch.topk, -1).indices
    idx = own if forced is None else forced
    w = probs.gather(-1, idx)
    if arch.norm_topk:
        w = w / w.sum(-1, keepdim=True)
    routes.own.append(own)
    routes.used.append(idx)
    xf, idx_f, w_f = x.reshape(-1, h), idx.reshape(-1, arch.topk), w.reshape(-1, arch.topk)
    out = torch.zeros_like(xf)
    for e in range(arch.experts):
        tok, slot = (idx_f == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        xe, q = xf[tok], f"{p}experts.{e}."
        y = _swiglu(ex, q, xe)
        out = out.index_add(0, tok, y * w_f[tok, slot, None])
    return bf16(out).view(b, t, h)


def _swiglu(ex: Exec, p: str, x: torch.Tensor) -> torch.Tensor:
    a = bf16(F.silu(ex.linear(p + "gate_proj.weight", x)) * ex.linear(p + "up_proj.weight", x))
    return ex.linear(p + "down_proj.weight", a)


def forward(arch: Arch, ex: Exec, tokens: torch.Tensor, cache: KVCache | None = None,
            replay: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, Routes]:
    """Logits [B, T, V] (float32) for tokens [B, T], continuing `cache` when given.

    `replay`: per MoE layer, expert ids [B, T, k] to use instead of this router's top-k
    (routing replay); the gate weights still come from this execution's router.
    """
    start = cache.length if cache is not None else 0
    pos = torch.arange(start, start + tokens.shape[1])
    x = bf16(F.embedding(tokens, ex.weight("model.embed_tokens.weight")))
    routes = Routes([], [])
    for i in range(arch.layers):
        p = f"model.layers.{i}."
        x = x + _attention(arch, ex, i, rms_norm(x, ex.weight(p + "input_layernorm.weight"), arch.eps), pos, cache)
        x = bf16(x)
        hn = rms_norm(x, ex.weight(p + "post_attention_layernorm.weight"), arch.eps)
        if arch.is_moe:
            x = bf16(x + _moe(arch, ex, i, hn, None if replay is None else replay[i], routes))
        else:
            x = bf16(x + _swiglu(ex, p + "mlp.", hn))
    x = rms_norm(x, ex.weight("model.norm.weight"), arch.eps)
    return ex.linear("lm_head.weight", x).float(), routes
