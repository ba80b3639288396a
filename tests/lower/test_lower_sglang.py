"""SGLang lowering, checked against SGLang's own ServerArgs parser (requirements/sglang.txt).

With CI=true a missing parser fails these tests; elsewhere they skip. Expected values are
written out by hand from the seed rows and SGLang's sources, never recomputed with pcc.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from pcc.lower import lower
from pcc.lower import Unsupported
from pcc.lower.sglang import ARGS_FILE, LAUNCH, QUANT_FILE
from pcc.plan import compile_file

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = sorted((ROOT / "contracts").glob("*.prec"))
MLA_ATTN = ["kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "q_a_proj", "q_b_proj"]


def _plan(name: str):
    c = compile_file(str(ROOT / "contracts" / name))
    assert c.ok, [str(d) for d in c.diagnostics if d.is_error]
    return c.plan


def _plan_text(tmp_path: Path, text: str):
    p = tmp_path / "c.prec"
    p.write_text(text, encoding="utf-8")
    c = compile_file(str(p))
    assert c.plan is not None, [str(d) for d in c.diagnostics]
    return c.plan


def _with(plan, **update):
    return dataclasses.replace(plan, contract=plan.contract.model_copy(update=update))


@pytest.fixture(scope="module")
def sglang():
    from pcc.lower import verify_sglang

    try:
        verify_sglang._server_args()
    except verify_sglang.EngineMissing as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the SGLang parser checks: {exc}")
        pytest.skip(f"SGLang's parser is not installed ({exc}); see requirements/sglang.txt")
    return verify_sglang


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("path", CONTRACTS, ids=lambda p: p.stem)
def test_every_contract_is_accepted_by_sglang(path, sglang):
    plan = compile_file(str(path)).plan
    low = lower(plan, "sglang")
    sa = sglang.verify_sglang_args(low.args)
    assert low.files[ARGS_FILE].splitlines() == low.args
    assert (sa.tp_size, sa.ep_size, sa.dp_size) == (plan.contract.rollout.parallel.tp,
                                                      plan.contract.rollout.parallel.ep,
                                                      plan.contract.rollout.parallel.dp)
    assert sa.dtype == "bfloat16" and sa.weight_version == "0"
    assert sa.quantization == (_value(low.args, "--quantization") if "--quantization" in low.args else None)
    assert sa.kv_cache_dtype == _value(low.args, "--kv-cache-dtype")
    assert sa.enable_return_routed_experts == (plan.contract.routing_replay == "r3")
    assert not any(os.sep in a for a in low.args), "paths reach SGLang only through the launch script"


def test_unified_fp8_quantization_fp8(sglang):
    low = lower(_plan("unified_fp8.prec"), "sglang")
    assert _value(low.args, "--quantization") == "fp8"
    assert sglang.verify_sglang_args(low.args).quantization == "fp8"


def test_glm52_fp8_kv_cache(sglang):
    low = lower(_plan("glm52_fp8_rollout.prec"), "sglang")
    assert _value(low.args, "--kv-cache-dtype") == "fp8_e4m3"
    assert sglang.verify_sglang_args(low.args).kv_cache_dtype == "fp8_e4m3"


def test_wide_rollout_has_no_quantization():
    low = lower(_plan("bf16_baseline.prec"), "sglang")
    assert "--quantization" not in low.args and _value(low.args, "--kv-cache-dtype") == "auto"
    assert QUANT_FILE not in low.files


def test_k3_lora_on_mla_attention(sglang):
    low = lower(_plan("k3_mxfp4_lora.prec"), "sglang")
    sa = sglang.verify_sglang_args(low.args)
    assert sa.enable_lora and sa.max_lora_rank == 16
    assert sorted(sa.lora_target_modules) == MLA_ATTN
    assert sa.quantization == "mxfp4"
    assert any("MXFP4 base" in n for n in low.notes)


def test_mxfp4_quantization_is_a_parser_choice_but_its_registry_needs_the_runtime(sglang):
    """The parser takes --quantization mxfp4 from a static list on any machine; whether the
    runtime registers Mxfp4Config is decided at model load (cuda/hip/xpu or the CPU engine)."""
    from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES

    assert "mxfp4" in QUANTIZATION_CHOICES
    try:
        cls = sglang.quant_config_class("mxfp4")
    except sglang.CannotCheck as exc:
        pytest.skip(f"cannot check here, not valid: {exc}")
    assert cls.get_name() == "mxfp4"


def test_qwen38_nvfp4_with_lora_on_attention_only(sglang):
    low = lower(_plan("qwen38_nvfp4_lora.prec"), "sglang")
    sa = sglang.verify_sglang_args(low.args)
    assert sa.quantization == "modelopt_fp4"
    assert sorted(sa.lora_target_modules) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert sa.max_lora_rank == 16


def test_deterministic_rollout(sglang):
    plan = _plan("unified_fp8.prec")
    plan = _with(plan, rollout=plan.contract.rollout.model_copy(update={"deterministic": True}))
    low = lower(plan, "sglang")
    assert sglang.verify_sglang_args(low.args).enable_deterministic_inference is True


def test_parser_rejections_reach_the_caller(sglang):
    with pytest.raises(sglang.VerifyError, match="quantization"):
        sglang.verify_sglang_args(["--quantization", "w4a16"])
    with pytest.raises(sglang.VerifyError, match="lora-target-modules"):
        sglang.verify_sglang_args(["--enable-lora", "--lora-target-modules", "experts"])


def test_tables_are_sglang_choices(sglang):
    from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES
    from sglang.srt.utils.common import SUPPORTED_LORA_TARGET_MODULES

    from pcc.lower.sglang import tables

    _, parser = sglang._server_args()
    kv_choices = next(a.choices for a in parser._actions if "--kv-cache-dtype" in a.option_strings)
    tab = tables()
    assert set(tab["quantization"].values()) <= set(QUANTIZATION_CHOICES)
    assert set(tab["kv_cache_dtype"].values()) <= set(kv_choices)
    assert {m for ms in tab["lora_modules"].values() for m in ms} <= set(SUPPORTED_LORA_TARGET_MODULES)


def test_lora_on_mxfp4_experts_is_refused(tmp_path):
    text = (ROOT / "contracts" / "k3_mxfp4_lora.prec").read_text(encoding="utf-8")
    text = text.replace("targets attn.q, attn.kv, attn.o", "targets attn.q, attn.kv, attn.o, experts")
    with pytest.raises(Unsupported, match="MoE LoRA runs on"):
        lower(_plan_text(tmp_path, text), "sglang")


def test_half_expert_lora_is_refused(tmp_path):
    text = (ROOT / "contracts" / "qwen38_nvfp4_lora.prec").read_text(encoding="utf-8")
    text = text.replace("targets attn.q, attn.kv, attn.o", "targets attn.q, experts.down")
    with pytest.raises(Unsupported, match="both gate/up and down"):
        lower(_plan_text(tmp_path, text), "sglang")


def test_routed_experts_on_a_dense_model_are_refused(tmp_path):
    text = (ROOT / "contracts" / "tiny_cpu.prec").read_text(encoding="utf-8")
    text = text.replace("model tiny_moe", "model tiny_dense").replace("routing replay rollout", "")
    plan = _plan_text(tmp_path, text)
    assert "--enable-return-routed-experts" not in lower(plan, "sglang").args
    with pytest.raises(Unsupported, match="dense"):
        lower(_with(plan, routing_replay="r3"), "sglang")


def test_quantization_config_file_matches_checkpoint_config(sglang):
    from pcc.lower.checkpoint_config import quantization_config

    for name, method in [("unified_fp8.prec", "fp8"), ("k3_mxfp4_lora.prec", "mxfp4"),
                         ("qwen38_nvfp4_lora.prec", "modelopt"), ("int4_qat_w4a16.prec", "compressed-tensors")]:
        plan = _plan(name)
        cfg = json.loads(lower(plan, "sglang").files[QUANT_FILE])
        assert cfg == quantization_config(plan) and cfg["quant_method"] == method
    try:
        sglang.verify_quantization_config(json.loads(lower(_plan("unified_fp8.prec"), "sglang").files[QUANT_FILE]))
    except sglang.CannotCheck as exc:
        pytest.skip(f"Fp8Config.from_config cannot run here (not 'valid'): {exc}")


def _fake_python(tmp_path: Path) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "python"
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done\n", encoding="utf-8")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return bindir


def _run_launch(tmp_path: Path, script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    path = tmp_path / "launch_server.sh"
    path.write_text(script, encoding="utf-8")
    full = {"PATH": f"{_fake_python(tmp_path)}:{os.environ['PATH']}", **env}
    return subprocess.run(["bash", str(path)], env=full, capture_output=True, timeout=30)


def test_launch_script_keeps_an_awkward_path_one_argument(tmp_path):
    low = lower(_plan("k3_mxfp4_lora.prec"), "sglang")
    ckpt = tmp_path / "my ckpt 'v1' \"final\" $HOME"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "mxfp4"}}))
    adapter = tmp_path / "adapter; rm -rf x"
    adapter.mkdir()
    out = _run_launch(tmp_path, low.files[LAUNCH], {"PCC_ROLLOUT_CHECKPOINT": str(ckpt),
                                                    "PCC_ADAPTER": str(adapter)})
    assert out.returncode == 0, out.stderr.decode()
    argv = out.stdout.decode().split("\0")[:-1]
    assert argv == ["-m", "sglang.launch_server", "--model-path", str(ckpt), *low.args,
                    "--lora-paths", f"policy={adapter}"]


def test_launch_script_refuses_a_missing_or_wrong_checkpoint(tmp_path):
    low = lower(_plan("unified_fp8.prec"), "sglang")
    out = _run_launch(tmp_path, low.files[LAUNCH], {"PCC_ROLLOUT_CHECKPOINT": str(tmp_path / "nope")})
    assert out.returncode == 1 and b"does not exist" in out.stderr and out.stdout == b""
    bf16 = tmp_path / "bf16"
    bf16.mkdir()
    (bf16 / "config.json").write_text("{}")
    out = subprocess.run(["bash", str(tmp_path / "launch_server.sh")], capture_output=True, timeout=30,
                         env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "PCC_ROLLOUT_CHECKPOINT": str(bf16)})
    assert out.returncode == 1 and b"quant_method fp8" in out.stderr


def test_block_fp8_checkpoint_config_written_by_hand():
    """An independent expectation, from SGLang's Fp8Config fields and the contract read by eye:
    tiny_moe (4 layers) with `linear : fp8_block` and `keep bf16 : embed, lm_head, router, norm`.
    The linear modules left wide are the embedding, the four routers and the LM head (norms are
    not linear modules, so SGLang never converts them)."""
    import json

    from pcc.lower.checkpoint_config import quantization_config

    plan = compile_file(str(ROOT / "contracts" / "tiny_cpu.prec")).plan
    expected = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",  # as the published Qwen3-*-FP8 and DeepSeek-V3 configs write it
        "weight_block_size": [128, 128],
        "modules_to_not_convert": ["model.embed_tokens"] + [f"model.layers.{i}.mlp.gate" for i in range(4)]
                                  + ["lm_head"],
    }
    assert quantization_config(plan) == expected
    assert json.loads(lower(plan, "sglang").files["rollout/quantization_config.json"]) == expected
