"""pcc import verl and pcc import te.

References: pcc's own verl lowering (every shipped contract verl runs goes out as overrides and comes
back as the same Plan, less the fields a verl job cannot carry), verl's own composed Hydra configs
(the defaults the import assumes, and the keys it accepts), Hydra's own override parser, and
pcc's Megatron precision file for the TE import. Tests that need verl skip without it, except with
CI=true.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_import import _differences

from pcc.importer import ImportFailed, import_source
from pcc.lower import compile_file, lower
from pcc.lower.engine_table import table

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = sorted(str(p.relative_to(ROOT / "contracts"))[:-5] for p in (ROOT / "contracts").rglob("*.prec"))
# What a verl job cannot carry, per contract verl runs (pcc diff finds exactly these, nothing else):
# no expectations; TE runs real GEMMs ('accumulate fp32 output bf16' and 'qdq' do not come back, as
# for Miles); tiny_cpu's hardware (cpu) is not in a job.
_GEMMS = ("attn.q", "attn.kv", "attn.o", "experts.gate_up", "experts.down")
_EXPECT = {("expect", "route_agreement"), ("expect", "same_version")}
_ALL = {(c, f) for c in ("fprop", "dgrad", "wgrad") for f in _GEMMS}
_FWD = {("fprop", f) for f in _GEMMS}
# tiny_cpu's vLLM variants run their rollout on a GPU (vLLM's CPU build refuses their routing replay:
# PCC637), which comes back; the CPU trainer does not
_CPU_TRAINER = {("placement", "trainer.hardware")}
_QDQ = {("placement", "trainer.fp8_recipe")}  # the fp8 recipe a plan of QDQ GEMMs names comes back real
_FRAMEWORK = {("placement", "framework")}  # a contract that names no framework comes back 'framework verl'
NOT_CARRIED = {
    "bf16_baseline": _EXPECT | _FRAMEWORK,
    "nemo_rl/bf16_baseline": _EXPECT | _FRAMEWORK,  # a 'framework nemo_rl' contract, lowered to verl and back
    "nemo_rl/fp8_block": _EXPECT | _ALL | _FRAMEWORK,
    "verl/bf16_baseline": _EXPECT,
    "verl/miles_mode1": _EXPECT,
    "verl/tiny_cpu": _EXPECT | _FWD | _QDQ | _CPU_TRAINER,
    "verl/unified_fp8": _EXPECT | _ALL,
    "verl/unified_fp8_fake_fwd": _EXPECT | _FWD | _QDQ,
    "verl/unified_fp8_fake_fwd_bwd": _EXPECT | _ALL | _QDQ,
    "vllm/bf16_baseline": _EXPECT | _FRAMEWORK,
    "vllm/tiny_cpu": _EXPECT | _FWD | _QDQ | _CPU_TRAINER | _FRAMEWORK,
    "vllm/unified_fp8": _EXPECT | _ALL | _FRAMEWORK,
}


def _verl_or_skip():
    from pcc.lower.verify_verl import engine_dir

    if not (engine_dir() / "verl" / "__init__.py").is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the verl checks: verl is not in {engine_dir()}")
        pytest.skip(f"verl is not in {engine_dir()}; see requirements/verl.txt")


def _codes(imp) -> set[tuple[str, str | None]]:
    return {(d.code, d.path) for d in imp.diagnostics}


def _at(imp, code: str, path: str):
    hits = [d for d in imp.diagnostics if d.code == code and d.path == path]
    assert hits, f"no {code} at {path}: {[(d.code, d.path) for d in imp.diagnostics]}"
    return hits[0]


def _lowers_to_verl(name: str) -> bool:
    from pcc.lang.diagnostics import Reporter
    from pcc.lower import lower_all

    c = compile_file(str(ROOT / "contracts" / f"{name}.prec"))
    rep = Reporter()
    lower_all(c.plan, rep, ("verl",))
    return c.ok and not [d for d in rep.diagnostics if d.is_error]


def test_the_round_trip_covers_every_contract_verl_runs():
    assert sorted(NOT_CARRIED) == [n for n in CONTRACTS if _lowers_to_verl(n)]


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if "fake" in n else n
                                  for n in sorted(NOT_CARRIED)])
def test_verl_round_trip(name, tmp_path):
    """Lower to verl, import verl/overrides.txt (launch.sh names the config), same Plan."""
    from pcc.diff import diff

    _verl_or_skip()
    src = str(ROOT / "contracts" / f"{name}.prec")
    c = compile_file(src)
    for rel, text in lower(c.plan, "verl").files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    imp = import_source("verl", str(tmp_path), c.plan.contract.model.catalog)
    assert imp.contract["framework"] == "verl"
    assert not [d for d in imp.diagnostics if d.code != "PCC808"], [d.render() for d in imp.diagnostics]
    out = tmp_path / "imported.prec"
    out.write_text(imp.text())
    assert compile_file(str(out)).ok
    report = diff(src, str(out))
    assert _differences(report) == NOT_CARRIED[name]
    if c.plan.contract.runs_on == "verl":  # else the import adds 'framework verl', and each framework lowers its own way
        assert {e: (r["args"], r["env"]) for e, r in report["engines"].items() if r["args"] or r["env"]} == {}
    assert {d.path for d in imp.diagnostics if d.code == "PCC808"} >= {"expect", "trainer.rules gemm"}


@pytest.mark.parametrize("name", ["verl/bf16_baseline", "verl/tiny_cpu"])
def test_verl_bundle_round_trip(name, tmp_path):
    """A compiled bundle of a 'framework verl' contract also carries its expectations
    (validate/expectations.yaml), read as the Miles import reads them: they come back too."""
    from pcc.bundle.write import write_bundle
    from pcc.diff import diff

    _verl_or_skip()
    src = str(ROOT / "contracts" / f"{name}.prec")
    c = compile_file(src)
    write_bundle(c.plan, tmp_path / "bundle")
    imp = import_source("verl", str(tmp_path / "bundle"), c.plan.contract.model.catalog)
    out = tmp_path / "imported.prec"
    out.write_text(imp.text())
    report = diff(src, str(out))
    assert _differences(report) == NOT_CARRIED[name] - _EXPECT
    assert {e: (r["args"], r["env"]) for e, r in report["engines"].items() if r["args"] or r["env"]} == {}
    assert "expect" not in {d.path for d in imp.diagnostics}


def _contract(body: str, trainer: str = "megatron", extra: str = "") -> str:
    return (f"contract c {{\n  model qwen3_30b_a3b\n  hardware H100\n  framework verl\n  rollout vllm {{\n{body}\n"
            f"    max_tokens 2048\n  }}\n  trainer {trainer} {{\n    gemm : bf16\n  }}\n{extra}}}\n")


# Settings the shipped contracts do not use, out through the lowering and back; `rejection` comes
# back as what verl runs for it: IcePop over [1/T, T], pcc's `mis clip T low 1/T`.
VARIANTS = {
    "tis": (_contract("    parallel tp 4 ep 4", extra="  correction tis clip 2\n"), set()),
    "mis_seq": (_contract("    parallel tp 4 ep 4", extra="  correction mis clip 2 low 0.5 level sequence\n"), set()),
    "rejection": (_contract("    parallel tp 4 ep 4", extra="  correction rejection threshold 3\n"),
                  {("correction", f"correction.{f}") for f in ("kind", "clip", "low", "threshold")}),
    "lora": (_contract("    parallel tp 4 ep 4", extra="  trainable lora rank 16 alpha 32 targets attn.q, attn.kv, attn.o\n"
                       "  sync adapter\n"), set()),
    "fsdp_lora": (_contract("    parallel tp 2", trainer="fsdp", extra="  trainable lora rank 8 alpha 16 targets attn.o, experts\n"
                            "  sync adapter\n"), set()),
    "kv_det": (_contract("    kv_cache : fp8_e4m3\n    deterministic\n    parallel tp 2 dp 2 ep 4"), set()),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_verl_round_trip_of_settings(name, tmp_path):
    from pcc.diff import diff

    _verl_or_skip()
    text, differs = VARIANTS[name]
    src = tmp_path / "c.prec"
    src.write_text(text)
    c = compile_file(str(src))
    assert c.ok, [d.render() for d in c.diagnostics if d.is_error]
    (tmp_path / "overrides.txt").write_text(lower(c.plan, "verl").files["verl/overrides.txt"])
    imp = import_source("verl", str(tmp_path / "overrides.txt"), "qwen3_30b_a3b", "H100")
    assert not [d for d in imp.diagnostics if d.code != "PCC808"], [d.render() for d in imp.diagnostics]
    out = tmp_path / "imported.prec"
    out.write_text(imp.text())
    assert _differences(diff(str(src), str(out))) == differs


def test_launch_script_pcc_writes_reads_as_its_argument_file(tmp_path):
    c = compile_file(str(ROOT / "contracts" / "vllm" / "unified_fp8.prec"))
    files = lower(c.plan, "verl").files
    for rel, text in files.items():
        (tmp_path / Path(rel).name).write_text(text)
    from pcc.importer.verl_source import read_job

    script, args = read_job(str(tmp_path / "launch.sh")), read_job(str(tmp_path / "overrides.txt"))
    assert script.config == "ppo_megatron_trainer" and args.config is None
    assert {k: (e.value, e.op) for k, e in script.entries.items()} == {k: (e.value, e.op) for k, e in args.entries.items()}
    assert args.entries["actor_rollout_ref.rollout.quantization"].value == "fp8"
    assert str(args.entries["actor_rollout_ref.rollout.quantization"].span).endswith("overrides.txt:13:1")


# -- a verl YAML config, as verl's examples write them (FP8 rollout + Megatron FP8) -----------------

EXAMPLE = """\
hydra:
  searchpath:
    - pkg://verl.trainer.config

defaults:
  - ppo_megatron_trainer
  - _self_

data:
  max_response_length: 4096

actor_rollout_ref:
  actor:
    optim:
      lr: 1e-6
    megatron:
      tensor_model_parallel_size: 2
      expert_model_parallel_size: 8
      override_transformer_config:
        fp8: e4m3
        fp8_recipe: blockwise
        fp8_param: true
        moe_router_dtype: fp32
        fp8_wgrad: false
        fp8_recipy: blockwise
      router_replay:
        mode: R3
  rollout:
    name: vllm
    tensor_model_parallel_size: 4
    expert_parallel_size: 4
    quantization: fp8
    quantisation: fp8
    enable_rollout_routing_replay: true
    engine_kwargs:
      vllm:
        kv_cache_dtype: fp8
      sglang:
        kv_cache_dtype: fp8_e5m2

algorithm:
  adv_estimator: grpo
  rollout_correction:
    rollout_is: sequence
    rollout_is_threshold: 2.5

ray_kwargs:
  ray_init:
    runtime_env:
      env_vars:
        NVTE_FP8_BLOCK_SCALING_FP32_SCALES: "1"
        NVTE_FP8_FUSE_WGRAD: "1"
"""


def _line(key: str, text: str = EXAMPLE) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if line.strip().startswith(key + ":"))


def test_hand_written_fp8_yaml_field_by_field(tmp_path):
    _verl_or_skip()
    src = tmp_path / "qwen3_fp8.yaml"
    src.write_text(EXAMPLE)
    imp = import_source("verl", str(src), "qwen3_30b_a3b", "H100")
    d = imp.contract
    assert d["rollout"]["engine"] == "vllm"
    assert d["rollout"]["parallel"] == {"tp": 4, "ep": 4} and d["rollout"]["max_tokens"] == 4096
    assert {"components": ["rollout"], "patterns": ["linear"], "scheme": "fp8_block"} in d["rollout"]["rules"]
    assert {"components": ["rollout"], "patterns": ["kv_cache"], "scheme": "fp8_e4m3"} in d["rollout"]["rules"]
    t = d["trainer"]
    assert t["engine"] == "megatron" and t["parallel"] == {"tp": 2, "ep": 8} and t["param_gather"] == "fp8"
    assert t["rules"] == [{"components": ["fprop", "dgrad", "wgrad"], "patterns": ["linear"], "scheme": "fp8_block"}]
    assert t["optimizer"]["distributed"]  # verl's McoreEngineConfig default
    assert d["correction"] == {"kind": "tis", "clip": 2.5, "level": "sequence"}
    assert d["routing_replay"] == "r3" and d["sync"] == {"schedule": "colocated"}
    # the typos, with verl's own key as the hint, at their lines
    typo = _at(imp, "PCC810", "actor_rollout_ref.rollout.quantisation")
    assert typo.span.line == _line("quantisation") and "quantization" in typo.hint
    te = _at(imp, "PCC810", "actor_rollout_ref.actor.megatron.override_transformer_config.fp8_recipy")
    assert te.span.line == _line("fp8_recipy") and "fp8_recipe" in te.hint
    # precision keys pcc has no field for, and one the engine ignores
    assert _at(imp, "PCC807", "actor_rollout_ref.actor.megatron.override_transformer_config.fp8_wgrad").span.line == \
        _line("fp8_wgrad")
    assert _at(imp, "PCC807", "ray_kwargs.ray_init.runtime_env.env_vars.NVTE_FP8_FUSE_WGRAD").span.line == \
        _line("NVTE_FP8_FUSE_WGRAD")
    assert _at(imp, "PCC806", "actor_rollout_ref.rollout.engine_kwargs.sglang.kv_cache_dtype").span.line == \
        _line("kv_cache_dtype", EXAMPLE.split("sglang:")[0]) + 2
    assert not [x for x in imp.diagnostics if x.code == "PCC810" and "lr" in (x.path or "")]
    out = tmp_path / "imported.prec"
    out.write_text(imp.text())
    assert compile_file(str(out)).ok


def test_verl_reads_the_example_as_the_import_does(tmp_path):
    """The example (less its two typos) as overrides through verl's own Hydra compose and config
    classes (pcc.lower.verify_verl): verl builds the job and sees the values the import read."""
    from pcc.importer.verl import _lookup
    from pcc.importer.verl_source import read_yaml
    from pcc.lower.verify_verl import run_batch

    _verl_or_skip()
    src = tmp_path / "job.yaml"
    src.write_text("\n".join(x for x in EXAMPLE.splitlines() if "recipy" not in x and "quantisation" not in x))
    job = read_yaml(str(src))
    tree = table("verl").tree("ppo_megatron_trainer")
    over = [f"{'' if _lookup(tree, k)[0] is True else '+'}{k}={json.dumps(e.value)}" for k, e in job.entries.items()]
    got = run_batch([{"config": job.config, "overrides": over}])["jobs"][0]
    assert "error" not in got, got
    assert got["rollout"]["quantization"] == "fp8" and got["rollout"]["engine_kwargs"]["vllm"]["kv_cache_dtype"] == "fp8"
    assert (got["rollout"]["tensor_model_parallel_size"], got["rollout"]["expert_parallel_size"]) == (4, 4)
    assert {k: got["actor"]["transformer"][k] for k in ("fp8", "fp8_recipe", "fp8_param")} == {
        "fp8": "e4m3", "fp8_recipe": "blockwise", "fp8_param": True}
    assert got["actor"]["router_replay"] == "R3" and got["rollout"]["enable_rollout_routing_replay"] is True
    assert (got["algorithm"]["rollout_is"], got["algorithm"]["rollout_is_threshold"]) == ("sequence", 2.5)
    assert got["env"]["NVTE_FP8_BLOCK_SCALING_FP32_SCALES"] == "1"


def test_quantized_model_path_is_read_as_its_checkpoint_config(tmp_path):
    """No rollout.quantization and an FP8 checkpoint at model.path: vLLM loads the checkpoint's own
    config, and the rollout rules are what `pcc import checkpoint` reads from it."""
    _verl_or_skip()
    ckpt = tmp_path / "Qwen3-30B-A3B-FP8"
    ckpt.mkdir()
    (ckpt / "config.json").write_text((Path(__file__).parent / "data" / "qwen3_30b_a3b_fp8.json").read_text())
    src = tmp_path / "args.txt"
    src.write_text(f"actor_rollout_ref.model.path={ckpt}\nactor_rollout_ref.rollout.name=vllm\n")
    imp = import_source("verl", str(src), "qwen3_30b_a3b", "H100")
    direct = import_source("checkpoint", str(ckpt), "qwen3_30b_a3b", "H100")
    assert imp.contract["rollout"]["rules"] == direct.contract["rollout"]["rules"]
    assert imp.contract["rollout"]["rules"][0] == {"components": ["rollout"], "patterns": ["linear"],
                                                   "scheme": "fp8_block"}


# -- a launch script, as verl's examples write them (FSDP, LoRA) -------------------------------------

SCRIPT = """#!/bin/bash
set -x
MODEL=Qwen/Qwen3-8B
export VLLM_USE_V1=1
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files=$HOME/data/gsm8k/train.parquet \\
    data.max_response_length=1024 \\
    actor_rollout_ref.model.path=$MODEL \\
    actor_rollout_ref.model.lora_rank=64 \\
    actor_rollout_ref.model.lora_alpha=32 \\
    actor_rollout_ref.model.target_modules=all-linear \\
    actor_rollout_ref.actor.optim.lr=3e-6 \\
    actor_rollout_ref.actor.fsdp_config.param_offload=False \\
    actor_rollout_ref.rollout.name=vllm \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \\
    actor_rollout_ref.rollout.dtype=float16 \\
    actor_rollout_ref.rollout.calculate_log_prob=True \\
    algorithm.rollout_correction.rollout_is=token \\
    algorithm.rollout_correction.rollout_is_threshold='0.5_5.0' \\
    algorithm.rollout_correction.rollout_rs=seq_mean_k1 \\
    trainer.logger='["console","wandb"]' \\
    trainer.n_gpus_per_node=8 $@
"""


def test_fsdp_lora_script(tmp_path):
    _verl_or_skip()
    src = tmp_path / "run_qwen3_8b_grpo_lora.sh"
    src.write_text(SCRIPT)
    imp = import_source("verl", str(src), "qwen3_8b", "H100")
    d = imp.contract
    assert d["trainer"]["engine"] == "fsdp" and d["trainer"]["params"] == "bf16" and d["trainer"]["master"] == "fp32"
    assert d["trainable"] == {"kind": "lora", "rank": 64, "alpha": 32.0, "targets": ["linear"]}
    assert d["sync"] == {"schedule": "colocated", "moves": "adapter"}
    assert d["rollout"]["parallel"] == {"tp": 2} and d["rollout"]["max_tokens"] == 1024
    assert d["correction"] == {"kind": "mis", "clip": 5.0, "low": 0.5}
    lines = SCRIPT.splitlines()
    typo = _at(imp, "PCC810", "actor_rollout_ref.rollout.calculate_log_prob")
    assert typo.span.line == next(n for n, x in enumerate(lines, 1) if "calculate_log_prob=" in x)
    assert "calculate_log_probs" in typo.hint
    assert _at(imp, "PCC804", "actor_rollout_ref.rollout.dtype").span.line == next(
        n for n, x in enumerate(lines, 1) if "rollout.dtype" in x)
    assert ("PCC804", "algorithm.rollout_correction.rollout_rs") in _codes(imp)
    assert not [x for x in imp.diagnostics if x.code == "PCC810"
                and x.path not in ("actor_rollout_ref.rollout.calculate_log_prob",)], imp.diagnostics


ASYNC = """\
actor_rollout_ref.rollout.name=sglang
+actor_rollout_ref.rollout.engine_kwargs.sglang.kv_cache_dtype=fp8_e5m2
trainer.v1.trainer_mode=separate_async
trainer.v1.sampler.max_off_policy_threshold=3
trainer.v1.separate_async.parameter_sync_step=2
+actor_rollout_ref.rollout.full_determinism=true
actor_rollout_ref.rollout.tensor_model_parallel_sise=2
~algorithm.rollout_correction.bypass_mode
"""


def test_async_argument_file(tmp_path):
    """The v1 trainer's separate_async mode: verl drops a trajectory when global_steps - its step + 1
    > max_off_policy_threshold (trainer/ppo/v1/replay_buffer.py), so 3 is a staleness of 2."""
    _verl_or_skip()
    src = tmp_path / "async.txt"
    src.write_text(ASYNC)
    imp = import_source("verl", str(src), "qwen3_8b", "H100")
    d = imp.contract
    assert d["sync"] == {"schedule": "async", "max_staleness": 2, "interval": 2}
    assert d["rollout"]["engine"] == "sglang" and d["rollout"]["deterministic"]
    assert {"components": ["rollout"], "patterns": ["kv_cache"], "scheme": "fp8_e5m2"} in d["rollout"]["rules"]
    assert d["trainer"]["engine"] == "fsdp"  # no config named, no Megatron key: ppo_trainer (PCC808)
    assert ("PCC808", "trainer.engine") in _codes(imp)
    add = _at(imp, "PCC810", "actor_rollout_ref.rollout.full_determinism")  # `+` on a key verl has
    assert add.span.line == 6 and "refuses to add" in add.message
    typo = _at(imp, "PCC810", "actor_rollout_ref.rollout.tensor_model_parallel_sise")
    assert typo.span.line == 7 and "tensor_model_parallel_size" in typo.hint and "Hydra refuses" in typo.message
    assert not [x for x in imp.diagnostics if x.path == "algorithm.rollout_correction.bypass_mode"]


def test_without_verl_installed_the_keys_are_checked_through_its_table(tmp_path, monkeypatch):
    """verl's keys and defaults are its engine table (targets/verl_keys.json): no verl is needed to read a job."""
    src = tmp_path / "async.txt"
    src.write_text(ASYNC)
    monkeypatch.setenv("PCC_VERL_DIR", str(tmp_path / "nowhere"))
    imp = import_source("verl", str(src), "qwen3_8b", "H100")
    typo = _at(imp, "PCC810", "actor_rollout_ref.rollout.tensor_model_parallel_sise")
    assert "tensor_model_parallel_size" in typo.hint
    assert imp.contract["sync"]["max_staleness"] == 2


# -- what the import assumes is verl's own ------------------------------------------------------------

def test_transformer_fields_are_megatron_cores():
    import dataclasses

    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    from pcc.importer.verl_config import transformer_fields

    assert transformer_fields() == {f.name for f in dataclasses.fields(TransformerConfig)}


OVERRIDES = ["a.b='x'", "a.b=0.5_2.0", "+a.b=[1, 2,'x']", "a.b=${x.y}", "a.b=1e-6", "a.b=NULL", "a.b=True",
             "a.b= abc def ", "++a.b={k: 1, j: [a]}", "a.b=1_000", "a.b=-.5", "a.b=\"it's\"", "a.b=[]", "a.b=inf",
             "a.b='0.5_2'", "a.b=1.", "a.b=fp8_e4m3", "a.b=[console,wandb]"]


def test_override_values_read_as_hydra_reads_them():
    from pcc.importer.verl_config import hydra_parse
    from pcc.importer.verl_source import parse_value

    _verl_or_skip()
    for text, theirs in zip(OVERRIDES, hydra_parse(OVERRIDES)):
        ours = parse_value(text.split("=", 1)[1])
        assert json.dumps(ours) == json.dumps(theirs["value"]), (text, ours, theirs)
    with pytest.raises(ValueError, match="sweep"):
        parse_value("a,b")


# -- errors are coded and positioned -----------------------------------------------------------------

@pytest.mark.parametrize("name,text,words,line", [
    ("bad.yaml", "actor_rollout_ref:\n  rollout: [\n", "not valid YAML", 3),
    ("dup.yaml", "actor_rollout_ref:\n  rollout:\n    name: vllm\n    name: sglang\n", "written twice", 4),
    ("type.yaml", "actor_rollout_ref:\n  rollout:\n    name: vllm\n    tensor_model_parallel_size: four\n",
     "verl takes int", 4),
    ("engine.yaml", "actor_rollout_ref:\n  rollout:\n    name: trtllm\n", "vllm and sglang", 3),
    ("args.txt", "actor_rollout_ref.rollout.name=vllm\nactor_rollout_ref.rollout.name=[a\n", "expected", 2),
    ("sweep.txt", "actor_rollout_ref.rollout.name=vllm,sglang\n", "sweep", 1),
    ("tag.yaml", "a: !!python/object/apply:os.system [ls]\n", "constructor", 1),
])
def test_errors_are_coded_and_positioned(name, text, words, line, tmp_path):
    src = tmp_path / name
    src.write_text(text)
    with pytest.raises(ImportFailed) as exc:
        import_source("verl", str(src), "qwen3_8b")
    d = exc.value.to_diagnostic()
    assert d.code == "PCC801" and words in d.message and d.span is not None and d.span.line == line, d.render()


def test_cli_verl_and_te(tmp_path, capsys):
    from pcc.cli import main

    _verl_or_skip()
    src = tmp_path / "job.yaml"
    src.write_text(EXAMPLE)
    out = tmp_path / "c.prec"
    assert main(["import", "verl", str(src), "--model", "qwen3_30b_a3b", "-o", str(out)]) == 0
    assert compile_file(str(out)).ok
    capsys.readouterr()
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [\n")
    assert main(["import", "verl", str(bad), "--model", "qwen3_8b", "--json"]) == 1
    env = json.loads(capsys.readouterr().out)
    assert env["diagnostics"][0]["code"] == "PCC801" and env["diagnostics"][0]["line"] == 2
    te = tmp_path / "te.yaml"
    te.write_text(TE_FILE)
    assert main(["import", "te", str(te), "--model", "qwen3_30b_a3b", "--json"]) == 0
    assert "gemm" in json.loads(capsys.readouterr().out)["result"]["contract"]


# -- pcc import te -------------------------------------------------------------------------------------

TE_FILE = """\
configs:
  nvfp4:
    transformer_engine_config_type: TEQuantizationParams
    training_recipe:
      fp4_quantization_recipe: nvfp4
  bf16:
    transformer_engine_config_type: TEQuantizationParams
    training_recipe: {}
matchers:
  first_layer:
    config: bf16
    type: glob
    pattern: "*decoder.layers.0.*"
    enabled: true
  experts:
    config: nvfp4
    type: glob
    pattern: "*mlp.experts*"
    enabled: true
  never:
    config: nvfp4
    type: glob
    pattern: "*linear_qkv"
  default:
    config: bf16
    type: glob
    pattern: "*"
    enabled: true
"""


def test_te_file_as_megatron_core_matches_it(tmp_path):
    """Routed experts NVFP4 but layer 0's; the matcher without `enabled: true` is skipped, as
    megatron-core's RecipeConfig skips it."""
    src = tmp_path / "precision.yaml"
    src.write_text(TE_FILE)
    imp = import_source("te", str(src), "qwen3_30b_a3b", "B200")
    t = imp.contract["trainer"]
    assert t["rules"] == [{"components": ["fprop", "dgrad", "wgrad"], "patterns": ["experts"], "scheme": "nvfp4"},
                          {"components": ["fprop", "dgrad", "wgrad"], "patterns": ["experts[0]"], "scheme": "bf16",
                           "keep": True}]
    assert _at(imp, "PCC806", "matchers.never").span.line == TE_FILE.splitlines().index("  never:") + 1


def test_te_file_pcc_writes_comes_back(tmp_path):
    """selective_nvfp4's trainer/te_precision.yaml: the imported trainer decides every operator's
    FProp as the contract does."""
    from pcc.bundle.write import write_bundle

    c = compile_file(str(ROOT / "contracts" / "selective_nvfp4.prec"))
    write_bundle(c.plan, tmp_path / "b")
    imp = import_source("te", str(tmp_path / "b" / "trainer" / "te_precision.yaml"), c.plan.contract.model.catalog)
    out = tmp_path / "te.prec"
    out.write_text(imp.text())
    back = compile_file(str(out)).plan
    ops = c.plan.catalog.operators
    assert [back.scheme("fprop", i).format for i in range(len(ops))] == \
        [c.plan.scheme("fprop", i).format for i in range(len(ops))]


@pytest.mark.parametrize("edit,words", [
    (("fp4_quantization_recipe: nvfp4", "fp4_quantization_recipe: nvfp4\n      fp8_margin: 0"), "TEQuantizationRecipe"),
    (("fp4_quantization_recipe: nvfp4", "fp8_quantization_recipe: delayed"), "delayed"),
    (("type: glob\n    pattern: \"*mlp", "type: regex\n    pattern: \"*mlp"), "glob"),
])
def test_te_file_errors(edit, words, tmp_path):
    src = tmp_path / "p.yaml"
    src.write_text(TE_FILE.replace(*edit, 1))
    with pytest.raises(ImportFailed) as exc:
        import_source("te", str(src), "qwen3_30b_a3b")
    assert exc.value.code == "PCC801" and words in exc.value.message and exc.value.span is not None


MEGATRON_SCRIPT = """#!/bin/bash
python3 -m verl.trainer.main_ppo --config-name='ppo_megatron_trainer.yaml' \\
    actor_rollout_ref.rollout.name=vllm \\
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \\
    actor_rollout_ref.actor.optim.override_optimizer_config.use_precision_aware_optimizer=True
"""


def test_a_config_name_with_its_yaml_suffix_is_the_megatron_config(tmp_path):
    """As verl's examples write it (issue 26): `--config-name='ppo_megatron_trainer.yaml'` composes the Megatron
    config, so its keys are known and its defaults (the distributed optimizer on) are read from verl's table."""
    src = tmp_path / "run.sh"
    src.write_text(MEGATRON_SCRIPT)
    imp = import_source("verl", str(src), "qwen3_8b", "H100")
    t = imp.contract["trainer"]
    assert t["engine"] == "megatron" and t["parallel"] == {"tp": 2}
    assert t["optimizer"]["distributed"] is True  # McoreEngineConfig's default: the job does not set it
    assert not [d for d in imp.diagnostics if d.code == "PCC810" or d.path == "trainer.engine"], [
        d.message for d in imp.diagnostics]


def test_precision_aware_optimizer_through_override_optimizer_config(tmp_path):
    """verl sets override_optimizer_config's keys on Megatron's OptimizerConfig last: the contract's precision_aware."""
    src = tmp_path / "run.sh"
    src.write_text(MEGATRON_SCRIPT)
    imp = import_source("verl", str(src), "qwen3_8b", "H100")
    assert imp.contract["trainer"]["optimizer"]["precision_aware"] is True
    key = "actor_rollout_ref.actor.optim.override_optimizer_config.use_precision_aware_optimizer"
    assert not [d for d in imp.diagnostics if d.path == key]
    src.write_text(MEGATRON_SCRIPT.replace("=True", "=False").replace(
        "    actor_rollout_ref.actor.optim.override", "    actor_rollout_ref.actor.optim.use_precision_aware_optimizer=true "
        "\\\n    actor_rollout_ref.actor.optim.override"))
    imp = import_source("verl", str(src), "qwen3_8b", "H100")
    assert imp.contract["trainer"]["optimizer"]["precision_aware"] is False  # the override wins


def test_engine_kwargs_are_checked_against_the_rollout_engines_table(tmp_path):
    """verl hands engine_kwargs.vllm to vLLM's own arguments: a name vLLM's parser lacks is PCC810 with the nearest."""
    src = tmp_path / "run.sh"
    src.write_text(MEGATRON_SCRIPT + "    +actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype=fp8 \\\n"
                   "    +actor_rollout_ref.rollout.engine_kwargs.vllm.enable_prefix_cachin=true\n")
    src.write_text(src.read_text().replace("=True\n", "=True \\\n"))
    imp = import_source("verl", str(src), "qwen3_8b", "H100")
    (typo,) = [d for d in imp.diagnostics if d.code == "PCC810"]
    assert typo.path.endswith("engine_kwargs.vllm.enable_prefix_cachin") and "enable_prefix_caching" in typo.hint
    assert {"components": ["rollout"], "patterns": ["kv_cache"], "scheme": "fp8_e4m3"} in imp.contract["rollout"]["rules"]


ARRAY_SCRIPT = """#!/bin/bash
set -x
NODES=1
GPUS=8
TP=2
FP8=(
    +actor_rollout_ref.actor.megatron.override_transformer_config.fp8=e4m3
    +actor_rollout_ref.actor.megatron.override_transformer_config.fp8_recipe=blockwise
    actor_rollout_ref.rollout.calculate_log_prob=True
)
MODEL_DIR=/data/models
python3 -m verl.trainer.main_ppo --config-name='ppo_megatron_trainer.yaml' \\
    "${FP8[@]}" \\
    actor_rollout_ref.model.path="${MODEL_DIR}/Qwen3-8B" \\
    actor_rollout_ref.rollout.name=vllm \\
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=${TP} \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=$((TP * 2)) \\
    trainer.n_gpus_per_node=$((GPUS / NODES)) \\
    trainer.experiment_name=run-$(date +%s) $@
"""


def test_script_expanded_as_bash(tmp_path):
    """Overrides in a bash array, `${VAR}` inside a value and `$((..))` over assigned names are read as bash
    passes them (issue 26); a command substitution and `$@` stay as written, each a PCC808 at its line."""
    _verl_or_skip()
    src = tmp_path / "run_qwen3_8b_fp8.sh"
    src.write_text(ARRAY_SCRIPT)
    imp = import_source("verl", str(src), "qwen3_8b", "H100")
    t = imp.contract["trainer"]
    assert t["engine"] == "megatron" and t["parallel"] == {"tp": 2}
    assert {r["scheme"] for r in t["rules"]} == {"fp8_block"}
    assert imp.contract["rollout"]["parallel"] == {"tp": 4}
    lines = ARRAY_SCRIPT.splitlines()
    unread = sorted((d.message.split(":")[0], d.span.line) for d in imp.diagnostics if d.path == "overrides")
    line = next(n for n, x in enumerate(lines, 1) if "$(date" in x)
    assert unread == [("$(date +%s)", line)]  # "$@": the script run without arguments passes none
    typo = _at(imp, "PCC810", "actor_rollout_ref.rollout.calculate_log_prob")  # positioned in the array
    assert typo.span.line == next(n for n, x in enumerate(lines, 1) if "calculate_log_prob=" in x)


RECIPE_SCRIPT = """#!/bin/bash
python3 -m recipe.dapo.main_dapo --config-path=config --config-name='dapo_megatron_trainer.yaml' \\
    actor_rollout_ref.rollout.name=vllm \\
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4
"""
RECIPE_CONFIG = """hydra:
  searchpath:
    - file://verl/trainer/config
defaults:
  - ppo_megatron_trainer
  - _self_
actor_rollout_ref:
  actor:
    megatron:
      pipeline_model_parallel_size: 2
"""


def test_a_recipe_entrypoint_whose_config_extends_verls(tmp_path):
    """DAPO's entrypoint composes its own config, which extends ppo_megatron_trainer: its keys, then the overrides."""
    _verl_or_skip()
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "dapo_megatron_trainer.yaml").write_text(RECIPE_CONFIG)
    src = tmp_path / "run_dapo.sh"
    src.write_text(RECIPE_SCRIPT)
    imp = import_source("verl", str(src), "qwen3_8b", "H100")
    t = imp.contract["trainer"]
    assert t["engine"] == "megatron" and t["parallel"] == {"tp": 4, "pp": 2}


def test_the_fully_async_entrypoint_reads_its_config_from_verl(tmp_path):
    """verl's fully async trainer composes fully_async_ppo_megatron_trainer (in its own config folder of the
    installed verl), which extends ppo_megatron_trainer."""
    _verl_or_skip()
    src = tmp_path / "run.sh"
    src.write_text("python3 -m verl.experimental.fully_async_policy.fully_async_main "
                   "--config-name=fully_async_ppo_megatron_trainer actor_rollout_ref.rollout.name=vllm \\\n"
                   "    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2\n")
    imp = import_source("verl", str(src), "qwen3_8b", "H100")
    assert imp.contract["trainer"]["engine"] == "megatron" and imp.contract["trainer"]["parallel"] == {"tp": 2}
    # its own keys (async_training.*) are not verl's trainer config's: one warning, not a PCC810 each
    assert "async_training." in _at(imp, "PCC808", "entrypoint").message
    assert not [d for d in imp.diagnostics if d.code == "PCC810"]


@pytest.mark.parametrize("script", [
    RECIPE_SCRIPT,  # its config is not beside the script
    "python3 -m recipe.mine.main_mine actor_rollout_ref.rollout.name=vllm\n",
])
def test_an_entrypoint_pcc_cannot_read_is_refused_by_name(script, tmp_path):
    src = tmp_path / "run.sh"
    src.write_text(script)
    with pytest.raises(ImportFailed) as exc:
        import_source("verl", str(src), "qwen3_8b", "H100")
    entry = next(w for w in script.split() if "main" in w)
    assert exc.value.code == "PCC801" and f"entrypoint {entry}" in exc.value.message and exc.value.path == "entrypoint"


OFFLOAD_SCRIPT = """#!/bin/bash
python3 -m verl.trainer.main_ppo \\
    actor_rollout_ref.rollout.name=vllm \\
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=True
"""


def test_optimizer_offload_is_verls_state_offload_not_megatrons_cpu_optimizer(tmp_path):
    """verl's optimizer_offload moves state between phases: a PCC807 warning, never `offload` (PCC309 would
    then refuse every FSDP job); a Megatron job's context parallelism is warned, not dropped silently."""
    _verl_or_skip()
    src = tmp_path / "run.sh"
    src.write_text(OFFLOAD_SCRIPT)
    imp = import_source("verl", str(src), "qwen3_8b", "H100")
    assert "offload" not in imp.contract["trainer"]["optimizer"]
    key = "actor_rollout_ref.actor.fsdp_config.optimizer_offload"
    assert _at(imp, "PCC807", key).span.line == 4
    out = tmp_path / "imported.prec"
    out.write_text(imp.text())
    assert "PCC309" not in {d.code for d in compile_file(str(out)).diagnostics}
    src.write_text(MEGATRON_SCRIPT.replace("=True\n", "=True \\\n") +
                   "    actor_rollout_ref.actor.megatron.optimizer_offload=True \\\n"
                   "    actor_rollout_ref.actor.megatron.context_parallel_size=2\n")
    imp = import_source("verl", str(src), "qwen3_8b", "H100")
    assert "offload" not in imp.contract["trainer"]["optimizer"]
    assert ("PCC807", "actor_rollout_ref.actor.megatron.optimizer_offload") in _codes(imp)
    assert imp.contract["trainer"]["parallel"]["cp"] == 2  # context parallelism is the contract's cp
