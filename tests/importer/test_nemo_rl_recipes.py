"""Every example recipe NeMo RL publishes, imported as a user would (issue 30).

tests/importer/nemo_rl_recipes/ holds verbatim copies under their repository paths (SOURCES.json:
repository, commit, path and sha256 of every recipe and of every base its `defaults:` chain inherits).
Each recipe imports, checks and compiles, or is refused with a coded diagnostic; expected.json records
which, with the model catalog it is read against and the warnings it gets (code and key;
PCC_UPDATE_GOLDEN=1 rewrites it after a reviewed change). For the ones that compile, the regenerated
recipe (the bundle's config.yaml over the base recipe its launch.sh names) is compared with the
published one setting by setting, both read with their `defaults:` chains: every precision-relevant
setting comes back the same, or the import said, with a code, that it cannot carry it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import sys
from pathlib import Path

import pytest

from pcc.importer import Imported
from pcc.lang.diagnostics import PccError
from pcc.lower import lower

sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_corpus import Expected, outcome  # noqa: E402

ROOT = Path(__file__).parent / "nemo_rl_recipes"
SOURCES = json.loads((ROOT / "SOURCES.json").read_text())
EXPECTED = Expected(ROOT / "expected.json")
CASES = sorted(SOURCES["recipes"])

# The checkpoint a recipe trains (policy.model_name, its last path component) -> the catalog of that
# model; a name not here has no catalog, and the import says so (PCC801). Base and instruct releases
# share their model's architecture.
MODELS = {cat: re.compile(name) for cat, name in {
    "llama3_8b": r"Llama-3\.1-8B(-Instruct)?", "qwen3_8b": r"Qwen3-8B(-Base)?", "qwen3_4b": r"Qwen3-4B(-Base)?",
    "qwen3_32b": r"Qwen3-32B", "qwen3_30b_a3b": r"Qwen3-30B-A3B(-Base|-Instruct-2507|-Thinking-2507)?",
    "qwen2_5_7b": r"Qwen2\.5-7B(-Instruct)?", "qwen2_5_3b": r"Qwen2\.5-3B(-Instruct)?",
    "qwen2_5_0_5b": r"Qwen2\.5-0\.5B(-Instruct)?", "qwen3_5_35b_a3b": r"Qwen3\.5-35B-A3B(-Base)?",
    "llama3_2_1b": r"Llama-3\.2-1B(-Instruct)?", "qwen3_0_6b": r"Qwen3-0\.6B(-Base)?", "qwen3_1_7b": r"Qwen3-1\.7B(-Base)?",
    "qwen3_235b_a22b": r"Qwen3-235B-A22B", "qwen2_5_1_5b": r"Qwen2\.5-1\.5B(-Instruct)?",
    "qwen2_5_32b": r"Qwen2\.5-32B(-Instruct)?", "moonlight_16b_a3b": r"Moonlight-16B-A3B(-Instruct)?",
    "qwen2_5_14b": r"Qwen2\.5-14B(-Instruct)?", "qwen2_5_72b": r"Qwen2\.5-72B(-Instruct)?",
    "qwen3_5_27b": r"Qwen3\.5-27B(-Base)?", "qwen3_5_122b_a10b": r"Qwen3\.5-122B-A10B(-Base)?",
    "qwen3_5_397b_a17b": r"Qwen3\.5-397B-A17B(-Base)?", "gpt_oss_20b": r"gpt-oss-20b",
    # MiniMax-M2.7 and GLM-5.1 have their predecessors' architecture fields (aiconfigurator's configs at 095f58a:
    # MiniMax-M2.7 differs from M2.5 in max_position_embeddings only, GLM-5.1 from GLM-5 in fields no tensor
    # shape reads).
    "minimax_m2": r"MiniMax-M2(\.1|\.5|\.7)?", "glm5": r"GLM-5(\.1)?"}.items()}
# NeMo RL's DeepSeek-V3 recipes name no checkpoint: their model_name points to this guide, which casts
# deepseek-ai/DeepSeek-V3 to a BF16 checkpoint (same config.json, quantization_config removed).
GUIDE = "docs/guides/deepseek.md"
# vLLM's CacheDType: "fp8" is FP8 E4M3 on CUDA (vllm/config/cache.py), the name pcc's vLLM target writes.
KV_ALIASES = {"fp8": "fp8_e4m3"}
# NeMo RL's docs/guides/lora.md: an empty megatron_cfg.peft.target_modules adapts all linear layers, these.
MEGATRON_ALL_LINEAR = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")

# The keys of a NeMo RL recipe that decide numerics, where precision is placed, or what the refit, its
# staleness (async GRPO) and the correction do: compared between the published recipe and the regenerated
# one (the other models of a job, teacher and value, are pcc's to name as not carried).
PRECISION = re.compile(
    r"^(policy|teacher|value)\.(precision$|megatron_cfg\.(enabled$|fp8_cfg\.|moe_router_dtype$|pipeline_dtype$"
    r"|(tensor|pipeline|expert|expert_tensor)_model_parallel_size$|context_parallel_size$|env_vars\.NVTE_"
    r"|optimizer\.(optimizer|use_distributed_optimizer|use_precision_aware_optimizer|bf16|fp16|params_dtype"
    r"|main_params_dtype|main_grads_dtype|exp_avg_dtype|exp_avg_sq_dtype)$|peft\.(enabled|target_modules|dim|alpha)$)"
    r"|dtensor_cfg\.(enabled$|tensor_parallel_size$|context_parallel_size$"
    r"|lora_cfg\.(enabled|match_all_linear|target_modules|dim|alpha)$)"
    r"|generation\.(backend$|max_new_tokens$|colocated\.enabled$|vllm_cfg\.(precision|kv_cache_dtype"
    r"|quantization_ignored_layer_kws|pow2_\w+|num_(first|last)_layers_in_bf16|tensor_parallel_size"
    r"|pipeline_parallel_size|expert_parallel_size)$)|router_replay\.enabled$)"
    r"|^loss_fn\.(use_importance_sampling_correction|truncated_importance_sampling_\w+"
    r"|sequence_level_importance_ratios)$"
    r"|^grpo\.async_grpo\.(enabled|max_trajectory_age_steps|in_flight_weight_updates)$")
# Any other key of the policy, the loss or another model of the job whose name says it carries precision
# (pcc.importer.verl.PRECISION: dtype, fp8, quant, ...): the import reads it or names it.
CARRIES = re.compile(r"^(policy|teacher|value|loss_fn)\.(?!.*(env_vars|kwargs|hf_config_overrides)\.)"
                     r".*(fp8|fp4|fp16|bf16|fp32|int4|int8|dtype|precision|quant|qat|amax|kv_cache)")


def _recipe(path: Path) -> dict:
    """A recipe's settings as NeMo RL's load_config merges them (its `defaults:` chain), interpolations followed."""
    return dict(_read(str(path)))


@functools.cache
def _read(path: str) -> dict:
    from pcc.importer.nemo_rl import read_recipe

    r = read_recipe(path, Imported({}, source=path))
    return {k: r.get(k) for k in list(r.values)}


def _model(case: str) -> str | None:
    try:
        named = _recipe(ROOT / case).get("policy.model_name")
    except PccError:
        return None
    if isinstance(named, str) and GUIDE in named:
        return "deepseek_v3"
    name = str(named).rstrip("/").rsplit("/", 1)[-1] if named else ""
    return next((cat for cat, pattern in MODELS.items() if pattern.fullmatch(name)), None)


def _norm(x):
    if x in (None, False, [], (), ""):  # NeMo RL reads an absent switch, list or name as off
        return None
    x = KV_ALIASES.get(x, x) if isinstance(x, str) else x
    if isinstance(x, (list, tuple)):
        return ",".join(sorted(map(str, x)))
    if isinstance(x, bool) or str(x).lower() in ("true", "false"):
        return str(x).lower()
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


def _regenerated(plan) -> dict:
    """The bundle's config.yaml over the base recipe launch.sh puts under it (pinned values)."""
    from pcc.importer.nemo_rl import _keys_table, _merge
    from pcc.lower.nemo_rl import tables

    base = _keys_table()["recipes"][tables()["base_config"][plan.contract.trainer.engine]]
    merged = _merge(dict(base), {s.key: s.value for s in lower(plan, "nemo_rl").settings})

    def resolve(value, depth=0):
        m = re.fullmatch(r"\$\{([\w.]+)\}", value.strip()) if isinstance(value, str) else None
        return resolve(merged.get(m[1]), depth + 1) if m and depth < 8 else value

    return {k: resolve(v) for k, v in merged.items()}


def _names(key: str) -> set[str]:
    """How a diagnostic may name a key: the key, a tail of it (megatron_cfg.moe_router_dtype), or a section
    above it deeper than policy.<backend> (megatron_cfg.peft names its target_modules, dim and alpha)."""
    parts = key.split(".")
    tails = {".".join(parts[i:]) for i in range(len(parts) - 1)}
    sections = {".".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 2, len(parts)) if j >= 3}
    return {key} | tails | sections


def _lost(case: str, imp, plan) -> list[str]:
    """Precision-relevant settings the regenerated recipe gives differently and no warning names."""
    from pcc.plan.patterns import LINEAR

    src, gen = _recipe(ROOT / case), _regenerated(plan)
    linear = [op.tensor.removesuffix(".weight") for op in plan.catalog.operators if op.family in LINEAR]
    kws = "policy.generation.vllm_cfg.quantization_ignored_layer_kws"
    peft = "policy.megatron_cfg.peft.target_modules"
    for side in (src, gen):  # Megatron-Bridge's LoRA with no target_modules adapts every linear layer
        if side.get("policy.megatron_cfg.peft.enabled") and not side.get(peft):
            side[peft] = list(MEGATRON_ALL_LINEAR)
    for side in (src, gen):  # NeMo RL matches these by substring: compare the modules each list keeps BF16
        if side.get(kws):
            words = [side[kws]] if isinstance(side[kws], str) else side[kws]
            side[kws] = sorted(m for m in linear if any(w in m for w in words))
    said = " ".join(f"{d.path or ''} {d.message}" for d in imp.diagnostics)
    sections = {d.path for d in imp.diagnostics if d.path}  # a warning on a section (value) names its keys
    keys = sorted(k for k in set(src) | set(gen) if PRECISION.search(k) or CARRIES.search(k))

    def off(k: str) -> bool:  # a section NeMo RL does not read: its `enabled` is off on both sides (peft, lora_cfg)
        switch = k.rsplit(".", 1)[0] + ".enabled"
        return k != switch and switch in set(src) | set(gen) and not _norm(src.get(switch)) and not _norm(gen.get(switch))

    return [f"{k}: {src.get(k)!r} -> {gen.get(k)!r}" for k in keys
            if _norm(src.get(k)) != _norm(gen.get(k)) and not off(k) and not any(k.startswith(p + ".") for p in sections)
            and not any(re.search(rf"(?<![\w.]){re.escape(n)}(?![\w])", said) for n in _names(k))]


@pytest.mark.parametrize("case", CASES)
def test_published_recipe(case, tmp_path):
    got, lost = outcome("nemo_rl", ROOT / case, _model(case), tmp_path,
                        lambda imp, plan: _lost(case, imp, plan), paths=True)
    EXPECTED.check(case, got, lost)


def test_copies_are_the_published_files():
    """Every copy is the file at the pinned commit (sha256), and nothing else is in the folder."""
    assert SOURCES["commit"] == "81aa43dda4765b0429cf31dab44441e4e4383911"
    files = {**SOURCES["recipes"], **SOURCES["bases"]}
    assert sorted(files) == sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.yaml"))
    for f, sha in files.items():
        assert hashlib.sha256((ROOT / f).read_bytes()).hexdigest() == sha, f


def test_every_copy_is_expected():
    """expected.json names exactly the recipes here (a recipe added or removed updates both)."""
    assert sorted(EXPECTED.cases) == CASES


def test_the_docs_list_every_recipe_tested():
    """docs/import-launches.md is what tools/launch_table.py writes from the expected.json files."""
    import subprocess
    import sys

    tool = Path(__file__).resolve().parents[2] / "tools" / "launch_table.py"
    assert subprocess.run([sys.executable, str(tool), "--check"], timeout=60, check=False).returncode == 0, \
        "docs/import-launches.md is stale: run python tools/launch_table.py"
