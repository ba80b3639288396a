"""verl lowering, checked by composing each job with verl's own Hydra configs and building verl's
config classes from it (requirements/verl.txt, a side folder); the rollout correction is checked by
running verl's own `compute_rollout_correction_weights`. With CI=true a missing verl fails these
tests; elsewhere they skip. Expected values are written out by hand.
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from pcc.lower import Unsupported, lower, targets_for
from pcc.lower import compile_file as check_file  # resolve, check and lower every target: what `pcc check` runs
from pcc.lower.verl import LAUNCH, OVERRIDES_FILE
from pcc.plan import compile_file

ROOT = Path(__file__).resolve().parents[2]
BF16 = (ROOT / "contracts" / "vllm" / "bf16_baseline.prec").read_text(encoding="utf-8")
# Contracts verl runs: the shipped verl variants (contracts/verl/, `framework verl`) and a vLLM BF16 contract lowered
# for verl directly; the shipped contracts verl cannot run are refused with a code (test_what_verl_cannot_run_is_refused).
SHIPPED = sorted(f"verl/{p.name}" for p in (ROOT / "contracts" / "verl").glob("*.prec")) + ["vllm/bf16_baseline.prec"]
LOG_RATIO = [[0.1, -1.0, 1.0, 0.9], [0.1, -0.2, 0.3, 0.0]]
MASK = [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]]


def _text(body: str, rollout: str = "vllm", trainer: str = "megatron", extra: str = "") -> str:
    """A stand-alone contract on qwen3_30b_a3b (H100) with the given statements."""
    return (f"contract c {{\n  model qwen3_30b_a3b\n  hardware H100\n  rollout {rollout} {{\n{body}\n  }}\n"
            f"  trainer {trainer} {{\n    gemm : bf16\n  }}\n{extra}}}\n")


VARIANTS = {
    "tis": _text("    parallel tp 4 ep 4", extra="  correction tis clip 2\n"),
    "mis_seq": _text("    parallel tp 4 ep 4", extra="  correction mis clip 2 low 0.5 level sequence\n"),
    "rejection": _text("    parallel tp 4 ep 4", extra="  correction rejection threshold 3\n"),
    "lora": _text("    parallel tp 4 ep 4", extra="  trainable lora rank 16 alpha 32 targets attn.q, attn.kv, attn.o\n"
                                                 "  sync adapter\n"),
    "fsdp": _text("    parallel tp 2", trainer="fsdp"),
    "kv_det": _text("    kv_cache : fp8_e4m3\n    deterministic\n    parallel tp 2 dp 2 ep 4"),
    "first_last": _text("    parallel tp 4 ep 4").replace(
        "    gemm : bf16", "    gemm : fp8_block real accumulate fp32 output bf16\n"
        "    keep bf16 : embed, lm_head, router, norm, *[0, -1]"),
}


def _plan_text(tmp_path: Path, text: str):
    p = tmp_path / "c.prec"
    p.write_text(text, encoding="utf-8")
    c = compile_file(str(p))
    assert c.ok, [str(d) for d in c.diagnostics if d.is_error]
    return c.plan


@pytest.fixture(scope="module")
def verl_checked(tmp_path_factory):
    from pcc.lower import verify_verl
    from pcc.lower.verl import tables

    plans = {name: compile_file(str(ROOT / "contracts" / name)).plan for name in SHIPPED}
    plans |= {name: _plan_text(tmp_path_factory.mktemp(name), text) for name, text in VARIANTS.items()}
    jobs = [{"config": tables()["config_name"][p.contract.trainer.engine], "overrides": lower(p, "verl").args,
             "log_ratio": LOG_RATIO, "mask": MASK} for p in plans.values()]
    typo = [*lower(plans["tis"], "verl").args, "actor_rollout_ref.rollout.quantisation='fp8'"]
    te_typo = [*lower(plans["tis"], "verl").args, "+actor_rollout_ref.actor.megatron.override_transformer_config.fp8_recipy='x'"]
    jobs += [{"config": "ppo_megatron_trainer", "overrides": o} for o in (typo, te_typo)]
    try:
        out = verify_verl.run_batch(jobs)
    except verify_verl.EngineMissing as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the verl checks: {exc}")
        pytest.skip(f"verl is not installed ({exc}); see requirements/verl.txt")
    n = len(plans)
    return {"plans": plans, "jobs": dict(zip(plans, out["jobs"][:n])), "probes": out["jobs"][n:],
            "version": out["version"]}


def test_verl_is_the_target_of_the_framework_a_contract_names():
    def names(rel):
        return targets_for(compile_file(str(ROOT / "contracts" / rel)).plan)

    assert "verl" in names("verl/unified_fp8.prec") and "miles" not in names("verl/unified_fp8.prec")
    assert "miles" in names("unified_fp8.prec") and "verl" not in names("unified_fp8.prec")
    assert not {"miles", "verl"} & set(names("vllm/unified_fp8.prec"))  # no framework: the engines' files only
    low = lower(compile_file(str(ROOT / "contracts" / "verl" / "unified_fp8.prec")).plan, "verl")
    assert low.files[OVERRIDES_FILE].splitlines() == low.args


@pytest.mark.engines
@pytest.mark.parametrize("name", SHIPPED + sorted(VARIANTS))
def test_verl_composes_and_builds_every_job(verl_checked, name):
    plan, got = verl_checked["plans"][name], verl_checked["jobs"][name]
    assert "error" not in got, got["error"]
    assert verl_checked["version"] == "0.9.1"
    par = plan.contract.rollout.parallel
    r = got["rollout"]
    assert (r["name"], r["tensor_model_parallel_size"], r["data_parallel_size"], r["expert_parallel_size"]) == \
           (plan.contract.rollout.engine, par.tp, par.dp, par.ep)
    assert r["calculate_log_probs"] is True
    assert got["actor"]["strategy"] == plan.contract.trainer.engine
    assert got["algorithm"]["class"] == "AlgoConfig"
    assert all(isinstance(v, str) for v in got["env"].values()), "Ray's runtime_env takes string values"


@pytest.mark.engines
def test_unified_fp8_on_verl(verl_checked):
    """Unified FP8 (seed): verl's online block-FP8 rollout, Megatron blockwise FP8 through TransformerConfig,
    R3 in both the rollout and the actor's router replay."""
    got = verl_checked["jobs"]["verl/unified_fp8.prec"]
    assert got["rollout"]["quantization"] == "fp8"
    assert got["rollout"]["enable_rollout_routing_replay"] is True and got["actor"]["router_replay"] == "R3"
    te = got["actor"]["transformer"]
    assert (te["fp8"], te["fp8_recipe"], te["moe_router_dtype"]) == ("e4m3", "blockwise", "fp32")
    assert got["actor"]["engine"] == {"tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 1,
                                      "expert_model_parallel_size": 8, "expert_tensor_parallel_size": 1,
                                      "use_distributed_optimizer": True}
    assert got["env"]["NVTE_FP8_BLOCK_SCALING_FP32_SCALES"] == "1"
    assert verl_checked["jobs"]["verl/tiny_cpu.prec"]["actor"]["engine"]["use_distributed_optimizer"] is True
    assert verl_checked["jobs"]["tis"]["actor"]["engine"]["use_distributed_optimizer"] is False  # not written: off
    assert verl_checked["jobs"]["vllm/bf16_baseline.prec"]["rollout"]["quantization"] is None


def _flat(rows):
    return [x for row in rows for x in row]


@pytest.mark.engines
def test_first_and_last_layers_bf16_reach_verls_transformer_config(verl_checked):
    """Megatron's --first-last-layers-bf16 and its layer counts are TransformerConfig fields verl takes
    under override_transformer_config (targets/verl.yaml megatron_args), which the verl import reads back."""
    te = verl_checked["jobs"]["first_last"]["actor"]["transformer"]
    assert (te["first_last_layers_bf16"], te["num_layers_at_start_in_bf16"], te["num_layers_at_end_in_bf16"]) == (
        True, 1, 1)


def test_corrections_weigh_as_pcc_defines_them(verl_checked):
    """verl's own correction code on fixed log-ratios, against the weights pcc's definitions give
    (docs: tis truncates at clip; mis zeroes outside [low, clip]; rejection outside [1/t, t])."""
    jobs = verl_checked["jobs"]
    tis = [[min(math.exp(x), 2.0) * m for x, m in zip(row, mrow)] for row, mrow in zip(LOG_RATIO, MASK)]
    assert _flat(jobs["tis"]["algorithm"]["weights"]) == pytest.approx(_flat(tis))
    seq = [math.exp(sum(x * m for x, m in zip(row, mrow))) for row, mrow in zip(LOG_RATIO, MASK)]
    mis = [[(s if 0.5 <= s <= 2.0 else 0.0) * m for m in mrow] for s, mrow in zip(seq, MASK)]
    assert seq[0] > 2.0 and 0.5 <= seq[1] <= 2.0  # one sequence dropped, one kept
    assert _flat(jobs["mis_seq"]["algorithm"]["weights"]) == pytest.approx(_flat(mis))
    rej = [[(math.exp(x) if 1 / 3 <= math.exp(x) <= 3 else 0.0) * m for x, m in zip(row, mrow)]
           for row, mrow in zip(LOG_RATIO, MASK)]
    assert _flat(jobs["rejection"]["algorithm"]["weights"]) == pytest.approx(_flat(rej))
    assert jobs["rejection"]["algorithm"]["rollout_is_threshold"] == "0.333333_3"


@pytest.mark.engines
def test_lora_fsdp_kv_cache_and_determinism(verl_checked):
    jobs = verl_checked["jobs"]
    lora = jobs["lora"]["lora"]
    assert (lora["rank"], lora["alpha"], lora["target_modules"]) == (16, 32, ["linear_proj", "linear_qkv"])
    assert jobs["fsdp"]["actor"]["class"] == "FSDPActorConfig" and jobs["fsdp"]["actor"]["engine"] is None
    kv = jobs["kv_det"]["rollout"]
    assert kv["engine_kwargs"]["vllm"] == {"kv_cache_dtype": "fp8_e4m3"} and kv["full_determinism"] is True


@pytest.mark.engines
def test_verl_rejects_mistyped_keys(verl_checked):
    typo, te_typo = verl_checked["probes"]
    assert "quantisation" in typo["error"]
    assert "fp8_recipy" in te_typo["error"]


@pytest.mark.parametrize("name, code", [
    ("glm52_fp8_rollout.prec", "PCC629"), ("int4_qat_w4a16.prec", "PCC629"), ("unified_fp8.prec", "PCC626"),
    ("k3_mxfp4_lora.prec", "PCC626"), ("mxfp8_blackwell.prec", "PCC626"), ("qwen38_nvfp4_lora.prec", "PCC626"),
    ("vllm/qwen38_nvfp4_lora.prec", "PCC626"), ("selective_nvfp4.prec", "PCC625")])
def test_what_verl_cannot_run_is_refused(name, code, tmp_path):
    """The shipped contracts without a contracts/verl/ variant: with `framework verl`, `pcc check` refuses each
    with verl's code, positioned in the parent contract on the statement that asks for what verl lacks."""
    parent = ROOT / "contracts" / name
    child = tmp_path / "c.prec"
    child.write_text(f'contract c extends "{parent}" {{\n  framework verl\n}}\n', encoding="utf-8")
    checked = check_file(str(child))
    errors = [d for d in checked.diagnostics if d.is_error]
    assert not checked.ok and [d.code for d in errors] == [code], [d.render() for d in errors]
    assert errors[0].span is not None and Path(errors[0].span.file).resolve().parent in (
        parent.parent.resolve(), (ROOT / "contracts").resolve())  # the parent, or its own parent's file


def test_partial_qkv_lora_and_mis_without_low_are_refused(tmp_path):
    text = _text("    parallel tp 4 ep 4", extra="  trainable lora rank 16 alpha 32 targets attn.q, attn.o\n"
                                                "  sync adapter\n")
    with pytest.raises(Unsupported, match="linear_qkv") as exc:
        lower(_plan_text(tmp_path, text), "verl")
    assert exc.value.code == "PCC627"
    with pytest.raises(Unsupported, match="positive lower bound") as exc:
        lower(_plan_text(tmp_path, _text("    parallel tp 4 ep 4", extra="  correction mis clip 2\n")), "verl")
    assert exc.value.code == "PCC628"


def test_launch_script_dry_run_prints_one_quoted_command(tmp_path):
    low = lower(_plan_text(tmp_path, VARIANTS["mis_seq"]), "verl")
    path = tmp_path / "launch.sh"
    path.write_text(low.files[LAUNCH], encoding="utf-8")
    extra = "data.train_files=/data/my set.parquet"
    out = subprocess.run(["bash", str(path), extra], env={"PATH": os.environ["PATH"], "PCC_DRY_RUN": "1"},
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert shlex.split(out.stdout) == ["python3", "-m", "verl.trainer.main_ppo", "--config-name",
                                       "ppo_megatron_trainer", *low.args, extra]
