"""Architecture flags for Miles (pcc/lower/miles_arch.py), field by field against Miles' own model scripts.

MILES below holds, for each published model pcc catalogs, the architecture values Miles' launcher
file for that model sets: radixark/miles at commit 31f1ca961, scripts/models/<file>.py (values
written down here as facts, flag -> value; a flag without a value is True). Fields the Megatron-LM
Miles runs (radixark/Megatron-LM miles-main) leaves at its default are filled with that default so
both sides are compared whole. Every difference is listed in EXPECTED_DIFFERENCES with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import warnings

import pytest

from pcc.lower.miles import tables
from pcc.lower.miles_arch import architecture, layer_pattern, moe_layers
from pcc.models.base import lm_config
from pcc.models.builtin import load_catalog

# Defaults of the flags compared (megatron-core 0.19.2 arguments.py; the three YaRN ones from
# radixark/Megatron-LM miles-main _add_mla_args): a side that does not set a flag has this value.
DEFAULTS = {
    "--group-query-attention": False, "--num-query-groups": 1, "--qk-layernorm": False, "--add-qkv-bias": False,
    "--swiglu": False, "--disable-bias-linear": False, "--untie-embeddings-and-output-weights": False,
    "--normalization": "LayerNorm", "--norm-epsilon": 1e-5, "--position-embedding-type": "learned_absolute",
    "--rotary-base": 10000, "--rotary-percent": 1.0, "--use-rope-scaling": False, "--rotary-scaling-factor": 1.0,
    "--rope-type": None, "--mscale": 1.0, "--mscale-all-dim": 0.0, "--original-max-position-embeddings": 4096,
    "--beta-fast": 32, "--beta-slow": 1, "--no-rope-fusion": False, "--multi-latent-attention": False,
    "--q-lora-rank": None, "--kv-lora-rank": 32, "--qk-head-dim": 128, "--qk-pos-emb-head-dim": 64,
    "--v-head-dim": 128, "--kv-channels": None, "--num-experts": None, "--moe-ffn-hidden-size": None,
    "--moe-router-topk": 2, "--moe-layer-freq": 1, "--moe-shared-expert-intermediate-size": None,
    "--moe-router-score-function": "softmax", "--moe-router-pre-softmax": False,
    "--moe-router-enable-expert-bias": False, "--moe-router-topk-scaling-factor": None,
    "--moe-router-num-groups": None, "--moe-router-group-topk": None, "--moe-router-load-balancing-type": "aux_loss",
    "--moe-router-bias-update-rate": 0.001, "--moe-aux-loss-coeff": 0.0, "--moe-token-dispatcher-type": "allgather",
    "--moe-grouped-gemm": False, "--moe-permute-fusion": False, "--moe-router-dtype": None,
    "--moe-token-drop-policy": "probs", "--attention-softmax-in-fp32": False, "--spec": None,
    "--enable-experimental": False, "--make-vocab-size-divisible-by": 128, "--no-position-embedding": False,
    "--max-position-embeddings": None, "--apply-layernorm-1p": False, "--attention-output-gate": False,
    "--moe-shared-expert-gate": False, "--mtp-num-layers": None,
}
# Spellings Megatron treats as one setting.
ALIASES = {"--use-rotary-position-embeddings": ("--position-embedding-type", "rope")}

QWEN3_8B = {  # scripts/models/qwen3-8B.py
    "--swiglu": True, "--num-layers": 36, "--hidden-size": 4096, "--ffn-hidden-size": 12288,
    "--num-attention-heads": 32, "--group-query-attention": True, "--num-query-groups": 8,
    "--position-embedding-type": "rope", "--disable-bias-linear": True, "--normalization": "RMSNorm",
    "--norm-epsilon": 1e-6, "--rotary-base": 1000000, "--vocab-size": 151936, "--kv-channels": 128,
    "--qk-layernorm": True, "--untie-embeddings-and-output-weights": True,
}
QWEN3_30B_A3B = {  # scripts/models/qwen3-30B-A3B.py
    "--disable-bias-linear": True, "--qk-layernorm": True, "--group-query-attention": True,
    "--num-attention-heads": 32, "--num-query-groups": 4, "--kv-channels": 128, "--num-layers": 48,
    "--hidden-size": 2048, "--ffn-hidden-size": 6144, "--normalization": "RMSNorm",
    "--position-embedding-type": "rope", "--norm-epsilon": 1e-6, "--rotary-percent": 1.0, "--swiglu": True,
    "--untie-embeddings-and-output-weights": True, "--vocab-size": 151936, "--rotary-base": 1000000,
    "--moe-ffn-hidden-size": 768, "--moe-router-score-function": "softmax", "--moe-token-dispatcher-type": "alltoall",
    "--moe-router-topk": 8, "--moe-layer-freq": [1] * 48, "--num-experts": 128, "--moe-grouped-gemm": True,
    "--moe-token-drop-policy": "probs", "--moe-router-dtype": "fp32", "--moe-permute-fusion": True,
    "--moe-aux-loss-coeff": 0,
}
QWEN3_5_35B_A3B = {  # scripts/models/qwen3.5-35B-A3B.py (qwen3.6-35B-A3B.py: the same flags)
    "--spec": ["miles_plugins.models.qwen3_5", "get_qwen3_5_spec"], "--disable-bias-linear": True,
    "--qk-layernorm": True, "--group-query-attention": True, "--num-attention-heads": 16, "--num-query-groups": 2,
    "--kv-channels": 256, "--num-layers": 40, "--hidden-size": 2048, "--ffn-hidden-size": 512,
    "--normalization": "RMSNorm", "--apply-layernorm-1p": True, "--position-embedding-type": "rope",
    "--norm-epsilon": 1e-6, "--rotary-percent": 0.25, "--swiglu": True, "--untie-embeddings-and-output-weights": True,
    "--vocab-size": 248320, "--rotary-base": 10000000, "--moe-ffn-hidden-size": 512,
    "--moe-shared-expert-intermediate-size": 512, "--moe-router-score-function": "softmax",
    "--moe-token-dispatcher-type": "alltoall", "--moe-router-topk": 8, "--moe-layer-freq": [1] * 40,
    "--num-experts": 256, "--moe-grouped-gemm": True, "--moe-token-drop-policy": "probs", "--moe-router-dtype": "fp32",
    "--moe-permute-fusion": True, "--moe-aux-loss-coeff": 0, "--attention-output-gate": True,
    "--moe-shared-expert-gate": True, "--mtp-num-layers": 1,
}
QWEN3_5_27B = {  # scripts/models/qwen3.5-27B.py
    "--spec": ["miles_plugins.models.qwen3_5", "get_qwen3_5_spec"], "--disable-bias-linear": True,
    "--qk-layernorm": True, "--group-query-attention": True, "--num-attention-heads": 24, "--num-query-groups": 4,
    "--kv-channels": 256, "--num-layers": 64, "--hidden-size": 5120, "--ffn-hidden-size": 17408,
    "--normalization": "RMSNorm", "--apply-layernorm-1p": True, "--position-embedding-type": "rope",
    "--norm-epsilon": 1e-6, "--rotary-percent": 0.25, "--swiglu": True, "--untie-embeddings-and-output-weights": True,
    "--vocab-size": 248320, "--rotary-base": 10000000, "--attention-output-gate": True,
}
_DEEPSEEK_ROUTER = {  # the MoE block scripts/models/deepseek-v3.py and kimi-k2.py share
    "--moe-ffn-hidden-size": 2048, "--moe-router-topk": 8, "--moe-shared-expert-intermediate-size": 2048,
    "--moe-router-pre-softmax": True, "--moe-router-score-function": "sigmoid",
    "--moe-router-enable-expert-bias": True, "--moe-router-load-balancing-type": "seq_aux_loss",
    "--moe-token-dispatcher-type": "alltoall", "--moe-aux-loss-coeff": 0, "--moe-router-bias-update-rate": 0,
    "--moe-grouped-gemm": True, "--moe-router-dtype": "fp32", "--moe-permute-fusion": True,
}
_DEEPSEEK_ATTENTION = {  # the dimensions both set
    "--disable-bias-linear": True, "--num-layers": 61, "--hidden-size": 7168, "--ffn-hidden-size": 18432,
    "--normalization": "RMSNorm", "--position-embedding-type": "rope", "--norm-epsilon": 1e-6, "--swiglu": True,
    "--untie-embeddings-and-output-weights": True, "--multi-latent-attention": True, "--q-lora-rank": 1536,
    "--kv-lora-rank": 512, "--qk-head-dim": 128, "--qk-pos-emb-head-dim": 64, "--v-head-dim": 128,
    "--qk-layernorm": True, "--mscale": 1.0, "--mscale-all-dim": 1.0, "--attention-softmax-in-fp32": True,
    "--no-rope-fusion": True,
}
DEEPSEEK_V3 = {  # scripts/models/deepseek-v3.py
    **_DEEPSEEK_ATTENTION, **_DEEPSEEK_ROUTER, "--num-attention-heads": 128, "--kv-channels": 128,
    "--vocab-size": 129280, "--rotary-scaling-factor": 40, "--rotary-base": 10000, "--num-experts": 256,
    "--moe-layer-freq": [0] * 3 + [1] * 58, "--moe-router-group-topk": 4, "--moe-router-num-groups": 8,
    "--moe-router-topk-scaling-factor": 2.5,
}
KIMI_K2 = {  # scripts/models/kimi-k2.py
    **_DEEPSEEK_ATTENTION, **_DEEPSEEK_ROUTER, "--num-attention-heads": 64, "--kv-channels": 64,
    "--rope-type": "yarn", "--vocab-size": 163840, "--rotary-scaling-factor": 32.0, "--rotary-base": 50000,
    "--original-max-position-embeddings": 4096, "--beta-fast": 1, "--beta-slow": 1, "--num-experts": 384,
    "--moe-layer-freq": [0] * 1 + [1] * 60, "--moe-router-group-topk": 1, "--moe-router-num-groups": 1,
    "--moe-router-topk-scaling-factor": 2.827,
}
GLM5 = {  # scripts/models/glm5-744B-A40B.py (n_moe_layers 75)
    "--spec": ["miles_plugins.models.glm5.glm5", "get_glm5_spec"], "--moe-layer-freq": [0] * 3 + [1] * 75,
    "--num-experts": 256, "--moe-shared-expert-intermediate-size": 2048, "--moe-router-topk": 8,
    "--moe-grouped-gemm": True, "--moe-permute-fusion": True, "--moe-ffn-hidden-size": 2048,
    "--moe-router-score-function": "sigmoid", "--moe-router-pre-softmax": True,
    "--moe-router-enable-expert-bias": True, "--moe-router-bias-update-rate": 0,
    "--moe-router-load-balancing-type": "seq_aux_loss", "--moe-router-topk-scaling-factor": 2.5,
    "--moe-aux-loss-coeff": 0, "--moe-router-dtype": "fp32", "--make-vocab-size-divisible-by": 16,
    "--num-layers": 78, "--hidden-size": 6144, "--ffn-hidden-size": 12288, "--num-attention-heads": 64,
    "--disable-bias-linear": True, "--swiglu": True, "--untie-embeddings-and-output-weights": True,
    "--position-embedding-type": "rope", "--no-position-embedding": True, "--normalization": "RMSNorm",
    "--qk-layernorm": True, "--multi-latent-attention": True, "--q-lora-rank": 2048, "--kv-lora-rank": 512,
    "--qk-head-dim": 192, "--v-head-dim": 256, "--kv-channels": 192, "--qk-pos-emb-head-dim": 64,
    "--vocab-size": 154880, "--rotary-base": 1000000, "--enable-experimental": True,
}
LLAMA31_8B = {  # scripts/models/llama3.1-8B-Instruct.py (Miles has no Llama-3-8B file; see below)
    "--swiglu": True, "--num-layers": 32, "--hidden-size": 4096, "--ffn-hidden-size": 14336,
    "--num-attention-heads": 32, "--group-query-attention": True, "--num-query-groups": 8,
    "--max-position-embeddings": 131072, "--position-embedding-type": "rope", "--disable-bias-linear": True,
    "--normalization": "RMSNorm", "--norm-epsilon": 1e-5, "--rotary-base": 500000, "--vocab-size": 128256,
    "--kv-channels": 128, "--use-rope-scaling": True, "--rotary-scaling-factor": 8.0,
    "--untie-embeddings-and-output-weights": True,
}

# RoPE as the published config.json files carry it (read with the search tools: DeepSeek-V3's and
# Kimi-K2-Instruct's rope_theta and YaRN rope_scaling; GLM-5's rope_parameters, rope_theta 1e6 with the
# default rope type; Llama-3.1-8B's llama3 rope_scaling). The built-in catalogs must carry the first
# three (test below); pcc catalogs Llama-3-8B, which has no scaling, so its row is applied to compare
# with Miles' Llama-3.1 file.
PUBLISHED_ROPE = {
    "deepseek_v3": {"rope_theta": 10000, "rope_scaling": {
        "type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
        "beta_fast": 32, "beta_slow": 1}},
    "kimi_k2": {"rope_theta": 50000.0, "rope_scaling": {
        "type": "yarn", "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
        "beta_fast": 1.0, "beta_slow": 1.0}},
    "glm5": {"rope_parameters": {"rope_theta": 1000000, "rope_type": "default"}},
}
LLAMA31_ROPE = {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}

# flag -> why pcc's value differs from the Miles script's (per model; "*" for every model).
EXPECTED_DIFFERENCES = {
    "*": {
        "--moe-router-dtype": "not architecture: the megatron target emits it (test below)",
        "--attention-softmax-in-fp32": "used only by Megatron's unfused attention (FusedScaleMaskSoftmax); "
                                       "the Miles launch runs Transformer Engine attention",
        "--max-position-embeddings": "Miles replaces it with --seq-length (set_default_megatron_args in "
                                     "miles/backends/megatron_utils/arguments.py): a job setting",
    },
    "deepseek_v3": {"--moe-router-pre-softmax": "no effect with a sigmoid router (megatron/core/transformer/moe/"
                                                "moe_utils.py topk_routing_with_score_function)",
                    "--rope-type": "Miles sets yarn for MLA when unset (set_default_megatron_args); pcc writes it"},
    "kimi_k2": {
        "--moe-router-pre-softmax": "no effect with a sigmoid router",
        "--moe-router-num-groups": "one group of experts is no group limit: pcc leaves both group flags unset",
        "--moe-router-group-topk": "one group of experts is no group limit",
        "--kv-channels": "unused under MLA with TE attention (MultiLatentAttention passes the q/k and v head dims); "
                         "Miles' scripts disagree among themselves (DeepSeek-V3 128, Kimi-K2 64, GLM-5 192): pcc "
                         "writes qk_nope_head_dim",
        "--rope-type": "Miles sets yarn for MLA when unset (set_default_megatron_args); pcc writes it",
    },
    "glm5": {
        "--moe-router-pre-softmax": "no effect with a sigmoid router",
        "--no-position-embedding": "only drops a learned absolute position table, which a RoPE model has none of",
        "--moe-token-dispatcher-type": "Miles turns allgather (Megatron's default, which its GLM-5 script keeps) "
                                       "into alltoall (parse_args in miles/utils/arguments.py): alltoall either way",
    },
}


def _parse(args: list[str]) -> dict:
    """flag -> value (True for a bare flag; numbers as float; --moe-layer-freq as its per-layer list)."""
    out: dict = {}
    flag = None
    for a in args:
        if a.startswith("--"):
            flag, value = ALIASES.get(a, (a, True))
            out[flag] = value
        else:
            out[flag] = a if out[flag] is True else [*out[flag], a] if isinstance(out[flag], list) else [out[flag], a]
    for k, v in out.items():
        if k == "--moe-layer-freq":
            out[k] = eval(v, {})  # noqa: S307 - pcc's own run-length expression, e.g. [0]*3+[1]*58
        elif isinstance(v, str):
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


def _norm(d: dict) -> dict:
    full = {k: d.get(k, v) for k, v in DEFAULTS.items()} | d
    return {k: (float(v) if isinstance(v, int) and not isinstance(v, bool) else v) for k, v in full.items()}


def _generated(name: str):
    config = dict(load_catalog(name).config)
    if name == "llama3_8b":
        config |= LLAMA31_ROPE
    arch, gap = architecture(config, tables())
    assert arch is not None, gap
    return arch


@pytest.mark.parametrize("name, miles", [("qwen3_8b", QWEN3_8B), ("qwen3_30b_a3b", QWEN3_30B_A3B),
                                         ("deepseek_v3", DEEPSEEK_V3), ("kimi_k2", KIMI_K2), ("glm5", GLM5),
                                         ("llama3_8b", LLAMA31_8B), ("qwen3_5_35b_a3b", QWEN3_5_35B_A3B),
                                         ("qwen3_5_27b", QWEN3_5_27B)])
def test_field_by_field_against_miles_model_scripts(name, miles):
    ours = _norm(_parse(_generated(name).args + ["--moe-router-dtype", "fp32"] * ("--moe-router-dtype" in miles)))
    theirs = _norm({k: (float(v) if isinstance(v, int) and not isinstance(v, bool) else v) for k, v in miles.items()})
    allowed = EXPECTED_DIFFERENCES["*"] | EXPECTED_DIFFERENCES.get(name, {})
    differ = {k: (ours.get(k), theirs.get(k)) for k in set(ours) | set(theirs)
              if ours.get(k) != theirs.get(k) and k not in allowed}
    assert not differ, f"{name}: pcc vs Miles' script: {differ}"


def test_the_megatron_target_sets_the_router_dtype_miles_scripts_set():
    from pcc.lower import lower
    from pcc.plan import compile_file
    from pathlib import Path

    plan = compile_file(str(Path(__file__).resolve().parents[2] / "contracts/bf16_baseline.prec")).plan
    a = lower(plan, "megatron").args
    assert a[a.index("--moe-router-dtype") + 1] == "fp32"


@pytest.mark.parametrize("name", sorted(PUBLISHED_ROPE))
def test_catalogs_carry_the_published_rope(name):
    config = load_catalog(name).config
    assert {k: config.get(k) for k in PUBLISHED_ROPE[name]} == PUBLISHED_ROPE[name]


def test_a_config_without_rope_theta_says_so():
    """No --rotary-base is guessed for a config without rope_theta, and the file says so (Miles
    compares rotary_base with the checkpoint at start)."""
    config = {k: v for k, v in load_catalog("kimi_k2").config.items() if k != "rope_theta"}
    arch, _ = architecture(config, tables())
    assert "--rotary-base" not in arch.args
    assert any("rope_theta" in n for n in arch.notes)


def test_layer_pattern_is_megatron_list_expression():
    assert layer_pattern([0, 0, 0, 1, 1]) == "[0]*3+[1]*2"
    assert eval(layer_pattern([1] * 48), {}) == [1] * 48  # noqa: S307
    c = {"num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [5]}
    assert moe_layers(c) == [0, 1, 0, 1, 0, 0]


def test_unmapped_model_types_and_unexpressible_configs_are_gaps():
    arch, gap = architecture({"model_type": "gpt_oss", "num_hidden_layers": 2}, tables())
    assert arch is None and "gpt_oss" in gap
    c = dict(load_catalog("qwen3_8b").config, hidden_act="gelu")
    arch, gap = architecture(c, tables())
    assert arch is None and "gelu" in gap
    c = dict(load_catalog("deepseek_v3").config, norm_topk_prob=False)
    assert architecture(c, tables())[0] is None


def test_qwen3_moe_router_without_normalized_topk_is_pre_softmax():
    c = dict(load_catalog("qwen3_30b_a3b").config, norm_topk_prob=False)
    assert "--moe-router-pre-softmax" in architecture(c, tables())[0].args


def _megatron_parses(args: list[str], arch: int = 9):
    """Parse with megatron-core's parser and validation, and build its TransformerConfig, as
    `pcc compile --verify` does (pcc.lower.verify_megatron: model_args, checkable)."""
    vm = pytest.importorskip("pcc.lower.verify_megatron")
    try:
        vm._arguments()
    except vm.EngineMissing as exc:
        pytest.skip(str(exc))
    launch = ["--bf16", "--transformer-impl", "transformer_engine"]
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        return vm.verify_megatron_args(launch, vm.checkable(args, tables()["megatron_fork_flags"]) + vm.JOB_STAND_INS,
                                       arch)


@pytest.mark.parametrize("name", ["qwen3_8b", "qwen3_30b_a3b", "deepseek_v3", "kimi_k2", "glm5", "llama3_8b",
                                  "tiny_moe", "tiny_dense", "tiny_shared_moe", "qwen3_5_35b_a3b",
                                  "qwen3_5_27b"])
def test_megatron_core_parses_the_architecture(name):
    arch = _generated(name)
    ns = _megatron_parses(arch.args)
    c = lm_config(load_catalog(name).config)
    tc = ns.transformer_config
    assert tc.num_layers == c["num_hidden_layers"] and tc.hidden_size == c["hidden_size"]
    assert tc.num_attention_heads == c["num_attention_heads"]
    assert tc.multi_latent_attention == ("kv_lora_rank" in c)
    if tc.num_moe_experts:
        assert tc.moe_layer_freq == moe_layers(c) or (tc.moe_layer_freq == 1 and all(moe_layers(c)))


def test_megatron_fork_flags_are_the_only_ones_megatron_core_lacks():
    """Every generated flag is in megatron-core's parser except the YaRN ones Miles' Megatron adds."""
    vm = pytest.importorskip("pcc.lower.verify_megatron")
    try:
        arguments = vm._arguments()
    except vm.EngineMissing as exc:
        pytest.skip(str(exc))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    known = {o for act in parser._actions for o in act.option_strings}
    used = {a for name in ("deepseek_v3", "kimi_k2", "glm5", "llama3_8b", "qwen3_30b_a3b", "qwen3_5_35b_a3b")
            for a in _generated(name).args if a.startswith("--")}
    assert used - known == set(tables()["megatron_fork_flags"])
