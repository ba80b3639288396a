"""Every example launch Miles and verl publish, imported as a user would (issue 26).

tests/importer/launches/ holds verbatim copies (SOURCES.json: repository, commit, folder). Each
script imports, checks and compiles, or is refused with a coded diagnostic; expected.json records
which, with the model catalog it is read against and the warning codes it gets (PCC_UPDATE_GOLDEN=1
rewrites it after a reviewed change). For the ones that compile, the regenerated launch is compared
with the script setting by setting (Miles flags through Miles' engine table, verl keys through
verl's composed config, defaults applied on both sides): every precision-relevant setting comes
back the same, or the import said, with a code, that it cannot carry it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from pcc.lang.diagnostics import PccError
from pcc.lower import lower

sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_corpus import Expected, outcome  # noqa: E402

ROOT = Path(__file__).parent / "launches"
EXPECTED = Expected(ROOT / "expected.json")
CASES = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.sh"))

# The checkpoint a script names -> the catalog of that model (the models' own configs; a name not here
# has no catalog, and the import says so). Base, instruct and quantized releases (-FP8, -INT4) of a
# model share its architecture (Miles' scripts/models gives them the same flags).
_VARIANT = r"(-Base|-Instruct(-2507)?|-Thinking|-FP8|-INT4)*"
MODELS = {cat: name + _VARIANT for cat, name in {
    "qwen3_30b_a3b": r"Qwen3-30B-A3B", "qwen3_8b": r"Qwen3-8B", "qwen3_4b": r"Qwen3-4B", "qwen3_32b": r"Qwen3-32B",
    "qwen2_5_0_5b": r"Qwen2\.5-0\.5B", "qwen2_5_3b": r"Qwen2\.5-3B", "qwen2_5_7b": r"Qwen2\.5-7B",
    "deepseek_v3": r"DeepSeek-V3", "kimi_k2": r"Kimi-K2", "glm5": r"GLM-5", "qwen3_0_6b": r"Qwen3-0\.6B",
    "qwen3_1_7b": r"Qwen3-1\.7B", "qwen3_235b_a22b": r"Qwen3-235B-A22B", "qwen2_5_1_5b": r"Qwen2\.5-1\.5B",
    "qwen2_5_32b": r"Qwen2\.5-32B", "llama3_2_1b": r"Llama-3\.2-1B", "moonlight_16b_a3b": r"Moonlight-16B-A3B",
    "qwen3_5_35b_a3b": r"Qwen3\.5-35B-A3B", "qwen2_5_14b": r"Qwen2\.5-14B", "qwen2_5_72b": r"Qwen2\.5-72B",
    "qwen3_5_27b": r"Qwen3\.5-27B", "qwen3_5_122b_a10b": r"Qwen3\.5-122B-A10B", "qwen3_5_397b_a17b": r"Qwen3\.5-397B-A17B",
    "gpt_oss_20b": r"gpt-oss-20[bB]", "minimax_m2": r"MiniMax-M2(\.1|\.5|\.7)?"}.items()}

# Miles/Megatron/SGLang flags that decide numerics, placement of precision, or what sync and the
# correction do: compared between the script and the regenerated launch.
MILES_PRECISION = (
    "--bf16", "--fp16", "--fp8-format", "--fp8-recipe", "--fp4-format", "--fp4-recipe", "--first-last-layers-bf16",
    "--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16", "--te-precision-config-file",
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--expert-model-parallel-size",
    "--expert-tensor-parallel-size", "--context-parallel-size", "--optimizer", "--use-distributed-optimizer",
    "--use-precision-aware-optimizer", "--optimizer-cpu-offload", "--main-params-dtype", "--exp-avg-dtype",
    "--exp-avg-sq-dtype", "--main-grads-dtype", "--moe-router-dtype", "--sglang-kv-cache-dtype",
    "--sglang-quantization", "--rollout-num-gpus-per-engine", "--sglang-ep-size", "--sglang-dp-size",
    "--sglang-pp-size", "--use-tis", "--tis-clip", "--tis-clip-low", "--use-rollout-routing-replay",
    "--use-routing-replay", "--lora-rank", "--lora-alpha", "--target-modules", "--update-weights-interval",
    "--max-weight-staleness", "--rollout-max-response-len", "--colocate", "--sglang-enable-deterministic-inference",
)
# What Megatron runs for a flag the launch leaves out (radixark/Megatron-LM miles-main 2e64d788b,
# megatron/training/arguments.py defaults; targets/miles_flags.json records no defaults). Unset
# --expert-tensor-parallel-size is the tensor-parallel size (validate_args).
MEGATRON_DEFAULTS = {
    "--tensor-model-parallel-size": "1", "--pipeline-model-parallel-size": "1", "--expert-model-parallel-size": "1",
    "--context-parallel-size": "1", "--optimizer": "adam", "--main-params-dtype": "fp32", "--exp-avg-dtype": "fp32",
    "--exp-avg-sq-dtype": "fp32", "--main-grads-dtype": "fp32", "--rollout-num-gpus-per-engine": "1",
    "--sglang-ep-size": "1", "--sglang-dp-size": "1", "--sglang-pp-size": "1",
    # Miles' own (radixark/miles 31f1ca961 miles/utils/arguments.py)
    "--update-weights-interval": "1", "--tis-clip": "2.0", "--tis-clip-low": "0",
}
# Miles' `--target-modules all-linear` (miles/utils/arguments.py, after parsing): the attention and MLP
# projections, plus the MLA ones when the model has them.
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ALL_LINEAR_MLA = ("kv_a_proj_with_mqa", "kv_b_proj")
VERL_PRECISION = re.compile(
    r"(override_transformer_config\.(fp8|fp8_recipe|fp4|fp4_recipe|first_last_layers_bf16|num_layers_at_\w+_in_bf16"
    r"|moe_router_dtype)|megatron\.(tensor|pipeline|expert|expert_tensor|context)_model_parallel_size"
    r"|megatron\.context_parallel_size|rollout\.(tensor_model_parallel_size|data_parallel_size|expert_parallel_size"
    r"|name|quantization|kv_cache_dtype|dtype|response_length)|\.lora_rank$|\.lora_alpha$|\.target_modules$"
    r"|rollout_correction\.|use_precision_aware_optimizer|optimizer_offload|use_distributed_optimizer"
    r"|fsdp_config\.(param_dtype|reduce_dtype|model_dtype|dtype)|mixed_precision)")


def _kind(case: str) -> str:
    return case.split("/", 1)[0]


def _model(case: str) -> str | None:
    """The catalog of the checkpoint the script runs (its --hf-checkpoint / actor_rollout_ref.model.path)."""
    path = ROOT / case
    try:
        if _kind(case) == "miles":
            from pcc.importer.miles import Launch

            named = Launch(str(path)).value("--hf-checkpoint")
        else:
            from pcc.importer.verl_source import read_job

            entry = read_job(str(path)).entries.get("actor_rollout_ref.model.path")
            named = str(entry.value) if entry is not None else None
    except PccError:
        return None
    name = Path(str(named).rstrip("/")).name if named else ""
    return next((cat for cat, pattern in MODELS.items() if re.fullmatch(pattern, name)), None)


def _norm(x):
    if isinstance(x, (list, tuple)):
        x = ",".join(sorted(map(str, x)))
    if isinstance(x, str) and x == "all-linear":  # PEFT's and Miles' name for every linear projection
        x = ",".join(sorted(ALL_LINEAR))
    return str(x).lower() if isinstance(x, bool) or str(x).lower() in ("true", "false") else x


def _same(a, b) -> bool:
    norm = [_norm(a), _norm(b)]
    try:
        return float(norm[0]) == float(norm[1])
    except (TypeError, ValueError):
        return str(norm[0]) == str(norm[1])


def _miles_settings(source: str, args: list[str], catalog) -> tuple[dict, dict]:
    from pcc.importer.miles import Launch, parse_args
    from pcc.lower.engine_table import table

    miles = table("miles")

    def values(given: dict) -> dict:
        out = {k: miles.value(given, k) for k in MILES_PRECISION}
        out.update({k: d for k, d in MEGATRON_DEFAULTS.items() if out[k] is None})
        if out["--expert-tensor-parallel-size"] is None:
            out["--expert-tensor-parallel-size"] = out["--tensor-model-parallel-size"]
        if not catalog.is_moe:  # no experts: expert parallelism runs nothing
            del out["--expert-tensor-parallel-size"], out["--expert-model-parallel-size"], out["--sglang-ep-size"]
        if out["--target-modules"] == "all-linear":
            mla = catalog.config.get("kv_lora_rank") is not None
            out["--target-modules"] = ",".join(ALL_LINEAR + (ALL_LINEAR_MLA if mla else ()))
        if isinstance(out["--target-modules"], str):
            out["--target-modules"] = ",".join(sorted(out["--target-modules"].split(",")))
        return out

    return values(Launch(source).flags), values(miles.effective(parse_args(args)[1]))


def _verl_settings(source: str, lowered, engine: str) -> tuple[dict, dict]:
    from pcc.importer.verl_source import read_job
    from pcc.lower.engine_table import table

    verl = table("verl")
    job = read_job(source)
    gen = {s.key.lstrip("+~"): s.value for s in lowered.settings if s.kind == "key"}
    # the config verl composes: the one the script names, else its engine's (`model_engine=megatron` on
    # ppo_trainer composes what ppo_megatron_trainer does; the import read which engine the job runs)
    config = verl.config(job.config) or ("ppo_megatron_trainer" if engine == "megatron" else "ppo_trainer")
    keys = {k for k in gen if VERL_PRECISION.search(k)} | {k for k in job.entries if VERL_PRECISION.search(k)}
    src_set = {k: e.value for k, e in job.entries.items()}
    return ({k: _resolved(k, src_set, verl, config) for k in keys},
            {k: _resolved(k, gen, verl, config) for k in keys})


# Megatron's OptimizerConfig defaults for the keys verl's override_optimizer_config sets on it
# (megatron-core optimizer_config.py): unset there is this.
OPTIMIZER_DEFAULTS = {"optimizer_offload_fraction": 1.0, "use_precision_aware_optimizer": False,
                      "optimizer_cpu_offload": False}


def _resolved(key: str, given: dict, verl, config: str, depth: int = 0):
    """A key's value as OmegaConf resolves it: the job's, else the default, with `${k}` and
    `${oc.select:k,default}` interpolations followed."""
    leaf = key.rsplit(".", 1)[-1]
    default = OPTIMIZER_DEFAULTS.get(leaf) if ".override_optimizer_config." in key else verl.default(key, config)
    value = given[key] if key in given else default
    m = re.fullmatch(r"\$\{(?:oc\.select:)?([\w.]+)(?:,(.*))?\}", value) if isinstance(value, str) else None
    if m is None or depth > 8:
        return value
    if m[1] in given or verl.default(m[1], config) is not None:
        return _resolved(m[1], given, verl, config, depth + 1)
    return m[2]


def _lost(case: str, imp, plan) -> list[str]:
    """Precision-relevant settings the regenerated launch gives differently and no warning names."""
    path = str(ROOT / case)
    if _kind(case) == "miles":
        src, gen = _miles_settings(path, lower(plan, "miles").args, plan.catalog)
    else:
        src, gen = _verl_settings(path, lower(plan, "verl"), plan.contract.trainer.engine)
    said = " ".join(f"{d.path or ''} {d.message}" for d in imp.diagnostics)
    return sorted(f"{k}: {src[k]!r} -> {gen[k]!r}" for k in src
                  if not _same(src[k], gen[k]) and k.lstrip("-").rsplit(".", 1)[-1] not in said)


@pytest.mark.parametrize("case", CASES)
def test_published_launch(case, tmp_path):
    got, lost = outcome(_kind(case), ROOT / case, _model(case), tmp_path,
                        lambda imp, plan: _lost(case, imp, plan), paths=False)
    EXPECTED.check(case, got, lost)


def test_every_copy_is_expected():
    """expected.json names exactly the copies here (a script added or removed updates both)."""
    assert sorted(EXPECTED.cases) == CASES


def test_the_docs_list_every_launch_tested():
    """docs/import-launches.md is what tools/launch_table.py writes from expected.json."""
    import subprocess
    import sys

    tool = Path(__file__).resolve().parents[2] / "tools" / "launch_table.py"
    assert subprocess.run([sys.executable, str(tool), "--check"], timeout=60).returncode == 0, \
        "docs/import-launches.md is stale: run python tools/launch_table.py"
