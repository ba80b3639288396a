"""One engine table per engine, read both ways (pcc/lower/engine_table.py): generated from the engine's own
parser and checked against it; `pcc import miles` reads launches through it (aliases, what Miles sets
itself), and the Miles target warns where a contract writes the opposite of what Miles sets itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pcc.importer import import_source
from pcc.lower import compile_file, lower
from pcc.lower.engine_table import table
from pcc.lower.vllm import tables as vllm_tables

ROOT = Path(__file__).resolve().parents[2]


def _check_table(engine: str, present: bool, why: str) -> None:
    """tools/engine_flags.py --check for one engine: the file equals what the engine's own definitions give."""
    if not present:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must check the {engine} table: {why}")
        pytest.skip(f"{why}: bash requirements/install-engines.sh")
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "engine_flags.py"), engine, "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.engines
def test_the_sglang_table_is_what_sglangs_own_parser_defines():
    try:
        import sglang.srt.server_args  # noqa: F401
    except ImportError as exc:
        _check_table("sglang", False, f"SGLang's parser is not installed ({exc})")
    _check_table("sglang", True, "")


@pytest.mark.engines
def test_the_vllm_table_is_what_vllms_own_parser_defines():
    from pcc.lower.verify_vllm import engine_dir

    _check_table("vllm", (engine_dir() / "vllm" / "__init__.py").is_file(), f"vLLM is not in {engine_dir()}")


@pytest.mark.engines
def test_the_verl_table_is_what_verls_own_configs_compose():
    from pcc.lower.verify_verl import engine_dir

    _check_table("verl", (engine_dir() / "verl" / "__init__.py").is_file(), f"verl is not in {engine_dir()}")


def test_aliases_read_as_the_engine_reads_them():
    sglang, miles = table("sglang"), table("miles")
    assert sglang.canonical("--expert-parallel-size") == sglang.canonical("--ep") == "--ep-size"
    assert sglang.spec("--tensor-parallel-size").type == "int"
    # Miles registers every option string of SGLang's fields it does not skip, prefixed
    assert miles.canonical("--sglang-expert-parallel-size") == "--sglang-ep-size"
    assert miles.canonical("--sglang-data-parallel-size") == "--sglang-dp-size"
    assert miles.canonical("--sglang-pipeline-parallel-size") == "--sglang-pp-size"
    assert miles.spec("--sglang-model-path") is None  # a field Miles skips
    assert miles.spec("--fp8-recipe").choices and "blockwise" in miles.spec("--fp8-recipe").choices


def test_what_miles_sets_itself():
    miles = table("miles")
    assert miles.implied({}) == {"--use-distributed-optimizer": [], "--bf16": []}
    assert miles.implied({"--optimizer": ["sgd"], "--use-distributed-optimizer": [], "--fp16": []}) == {
        "--use-distributed-optimizer": None, "--bf16": None}


LAUNCH = """#!/bin/bash
ray job submit --address="http://127.0.0.1:8265" -- python3 train.py \\
   --tensor-model-parallel-size 4 --expert-model-parallel-size 8 --optimizer {optimizer} \\
   --use-precision-aware-optimizer --main-params-dtype fp32 --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 \\
   --colocate --rollout-num-gpus-per-engine 8 --sglang-expert-parallel-size 8 --sglang-data-parallel-size 2 \\
   --sglang-enable-dp-attention
"""


def test_a_miles_launch_imports_as_miles_runs_it(tmp_path):
    """Miles' scripts never pass --use-distributed-optimizer: Miles turns it on for Adam itself, so a
    precision-aware optimizer imports into a contract that checks (not PCC308); SGLang's aliases are read."""
    script = tmp_path / "run.sh"
    script.write_text(LAUNCH.format(optimizer="adam"))
    imp = import_source("miles", str(script), "qwen3_30b_a3b", "H100")
    assert imp.contract["trainer"]["optimizer"] == {"kind": "adam", "distributed": True, "offload": False,
                                                    "precision_aware": True}
    assert imp.contract["rollout"]["parallel"] == {"tp": 8, "ep": 8, "dp": 2}
    out = tmp_path / "imported.prec"
    out.write_text(imp.text())
    c = compile_file(str(out))
    assert c.ok and "PCC308" not in {d.code for d in c.diagnostics}
    script.write_text(LAUNCH.format(optimizer="sgd").replace("--use-precision-aware-optimizer", ""))
    imp = import_source("miles", str(script), "qwen3_30b_a3b", "H100")
    assert imp.contract["trainer"]["optimizer"]["distributed"] is False  # Megatron's ZeRO runs Adam only


def test_a_written_setting_miles_overrides_is_a_warning_on_its_field(tmp_path):
    path = tmp_path / "c.prec"
    path.write_text("contract c {\n  model qwen3_30b_a3b\n  hardware H100\n  trainer megatron {\n"
                    "    optimizer adam\n  }\n}\n")
    c = compile_file(str(path))
    (w,) = [d for d in c.diagnostics if d.code == "PCC612"]
    assert (w.severity, w.span.line) == ("warning", 5) and "--use-distributed-optimizer on" in w.message
    path.write_text(path.read_text().replace("optimizer adam", "optimizer adam distributed"))
    assert "PCC612" not in {d.code for d in compile_file(str(path)).diagnostics}
    path.write_text("contract c {\n  model qwen3_30b_a3b\n  hardware H100\n}\n")  # not written: not asked
    plan = compile_file(str(path)).plan
    assert not [w for w in lower(plan, "miles").caveats if w.path == "trainer.optimizer"]


def test_the_sglang_table_file_is_well_formed():
    doc = json.loads((ROOT / "targets" / "sglang_flags.json").read_text(encoding="utf-8"))
    assert doc["source"].startswith("sglang ") and len(doc["flags"]) > 400
    assert all(k.startswith("-") and set(v) == {"dest", "aliases", "negations", "nargs", "type", "choices", "default"}
               for k, v in doc["flags"].items())


def test_a_negation_is_not_an_alias():
    """`--no-X` of a BooleanOptionalAction turns X off: reading it as X (an alias) would turn it on."""
    vllm, miles = table("vllm"), table("miles")
    assert vllm.canonical("--no-async-scheduling") == "--no-async-scheduling"
    assert vllm.negated("--no-async-scheduling") == "--async-scheduling"
    assert vllm.negated("--async-scheduling") is None
    sglang_neg = next(n for n, f in table("sglang")._negations.items())
    assert miles.negated("--sglang-" + sglang_neg[2:]) == "--sglang-" + table("sglang").negated(sglang_neg)[2:]


def _accepted(spec, words: tuple[str, ...]) -> bool:
    """Whether the engine's parser takes `words` for the flag: a switch none, else its choices and type."""
    if spec.nargs == 0:
        return not words
    if not words or (spec.nargs in (1, "?") and len(words) > 1):
        return False
    convert = {"int": int, "float": float}.get(spec.type, str)
    try:
        return all(convert(w) is not None and (spec.choices is None or w in spec.choices) for w in words)
    except ValueError:
        return False


VLLM_JOBS = sorted((ROOT / "contracts" / "vllm").glob("*.prec")) + sorted((ROOT / "contracts" / "verl").glob("*.prec"))


@pytest.mark.parametrize("path", VLLM_JOBS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_vllm_flag_pcc_writes_is_in_vllms_table(path):
    """Each flag record a shipped contract lowers to for vLLM names a flag of vLLM's parser, with a value
    it accepts (its choices and type)."""
    plan = compile_file(str(path)).plan
    if plan.contract.rollout.engine != "vllm":
        pytest.skip("an SGLang rollout")
    vllm = table("vllm")
    for s in lower(plan, "vllm").of("flag"):
        spec = vllm.spec(s.key)
        assert spec is not None, f"{s.key}: no flag of vLLM's parser"
        assert _accepted(spec, s.words()), (s.key, s.words(), spec)


def test_vllm_tables_name_values_vllm_accepts():
    """targets/vllm.yaml's --quantization methods, KV cache dtypes and LoRA ranks are vLLM's choices."""
    vllm, tab = table("vllm"), vllm_tables()
    assert set(tab["quantization"].values()) <= set(vllm.spec("--quantization").choices)
    assert set(tab["kv_cache_dtype"].values()) <= set(vllm.spec("--kv-cache-dtype").choices)
    assert {str(r) for r in tab["max_lora_ranks"]} == set(vllm.spec("--max-lora-rank").choices)
    assert vllm.canonical("-tp") == "--tensor-parallel-size" and vllm.spec("-q").name == "--quantization"


def test_the_verl_table_reads_hydra_spellings_and_config_names():
    verl = table("verl")
    assert verl.config("ppo_megatron_trainer.yaml") == verl.config("ppo_megatron_trainer") == "ppo_megatron_trainer"
    assert verl.config("my_recipe") is None
    key = "actor_rollout_ref.actor.megatron.use_distributed_optimizer"
    assert verl.canonical("++" + key) == verl.canonical("+" + key) == key
    assert verl.spec(key, "ppo_megatron_trainer") == verl.spec("+" + key, "ppo_megatron_trainer")
    assert (verl.spec(key, "ppo_megatron_trainer").type, verl.default(key, "ppo_megatron_trainer")) == ("bool", True)
    assert verl.spec(key, "ppo_trainer") is None
    assert verl.default("actor_rollout_ref.actor.optim.optimizer", "ppo_trainer") == "AdamW"
    assert verl.default("actor_rollout_ref.rollout.name", "ppo_trainer") is None  # '???': the job must set it


def test_the_parser_rules_a_record_is_checked_against():
    sglang = table("sglang")
    assert sglang.problems("--tp-size", ("2",)) == []
    assert sglang.problems("--tp-size", ("two",)) == ["--tp-size two: not an int"]
    assert sglang.problems("--tp-size", ()) == ["--tp-size takes 1 value(s), not 0"]
    assert sglang.problems("--kv-cache-dtype", ("fp9",))[0].startswith("--kv-cache-dtype fp9: not one of its choices")
    assert sglang.problems("--ep", ("2",)) == ["no flag --ep (its name is --ep-size)"]
    assert sglang.problems("--no-such-flag", ()) == ["no flag --no-such-flag"]


def test_lowering_writes_through_the_table(tmp_path, monkeypatch):
    """A record the engine's own parser would refuse (here: a KV cache dtype SGLang has no choice for) is
    PCC614 on the rule that asked, at `pcc check`, not a server that fails to start."""
    from pcc.lower import sglang

    table_ = {**sglang.tables(), "kv_cache_dtype": {**sglang.tables()["kv_cache_dtype"], "fp8_e4m3": "fp9_e9m9"}}
    monkeypatch.setattr(sglang, "tables", lambda: table_)
    path = ROOT / "contracts" / "glm52_fp8_rollout.prec"
    c = compile_file(str(path))
    bad = [d for d in c.diagnostics if d.code == "PCC614"]
    assert bad and all(d.span.line == 18 and "fp9_e9m9" in d.message for d in bad)


def test_a_miles_launch_reads_a_negation_as_off():
    from pcc.importer.miles import parse_args

    _, flags, _ = parse_args(["python3", "train.py", "--sglang-dcp-replicate-q-proj", "--sglang-no-dcp-replicate-q-proj",
                              "--sglang-ep", "4"])
    assert flags == {"--sglang-ep-size": ["4"]}
