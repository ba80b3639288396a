"""The runtime's model as transformers' own modeling code, with pcc's per-GEMM precision swapped in.

`forward(arch, ex, tokens, cache, replay)` has the signature and the result of `model.forward`,
but the network is transformers' `Qwen3MoeForCausalLM`, `DeepseekV3ForCausalLM`,
`LlamaForCausalLM` (or the Qwen3 / Mistral class), built from the catalog's config (`hf_config`)
in FP32 on the CPU, with SDPA attention. Three kinds of module are replaced, all keyed by the
Hugging Face tensor names that the plan's operators carry:

- every `nn.Linear` (attention projections, dense and shared-expert MLPs, `lm_head`) becomes a
  module that calls `ex.linear(name, x)`: the rollout engine's decoded / real low-precision GEMM,
  or the trainer's `plan_linear` with FProp, DGrad and WGrad each at the plan's scheme;
- the MoE router becomes pcc's router (`model._route`, the same softmax top-k / sigmoid group-
  limited choice transformers makes, checked against it in the tests), whose GEMM is
  `ex.linear(".. mlp.gate.weight")` and which records the routes and takes replayed expert ids
  (routing replay R3);
- transformers 5 stores the routed experts fused (`gate_up_proj` [E, 2I, H], `down_proj`
  [E, H, I]); the experts run through the experts implementation registered here as "pcc"
  (transformers' `ExpertsInterface`), which calls `ex.linear` per expert on the checkpoint's
  per-expert names, so gate and up are two GEMMs with their own scale groups, as the engines
  quantize them. The fused parameters are removed from the module.

Every other parameter (embedding, RMSNorm weights) is the execution's own tensor (`ex.weight`),
passed with `torch.func.functional_call`, so gradients reach the trainer's parameters. The KV
cache is transformers' `DynamicCache` whose `update` first stores what the execution's `ex.kv`
makes of the new entries (the rollout's FP8 KV cache); under MLA transformers caches the
normalized latent and the roped shared key, as SGLang's MLA cache does.

Activations between GEMMs are FP32 here (the GEMMs' operands and outputs are what the plan
says); `model.forward`, the hand-written model, rounds them to BF16 between kernels.
"""

from __future__ import annotations

import functools
import inspect
import threading

import torch
from torch import nn

from .model import Arch, KVCache, Routes, _route

MIN_VERSION = (5, 0)  # fused experts + the experts-implementation registry; the latent MLA cache


def _version(v: str) -> tuple[int, int]:
    parts = (v.split(".") + ["0"])[:2]
    return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in parts)


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """Why transformers' model code cannot run here (None: it can)."""
    try:
        import transformers
    except ImportError:
        return "transformers is not installed"
    if _version(transformers.__version__) < MIN_VERSION:
        return f"transformers {transformers.__version__} is older than 5.0 (no fused experts registry)"
    try:
        from transformers.integrations.moe import ExpertsInterface  # noqa: F401
    except ImportError:
        return f"transformers {transformers.__version__} has no experts-implementation registry (ExpertsInterface)"
    return None


def hf_config(arch: Arch) -> dict:
    """The transformers config of `arch` (the catalog's config, as `Arch.from_catalog` read it)."""
    cfg = {"model_type": arch.model_type, "vocab_size": arch.vocab, "hidden_size": arch.hidden,
           "num_hidden_layers": arch.layers, "num_attention_heads": arch.heads,
           "num_key_value_heads": arch.kv_heads, "head_dim": arch.head_dim, "rms_norm_eps": arch.eps,
           "rope_parameters": {"rope_type": "default", "rope_theta": arch.theta}, "hidden_act": "silu",
           "tie_word_embeddings": False, "attention_bias": False, "max_position_embeddings": 4096,
           "intermediate_size": arch.intermediate or arch.moe_intermediate}
    if arch.model_type == "mistral":
        cfg["sliding_window"] = None
    if arch.is_moe:
        cfg |= {"num_experts_per_tok": arch.topk, "moe_intermediate_size": arch.moe_intermediate,
                "norm_topk_prob": arch.norm_topk}
        if arch.model_type == "deepseek_v3":
            cfg |= {"n_routed_experts": arch.experts, "first_k_dense_replace": len(arch.dense_layers),
                    "n_shared_experts": arch.shared // arch.moe_intermediate if arch.shared else 0,
                    "routed_scaling_factor": arch.routed_scale, "n_group": arch.groups[0],
                    "topk_group": arch.groups[1]}
        else:
            cfg |= {"num_experts": arch.experts, "mlp_only_layers": list(arch.dense_layers),
                    "decoder_sparse_step": 1}
    if arch.mla:
        cfg |= {"q_lora_rank": arch.q_rank or None, "kv_lora_rank": arch.kv_rank,
                "qk_nope_head_dim": arch.nope, "qk_rope_head_dim": arch.rope_dim, "v_head_dim": arch.v_dim,
                "rope_interleave": arch.rope_interleave, "head_dim": arch.rope_dim}
    return cfg


class _Scope:
    """What the current forward runs on: the execution, the tokens' shape, the routes it records."""

    def __init__(self):
        self.ex, self.shape, self.routes, self.replay = None, (0, 0), Routes([], []), None


class _Linear(nn.Module):
    def __init__(self, scope: _Scope, name: str):
        super().__init__()
        self.scope, self.name = scope, name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scope.ex.linear(self.name, x)


class _Router(nn.Module):
    """The MoE router over `ex.linear`: (logits, gate weights, expert ids), as transformers' routers return."""

    def __init__(self, scope: _Scope, arch: Arch, name: str):
        super().__init__()
        self.scope, self.arch, self.name = scope, arch, name

    def forward(self, hidden: torch.Tensor):
        s, (b, t) = self.scope, self.scope.shape
        logits = s.ex.linear(self.name, hidden.reshape(b, t, -1)).float()  # router in fp32 after its GEMM
        forced = None if s.replay is None else s.replay[len(s.routes.used)]
        own, idx, w = _route(self.arch, logits, forced)
        s.routes.own.append(own)
        s.routes.used.append(idx)
        k = self.arch.topk
        return logits.reshape(-1, logits.shape[-1]), w.reshape(-1, k), idx.reshape(-1, k)


def pcc_experts(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
    """transformers' experts interface, over the execution's per-expert GEMMs (gate, up, down separate)."""
    ex, p = self._pcc_scope.ex, self._pcc_prefix
    out = torch.zeros_like(hidden_states)
    for e in range(self.num_experts):
        tok, slot = (top_k_index == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        xe, q = hidden_states[tok], f"{p}{e}."
        a = self.act_fn(ex.linear(q + "gate_proj.weight", xe)) * ex.linear(q + "up_proj.weight", xe)
        y = ex.linear(q + "down_proj.weight", a)
        out = out.index_add(0, tok, y * top_k_weights[tok, slot, None].to(y.dtype))
    return out


@functools.lru_cache(maxsize=1)
def _cache_class():
    from transformers import DynamicCache

    class ExecCache(DynamicCache):
        """transformers' DynamicCache holding what the execution's KV cache stores (`ex.kv`)."""

        def __init__(self, scope: _Scope, store: KVCache, config):
            super().__init__(config=config)
            self.scope, self.store = scope, store

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            k, v = self.scope.ex.kv(layer_idx, key_states, value_states)
            k, v = super().update(k, v, layer_idx, *args, **kwargs)
            self.store.k[layer_idx], self.store.v[layer_idx] = k, v  # KVCache.length reads them
            return k, v

    return ExecCache


class Built:
    """One architecture's transformers model with pcc's modules in place."""

    def __init__(self, arch: Arch):
        import transformers
        from transformers.integrations.moe import ExpertsInterface

        if "pcc" not in ExpertsInterface._global_mapping:
            ExpertsInterface.register("pcc", pcc_experts)
        cfg = hf_config(arch)
        self.config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
        with torch.random.fork_rng():  # the weights it initializes are never used (below): leave the global stream
            self.model = transformers.AutoModelForCausalLM.from_config(
                self.config, attn_implementation="sdpa", experts_implementation="pcc", dtype=torch.float32).eval()
        self.scope, self.arch, self.lock = _Scope(), arch, threading.RLock()
        for name, mod in list(self.model.named_modules()):
            parent, _, child = name.rpartition(".")
            owner = self.model.get_submodule(parent) if parent else self.model
            if isinstance(mod, nn.Linear):
                setattr(owner, child, _Linear(self.scope, name + ".weight"))
            elif child == "gate" and name.endswith(".mlp.gate"):
                setattr(owner, child, _Router(self.scope, arch, name + ".weight"))
            elif child == "experts" and hasattr(mod, "gate_up_proj"):
                del mod.gate_up_proj, mod.down_proj
                mod._pcc_scope, mod._pcc_prefix = self.scope, name + "."
        self.params = [n for n, _ in self.model.named_parameters()]
        # transformers 5.2x renamed the cache argument (past_key_values -> cache); an unknown keyword would
        # be swallowed by **kwargs and every decode step would run without its cache
        body = inspect.signature(type(self.model.model).forward).parameters
        self.cache_arg = "cache" if "cache" in body else "past_key_values"
        if self.cache_arg not in body:
            raise RuntimeError(f"transformers' {type(self.model.model).__name__}.forward takes no KV cache argument")
        expected = set(arch.tensors())
        if not set(self.params) <= expected:
            raise RuntimeError(f"transformers' {type(self.model).__name__} has parameters pcc does not hold: "
                               f"{sorted(set(self.params) - expected)[:3]}")

    def __call__(self, ex, tokens: torch.Tensor, cache: KVCache | None, replay) -> tuple[torch.Tensor, Routes]:
        with self.lock:  # the scope and functional_call's parameter swap are the model's: one forward at a time
            return self._call(ex, tokens, cache, replay)

    def _call(self, ex, tokens, cache, replay):
        s = self.scope
        saved = (s.ex, s.shape, s.routes, s.replay)
        s.ex, s.shape, s.routes, s.replay = ex, tuple(tokens.shape), Routes([], []), replay
        try:
            hf_cache = None
            if cache is not None:
                hf_cache = getattr(cache, "hf", None)
                if hf_cache is None:
                    hf_cache = cache.hf = _cache_class()(s, cache, self.config)
            params = {n: ex.weight(n) for n in self.params}
            out = torch.func.functional_call(self.model, params, (tokens,),
                                             {self.cache_arg: hf_cache, "use_cache": cache is not None})
            return out.logits.float(), s.routes
        finally:
            s.ex, s.shape, s.routes, s.replay = saved


@functools.lru_cache(maxsize=8)
def build(arch: Arch) -> Built:
    return Built(arch)


def forward(arch: Arch, ex, tokens: torch.Tensor, cache: KVCache | None = None,
            replay: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, Routes]:
    """`model.forward` on transformers' modeling code: logits [B, T, V] (float32) and the routes."""
    return build(arch)(ex, tokens, cache, replay)
