"""The model's architecture as Megatron flags, for the Miles launch (the bundle's miles/model_args.txt).

Megatron does not read a Hugging Face config: Miles' own launchers take the architecture
from a per-model file (scripts/models/<model>.py in radixark/miles). pcc knows the model
(`plan.catalog.config`, the built-in catalog or the checkpoint's config.json), so it writes
the same facts from the config instead of asking the user to find the right file.
tests/lower/test_miles_arch.py compares them field by field with Miles' scripts for the
published models pcc catalogs, and parses them with megatron-core's parser.

Mapped families (model_type): Llama/Mistral and Qwen2/Qwen3 dense (GQA), Qwen3-MoE,
GLM-4.5 MoE (glm4_moe), DeepSeek-V3 and Kimi-K2 (MLA + MoE), GLM-5 (MLA + MoE + DeepSeek
sparse attention, through the layer spec Miles ships), Qwen3.5/3.6 MoE and dense (gated full attention
and Gated DeltaNet linear attention, through Miles' Qwen3.5 layer spec). What a config says that these flags
cannot carry is a gap: `architecture` returns no flags and says why, and the launch takes the
architecture from the job file instead.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from pcc.lang.diagnostics import PccError
from pcc.models.base import lm_config
from pcc.resources import target_table

DENSE_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_5", "qwen3_5_text"})
# Qwen3.5/3.6 MoE (the language model a multimodal config nests under text_config): Miles builds its
# linear-attention layers with its own spec, which reads their sizes from the HF checkpoint's config.
QWEN3_5_MOE_TYPES = frozenset({"qwen3_5_moe", "qwen3_5_moe_text"})
QWEN3_5_TYPES = QWEN3_5_MOE_TYPES | {"qwen3_5", "qwen3_5_text"}  # and the dense form (Qwen3.5-27B)
MOE_TYPES = frozenset({"qwen3_moe", "glm4_moe", "deepseek_v3", "kimi_k2", "glm_moe_dsa"}) | QWEN3_5_MOE_TYPES
QK_NORM_TYPES = frozenset({"qwen3", "qwen3_moe"}) | QWEN3_5_TYPES  # per-head q/k RMSNorm (glm4_moe: use_qk_norm)
QKV_BIAS_TYPES = frozenset({"qwen2"})  # q/k/v biases whatever attention_bias says
# Routers that score with a sigmoid and route with a learned per-expert bias
# (e_score_correction_bias) whether or not the config names it.
SIGMOID_BIAS_TYPES = frozenset({"glm4_moe"})
# Megatron-core's Llama-3 RoPE scaling (rotary_pos_embedding.py _apply_scaling) fixes these.
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


class ArchGap(PccError, ValueError):
    """The config says something the mapped Megatron flags cannot carry."""


@functools.cache
def tables() -> dict:
    """targets/miles.yaml: the Miles launch tables (pcc.lower.miles reads the same), read once, with libyaml
    where PyYAML has it (pcc.resources.target_table)."""
    return target_table("miles")


@dataclass
class Arch:
    """Megatron flags (one flag with its values per entry) and why each non-obvious one is there."""

    lines: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, flag: str, *values) -> None:
        self.lines.append([flag, *(num(v) for v in values)])

    @property
    def args(self) -> list[str]:
        return [w for line in self.lines for w in line]


def num(v) -> str:
    """A config number as a flag value: integral floats without '.0' (Megatron's --rotary-base is
    an int), other floats as Python writes them (1e-06, 2.827)."""
    if isinstance(v, bool):
        raise TypeError(v)
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def layer_pattern(flags: list[int]) -> str:
    """--moe-layer-freq as Megatron's list expression, run-length: [0]*3+[1]*58."""
    runs: list[list[int]] = []
    for f in flags:
        if runs and runs[-1][0] == f:
            runs[-1][1] += 1
        else:
            runs.append([f, 1])
    return "+".join(f"[{f}]*{n}" for f, n in runs)


def moe_layers(c: dict) -> list[int]:
    """1 for each MoE layer, 0 for each dense one: DeepSeek's rule (first_k_dense_replace,
    moe_layer_freq) and Qwen's (decoder_sparse_step, mlp_only_layers), as pcc's catalogs build
    the tensor names (pcc/models/builtin.py)."""
    return [int(layer >= c.get("first_k_dense_replace", 0)
                and layer % c.get("moe_layer_freq", 1) == 0
                and (layer + 1) % c.get("decoder_sparse_step", 1) == 0
                and layer not in c.get("mlp_only_layers", ()))
            for layer in range(c["num_hidden_layers"])]


def _rope(c: dict, arch: Arch, mla: bool) -> None:
    params = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), dict) else {}
    theta = c.get("rope_theta", params.get("rope_theta"))
    scaling = c.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    arch.add("--position-embedding-type", "rope")
    partial = c.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        arch.add("--rotary-percent", partial)
    if params.get("mrope_section"):
        arch.notes.append("M-RoPE (rope_parameters.mrope_section) rotates text tokens, whose three position ids are "
                          "equal, as 1-D RoPE does: Megatron's RoPE for a text-only job")
    if theta is None:
        arch.notes.append("config.json gives no rope_theta: --rotary-base stays Megatron's default 10000 unless the "
                          "job sets it (Miles compares it with the rollout checkpoint's rope_theta at start)")
    else:
        if float(theta) != int(theta):
            raise ArchGap(f"rope_theta {theta} is not an integer (Megatron's --rotary-base is)")
        arch.add("--rotary-base", int(theta))
    if not scaling:
        return
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind == "llama3":
        other = {k: float(scaling[k]) for k in LLAMA3_ROPE if k in scaling}
        if any(v != LLAMA3_ROPE[k] for k, v in other.items()):
            raise ArchGap(f"Llama-3 RoPE scaling {other}: Megatron fixes {LLAMA3_ROPE}")
        arch.add("--use-rope-scaling")
        arch.add("--rotary-scaling-factor", scaling["factor"])
    elif kind == "yarn" and mla:
        arch.add("--rope-type", "yarn")
        arch.add("--rotary-scaling-factor", scaling["factor"])
        arch.add("--mscale", scaling.get("mscale", 1.0))
        arch.add("--mscale-all-dim", scaling.get("mscale_all_dim", 0.0))
        arch.add("--original-max-position-embeddings", scaling.get("original_max_position_embeddings", 4096))
        arch.add("--beta-fast", scaling.get("beta_fast", 32))
        arch.add("--beta-slow", scaling.get("beta_slow", 1))
        arch.add("--no-rope-fusion")
        arch.notes.append("--no-rope-fusion: MLA with YaRN RoPE runs the unfused rotary path, as Miles' "
                          "DeepSeek-V3 and Kimi-K2 scripts do")
    else:
        raise ArchGap(f"RoPE scaling {kind!r}{'' if mla else ' outside MLA'} has no Megatron flags here")


def _attention(c: dict, mt: str, arch: Arch) -> bool:
    heads = c["num_attention_heads"]
    arch.add("--num-attention-heads", heads)
    if c.get("kv_lora_rank") is not None:  # multi-latent attention
        arch.add("--multi-latent-attention")
        if c.get("q_lora_rank") is not None:
            arch.add("--q-lora-rank", c["q_lora_rank"])
        arch.add("--kv-lora-rank", c["kv_lora_rank"])
        arch.add("--qk-head-dim", c["qk_nope_head_dim"])
        arch.add("--qk-pos-emb-head-dim", c["qk_rope_head_dim"])
        arch.add("--v-head-dim", c["v_head_dim"])
        arch.add("--kv-channels", c["qk_nope_head_dim"])
        arch.add("--qk-layernorm")  # the q_a / kv_a latent RMSNorms
        if c.get("attention_bias"):
            raise ArchGap("MLA with attention biases")
        return True
    kv = c.get("num_key_value_heads") or heads
    if kv != heads:
        arch.add("--group-query-attention")
        arch.add("--num-query-groups", kv)
    arch.add("--kv-channels", c.get("head_dim") or c["hidden_size"] // heads)
    if mt in QK_NORM_TYPES or c.get("use_qk_norm"):
        arch.add("--qk-layernorm")
    if c.get("attn_output_gate"):  # a sigmoid gate on the attention output, from q_proj's second half
        arch.add("--attention-output-gate")
    if mt in QKV_BIAS_TYPES or c.get("attention_bias"):
        arch.add("--add-qkv-bias")
    return False


def _ffn(c: dict) -> int:
    """--ffn-hidden-size: the dense MLP's width; a config with every layer MoE may give none (Qwen3.5), and
    Megatron builds no dense MLP then, so the expert width stands in (as Miles' Qwen3.5 scripts write)."""
    if "intermediate_size" in c or not all(moe_layers(c)):
        return c["intermediate_size"]
    return c["moe_intermediate_size"]


def _moe(c: dict, mt: str, arch: Arch, settings: dict) -> None:
    experts = c.get("n_routed_experts") or c.get("num_experts")
    arch.add("--num-experts", experts)
    arch.add("--moe-ffn-hidden-size", c["moe_intermediate_size"])
    arch.add("--moe-router-topk", c["num_experts_per_tok"])
    arch.add("--moe-layer-freq", layer_pattern(moe_layers(c)))
    if c.get("n_shared_experts"):
        arch.add("--moe-shared-expert-intermediate-size", c["moe_intermediate_size"] * c["n_shared_experts"])
    elif c.get("shared_expert_intermediate_size"):
        arch.add("--moe-shared-expert-intermediate-size", c["shared_expert_intermediate_size"])
        if mt in QWEN3_5_TYPES:  # a sigmoid gate scales the shared expert (shared_expert_gate)
            arch.add("--moe-shared-expert-gate")
    score = c.get("scoring_func") or ("sigmoid" if mt in SIGMOID_BIAS_TYPES else "softmax")
    bias = c.get("topk_method") == "noaux_tc" or mt in SIGMOID_BIAS_TYPES
    norm = c.get("norm_topk_prob", mt != "qwen3_moe")
    if score == "softmax":
        arch.add("--moe-router-score-function", "softmax")
        if not norm:  # softmax over every expert, then the top k (weights not renormalized)
            arch.add("--moe-router-pre-softmax")
    elif score == "sigmoid":
        arch.add("--moe-router-score-function", "sigmoid")
        if not norm and c["num_experts_per_tok"] > 1:
            raise ArchGap("sigmoid router without norm_topk_prob: Megatron renormalizes sigmoid top-k weights")
    else:
        raise ArchGap(f"router scoring {score!r}")
    if bias:
        arch.add("--moe-router-enable-expert-bias")
    if c.get("routed_scaling_factor", 1.0) != 1.0:
        arch.add("--moe-router-topk-scaling-factor", c["routed_scaling_factor"])
    if (c.get("n_group") or 1) > 1:
        arch.add("--moe-router-num-groups", c["n_group"])
        arch.add("--moe-router-group-topk", c["topk_group"])
    for line in settings["moe_settings"] + (settings["expert_bias_settings"] if bias else []):
        arch.lines.append(list(line))


def architecture(config: dict, settings: dict) -> tuple[Arch | None, str]:
    """(the Megatron flags of this config, "") or (None, why not). `settings` are the Miles
    tables (targets/miles.yaml: moe_settings, expert_bias_settings, dsa_spec, model_type_settings)."""
    c = lm_config(config)
    mt = c.get("model_type")
    if mt not in DENSE_TYPES | MOE_TYPES:
        return None, (f"pcc maps no {mt!r} config to Megatron flags (it maps "
                      f"{', '.join(sorted(DENSE_TYPES | MOE_TYPES))})")
    arch = Arch()
    try:
        if "index_n_heads" in c:  # DeepSeek sparse attention: Miles' own layer spec builds the indexer
            arch.add("--spec", *settings["dsa_spec"])
            arch.add("--enable-experimental")
            arch.notes.append(f"--spec {' '.join(settings['dsa_spec'])}: the config has a DeepSeek sparse-attention "
                              "indexer, which Miles builds with its GLM-5 layer spec")
        if mt in QWEN3_5_TYPES:
            arch.add("--spec", *settings["qwen3_5_spec"])
            arch.notes.append(f"--spec {' '.join(settings['qwen3_5_spec'])}: Miles' Qwen3.5 layer spec builds the "
                              "Gated DeltaNet layers (layer_types, linear_* sizes) from the HF checkpoint's config")
        arch.add("--num-layers", c["num_hidden_layers"])
        arch.add("--hidden-size", c["hidden_size"])
        arch.add("--ffn-hidden-size", _ffn(c))
        mla = _attention(c, mt, arch)
        arch.add("--normalization", "RMSNorm")
        if mt in QWEN3_5_TYPES:  # RMSNorm scales by (1 + weight): zero-centred gamma
            arch.add("--apply-layernorm-1p")
        arch.add("--norm-epsilon", c.get("rms_norm_eps", 1e-6))
        if c.get("hidden_act", "silu") != "silu":
            raise ArchGap(f"hidden_act {c['hidden_act']!r}: the mapped MLPs are SwiGLU (silu)")
        arch.add("--swiglu")
        if c.get("mlp_bias"):
            raise ArchGap("MLP biases")
        arch.add("--disable-bias-linear")
        _rope(c, arch, mla)
        arch.add("--vocab-size", c["vocab_size"])
        if not c.get("tie_word_embeddings", False):
            arch.add("--untie-embeddings-and-output-weights")
        if mt in MOE_TYPES and (c.get("n_routed_experts") or c.get("num_experts")):
            _moe(c, mt, arch, settings)
        for line in settings.get("model_type_settings", {}).get(mt, []):
            arch.lines.append(list(line))
    except ArchGap as exc:
        return None, f"the {mt} config has {exc}"
    except KeyError as exc:
        return None, f"the {mt} config lacks {exc}"
    if mt in QWEN3_5_MOE_TYPES and c.get("mtp_num_hidden_layers"):
        arch.add("--mtp-num-layers", c["mtp_num_hidden_layers"])
        arch.notes.append("--mtp-num-layers: Megatron builds the config's MTP layer(s) so the checkpoint's mtp.* "
                          "tensors load, as Miles' Qwen3.5 MoE scripts do (its 27B dense script leaves them out); "
                          "they train only with --enable-mtp-training")
    if c.get("num_nextn_predict_layers"):
        arch.notes.append(f"the config's {c['num_nextn_predict_layers']} MTP layer(s) are not trained: Miles adds "
                          "them with --mtp-num-layers (and --enable-mtp-training) in the job")
    return arch, ""


def model_args(plan) -> list[str]:
    """The architecture flags of the plan's model (what the bundle's miles/model_args.txt holds);
    ArchGap says why there are none. `pcc compile --verify` parses them with the precision flags."""
    arch, gap = architecture(plan.catalog.config, tables())
    if arch is None:
        raise ArchGap(gap)
    return arch.args
