"""A small decoder-only transformer named like the Hugging Face checkpoints the catalogs describe.

`forward` runs transformers' own modeling code for the architecture (`hf_model`) where transformers >= 5
is installed, and the hand-written model here (`pcc_forward`) otherwise or with PCC_MODEL_CODE=pcc.

The architecture is written once, as a function of a weight source (`Exec`), so the
rollout engine and the trainer run the same model over their own representations:
RoPE attention with grouped KV heads (and Qwen3's per-head q/k RMSNorm) or DeepSeek's
multi-head latent attention (MLA: low-rank q, a compressed KV latent that is what the
cache holds, interleaved RoPE on a separate head part), RMSNorm, and per layer either a
dense SwiGLU MLP (Llama, DeepSeek's first layers) or an MoE MLP: softmax top-k routing
(Qwen3-MoE) or sigmoid scores with a routed scaling factor plus shared experts (DeepSeek-V3).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from pcc.lang.diagnostics import PccError

SUPPORTED = {"qwen3_moe": True, "qwen3": True, "llama": False, "mistral": False, "deepseek_v3": False}  # -> q/k norm


class ArchError(PccError, ValueError):
    """The catalog describes a model this runtime cannot build."""

    code = "PCC703"


def _rope_theta(cfg: dict) -> float:
    """RoPE's base: `rope_theta`, or where transformers 5 writes it, `rope_parameters.rope_theta` (a Qwen3 that
    transformers 5 saved has no top-level rope_theta: read as the default 10000 instead of its 1e6, every
    position's rotation differed from the engine's). 10000 when neither says."""
    params = cfg.get("rope_parameters")
    nested = params.get("rope_theta") if isinstance(params, dict) else None
    return float(cfg.get("rope_theta") or nested or 10000.0)


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
    dense_layers: tuple[int, ...] = ()  # layers with a dense MLP in an MoE model
    shared: int = 0  # shared-expert MLP width (DeepSeek: moe_intermediate_size * n_shared_experts)
    scoring: str = "softmax"  # router: softmax (Qwen3-MoE) | sigmoid (DeepSeek-V3)
    routed_scale: float = 1.0
    groups: tuple[int, int] = (1, 1)  # (n_group, topk_group): group-limited routing
    q_rank: int = 0  # MLA: q_lora_rank (0: a plain q_proj)
    kv_rank: int = 0  # MLA: kv_lora_rank (0: not MLA)
    nope: int = 0  # MLA qk_nope_head_dim
    rope_dim: int = 0  # MLA qk_rope_head_dim
    v_dim: int = 0  # MLA v_head_dim
    rope_interleave: bool = False

    @classmethod
    def from_catalog(cls, catalog) -> "Arch":
        cfg = catalog.config.get("text_config", catalog.config)
        mt = cfg.get("model_type", "")
        if mt not in SUPPORTED:
            raise ArchError(f"model '{catalog.name}' (model_type {mt!r}) is not an architecture the embedded runtime "
                            f"builds ({', '.join(SUPPORTED)}); run with --model auto or a tiny catalog "
                            f"(docs/runtime.md)")
        if cfg.get("decoder_sparse_step", 1) != 1 or cfg.get("moe_layer_freq", 1) != 1:
            raise ArchError(f"model '{catalog.name}': MoE every n-th layer is not supported by the embedded runtime")
        heads, layers = cfg["num_attention_heads"], cfg["num_hidden_layers"]
        # every key transformers writes: DeepSeek's, Qwen3-MoE's, and transformers 5's Qwen3-MoE/Mixtral one
        experts = cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts") or 0
        dense = tuple(i for i in range(layers) if i < cfg.get("first_k_dense_replace", 0)
                      or i in cfg.get("mlp_only_layers", ())) if experts else ()
        mla = cfg.get("kv_lora_rank") is not None
        return cls(mt, cfg["hidden_size"], layers, heads, cfg.get("num_key_value_heads", heads),
                   cfg.get("head_dim") or cfg["hidden_size"] // heads, cfg["vocab_size"],
                   cfg.get("intermediate_size", 0), experts, cfg.get("num_experts_per_tok", 0) if experts else 0,
                   cfg.get("moe_intermediate_size", 0), bool(cfg.get("norm_topk_prob", True)),
                   float(cfg.get("rms_norm_eps", 1e-6)), _rope_theta(cfg), SUPPORTED[mt],
                   dense, cfg.get("moe_intermediate_size", 0) * cfg.get("n_shared_experts", 0) if experts else 0,
                   cfg.get("scoring_func", "softmax"), float(cfg.get("routed_scaling_factor", 1.0)),
                   (cfg.get("n_group") or 1, cfg.get("topk_group") or 1), cfg.get("q_lora_rank") or 0,
                   cfg.get("kv_lora_rank") or 0, cfg.get("qk_nope_head_dim", 0) if mla else 0,
                   cfg.get("qk_rope_head_dim", 0) if mla else 0, cfg.get("v_head_dim", 0) if mla else 0,
                   bool(cfg.get("rope_interleave", mt == "deepseek_v3")))

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def mla(self) -> bool:
        return self.kv_rank > 0

    def moe_layer(self, i: int) -> bool:
        return self.is_moe and i not in self.dense_layers

    def _attention_tensors(self, p: str) -> dict[str, tuple[int, ...]]:
        h, hd = self.hidden, self.head_dim
        if not self.mla:
            out = {p + "q_proj.weight": (self.heads * hd, h), p + "k_proj.weight": (self.kv_heads * hd, h),
                   p + "v_proj.weight": (self.kv_heads * hd, h), p + "o_proj.weight": (h, self.heads * hd)}
            if self.qk_norm:
                out |= {p + "q_norm.weight": (hd,), p + "k_norm.weight": (hd,)}
            return out
        qw = self.heads * (self.nope + self.rope_dim)
        out = {p + "q_a_proj.weight": (self.q_rank, h), p + "q_a_layernorm.weight": (self.q_rank,),
               p + "q_b_proj.weight": (qw, self.q_rank)} if self.q_rank else {p + "q_proj.weight": (qw, h)}
        return out | {p + "kv_a_proj_with_mqa.weight": (self.kv_rank + self.rope_dim, h),
                      p + "kv_a_layernorm.weight": (self.kv_rank,),
                      p + "kv_b_proj.weight": (self.heads * (self.nope + self.v_dim), self.kv_rank),
                      p + "o_proj.weight": (h, self.heads * self.v_dim)}

    def tensors(self) -> dict[str, tuple[int, ...]]:
        """Every weight tensor, HF name -> shape [out, in]."""
        h, out = self.hidden, {"model.embed_tokens.weight": (self.vocab, self.hidden)}
        for i in range(self.layers):
            p = f"model.layers.{i}."
            out[p + "input_layernorm.weight"] = (h,)
            out[p + "post_attention_layernorm.weight"] = (h,)
            out |= self._attention_tensors(p + "self_attn.")
            mlps = [(p + "mlp.", self.intermediate)]
            if self.moe_layer(i):
                out[p + "mlp.gate.weight"] = (self.experts, h)
                mlps = [(f"{p}mlp.experts.{e}.", self.moe_intermediate) for e in range(self.experts)]
                mlps += [(p + "mlp.shared_experts.", self.shared)] if self.shared else []
            for q, width in mlps:
                out[q + "gate_proj.weight"] = (width, h)
                out[q + "up_proj.weight"] = (width, h)
                out[q + "down_proj.weight"] = (h, width)
        out["model.norm.weight"] = (h,)
        out["lm_head.weight"] = (self.vocab, h)
        return out

    def buffers(self) -> dict[str, torch.Tensor]:
        """Checkpoint tensors that are not operators: DeepSeek's router score-correction bias, held at
        zero here (DeepSeek moves it by load balancing, outside the gradient)."""
        if self.scoring != "sigmoid":
            return {}
        return {f"model.layers.{i}.mlp.gate.e_score_correction_bias": torch.zeros(self.experts)
                for i in range(self.layers) if self.moe_layer(i)}

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


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float, interleave: bool = False) -> torch.Tensor:
    """Rotary embedding of x [B, H, T, D] at positions pos [T]: HF "rotate_half" layout, or DeepSeek's
    interleaved pairs (x0, x1), (x2, x3).. (returned de-interleaved, as transformers does)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos.float()[:, None] * inv[None, :]
    if interleave:
        x1, x2, cos, sin = x[..., 0::2], x[..., 1::2], ang.cos(), ang.sin()
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
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
    return _attend(ex, p, q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))


def _attend(ex: Exec, p: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention of q [B, H, t, D] over k, v [B, H, T, .] (the last t of T are new), then o_proj."""
    b, h, t, d = q.shape
    s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    tk = k.shape[2]
    mask = torch.ones(t, tk, dtype=torch.bool).tril(tk - t)
    s = s.masked_fill(~mask, float("-inf"))
    o = bf16(torch.softmax(s, -1) @ v).transpose(1, 2).reshape(b, t, h * v.shape[-1])
    return ex.linear(p + "o_proj.weight", o)


def _mla(arch: Arch, ex: Exec, i: int, x: torch.Tensor, pos: torch.Tensor, cache: KVCache | None):
    """DeepSeek MLA. The cache holds what SGLang's MLA cache holds: the normalized KV latent and the
    roped shared key part (one "head"); K and V are expanded from the latent by kv_b_proj at every step."""
    b, t, _ = x.shape
    p, n, r = f"model.layers.{i}.self_attn.", arch.nope, arch.rope_dim
    if arch.q_rank:
        qa = rms_norm(ex.linear(p + "q_a_proj.weight", x), ex.weight(p + "q_a_layernorm.weight"), arch.eps)
        q = ex.linear(p + "q_b_proj.weight", qa)
    else:
        q = ex.linear(p + "q_proj.weight", x)
    q_pass, q_rot = q.view(b, t, arch.heads, n + r).transpose(1, 2).split([n, r], -1)
    latent, k_rot = ex.linear(p + "kv_a_proj_with_mqa.weight", x).split([arch.kv_rank, r], -1)
    latent = rms_norm(latent, ex.weight(p + "kv_a_layernorm.weight"), arch.eps).view(b, 1, t, arch.kv_rank)
    q_rot = rope(q_rot, pos, arch.theta, arch.rope_interleave)
    k_rot = bf16(rope(k_rot.reshape(b, 1, t, r), pos, arch.theta, arch.rope_interleave))
    if cache is not None:
        latent, k_rot = ex.kv(i, latent, k_rot)
        latent, k_rot = cache.append(i, latent, k_rot)
    tk = latent.shape[2]
    kv = ex.linear(p + "kv_b_proj.weight", latent).view(b, tk, arch.heads, n + arch.v_dim).transpose(1, 2)
    k_pass, v = kv.split([n, arch.v_dim], -1)
    k = torch.cat([k_pass, k_rot.expand(b, arch.heads, tk, r)], -1)
    return _attend(ex, p, bf16(torch.cat([q_pass, q_rot], -1)), k, v)





def _route(arch: Arch, logits: torch.Tensor, forced: torch.Tensor | None):
    """(own top-k ids, ids used, their gate weights). Softmax: Qwen3-MoE. Sigmoid: DeepSeek-V3 (group-
    limited choice on the scores, weights renormalized then scaled by routed_scaling_factor)."""
    if arch.scoring == "sigmoid":
        scores = logits.sigmoid()
        ng, kg = arch.groups
        if ng > 1:
            grouped = scores.view(*scores.shape[:-1], ng, -1)
            top = grouped.topk(2, -1).values.sum(-1).topk(kg, -1).indices
            keep = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter(-1, top, True)
            choice = grouped.masked_fill(~keep[..., None], float("-inf")).flatten(-2)
        else:
            choice = scores
    else:
        scores = choice = torch.softmax(logits, -1)
    own = choice.topk(arch.topk, -1).indices
    idx = own if forced is None else forced
    w = scores.gather(-1, idx)
    if arch.norm_topk:
        w = w / (w.sum(-1, keepdim=True) + (1e-20 if arch.scoring == "sigmoid" else 0.0))
    return own, idx, w * arch.routed_scale


def _moe(arch: Arch, ex: Exec, i: int, x: torch.Tensor, forced: torch.Tensor | None, routes: Routes):
    b, t, h = x.shape
    p = f"model.layers.{i}.mlp."
    own, idx, w = _route(arch, ex.linear(p + "gate.weight", x).float(), forced)  # router in fp32 after its GEMM
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
    out = bf16(out).view(b, t, h)
    if arch.shared:
        out = bf16(out + _swiglu(ex, p + "shared_experts.", x))
    return out


def _swiglu(ex: Exec, p: str, x: torch.Tensor) -> torch.Tensor:
    a = bf16(F.silu(ex.linear(p + "gate_proj.weight", x)) * ex.linear(p + "up_proj.weight", x))
    return ex.linear(p + "down_proj.weight", a)


CODES = ("transformers", "pcc")


def model_code() -> str:
    """Which model code runs: `PCC_MODEL_CODE` (transformers | pcc), by default transformers' own
    modeling code (`hf_model`) where transformers >= 5 is installed, else the hand-written one here."""
    from .settings import SettingError

    want = os.environ.get("PCC_MODEL_CODE", "").strip().lower()
    if want and want not in CODES:
        raise SettingError(f"PCC_MODEL_CODE={want!r}: expected one of {', '.join(CODES)}")
    if want == "pcc":
        return "pcc"
    from . import hf_model

    why = hf_model.unavailable()
    if why is None:
        return "transformers"
    if want == "transformers":
        raise SettingError(f"PCC_MODEL_CODE=transformers: {why}")
    return "pcc"


def forward(arch: Arch, ex: Exec, tokens: torch.Tensor, cache: KVCache | None = None,
            replay: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, Routes]:
    """Logits [B, T, V] (float32) for tokens [B, T], continuing `cache` when given, on the model code
    `model_code()` names (`hf_model.forward` or `pcc_forward`; same arguments, same results).

    `replay`: per MoE layer (in layer order, dense layers skipped), expert ids [B, T, k] to use
    instead of this router's top-k (routing replay); the gate weights still come from this
    execution's router.
    """
    if model_code() == "transformers":
        from .hf_model import forward as hf_forward

        return hf_forward(arch, ex, tokens, cache, replay)
    return pcc_forward(arch, ex, tokens, cache, replay)


def pcc_forward(arch: Arch, ex: Exec, tokens: torch.Tensor, cache: KVCache | None = None,
                replay: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, Routes]:
    """The hand-written model: logits [B, T, V] (float32) for tokens [B, T], continuing `cache` when given.
    Activations are rounded to BF16 between kernels.

    `replay`: per MoE layer (in layer order, dense layers skipped), expert ids [B, T, k] to use
    instead of this router's top-k (routing replay); the gate weights still come from this
    execution's router.
    """
    start = cache.length if cache is not None else 0
    pos = torch.arange(start, start + tokens.shape[1])
    x = bf16(F.embedding(tokens, ex.weight("model.embed_tokens.weight")))
    routes = Routes([], [])
    attention = _mla if arch.mla else _attention
    for i in range(arch.layers):
        p = f"model.layers.{i}."
        x = x + attention(arch, ex, i, rms_norm(x, ex.weight(p + "input_layernorm.weight"), arch.eps), pos, cache)
        x = bf16(x)
        hn = rms_norm(x, ex.weight(p + "post_attention_layernorm.weight"), arch.eps)
        if arch.moe_layer(i):
            forced = None if replay is None else replay[len(routes.used)]
            x = bf16(x + _moe(arch, ex, i, hn, forced, routes))
        else:
            x = bf16(x + _swiglu(ex, p + "mlp.", hn))
    x = rms_norm(x, ex.weight("model.norm.weight"), arch.eps)
    return ex.linear("lm_head.weight", x).float(), routes
