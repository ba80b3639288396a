"""NVFP4 `input_scale`: calibrated (ModelOpt's amax / (6 * 448)), carried from the source, or flagged 1.0."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from convert_helpers import load_tensors, make_checkpoint, write_contract
from safetensors.torch import save_file

from pcc.cli import main
from pcc.runtime.calibrate import calibration_tokens
from pcc.runtime.model import Arch, forward
from pcc.models import catalog_from_checkpoint

E4M3_MAX, E2M1_MAX = 448.0, 6.0
EXPERTS = "model.layers.{}.mlp.experts.{}.{}_proj"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("src") / "tiny_moe"
    return root, make_checkpoint(root, "tiny_moe", shards=1)


def _convert(contract, src, dst, capsys, *extra):
    code = main(["convert", str(contract), "--from", str(src), "--to", str(dst), "--json", *extra])
    got = capsys.readouterr()
    env = json.loads(got.out)  # the --json envelope: the summary on success, else why (diagnostics)
    return code, env["result"] if env["ok"] else env, got.err


def _verify(contract, dst, src, capsys):
    code = main(["verify-checkpoint", str(contract), str(dst), "--source", str(src), "--full", "--json"])
    return code, json.loads(capsys.readouterr().out)["result"]


class _Inputs:
    """The test's own BF16 execution of the runtime model, recording max |input| of every linear;
    at each router every expert runs on every token (ModelOpt's MoE calibration)."""

    def __init__(self, w, experts):
        self.w, self.experts, self.amax = w, experts, {}

    def _mm(self, name, x):
        self.amax[name] = max(self.amax.get(name, 0.0), x.abs().max().item())
        return (x.bfloat16().float() @ self.w[name].bfloat16().float().t()).bfloat16().float()

    def linear(self, name, x):
        if name.endswith("mlp.gate.weight"):
            for e in range(self.experts):
                p = name.replace("gate.weight", f"experts.{e}.")
                act = F.silu(self._mm(p + "gate_proj.weight", x)) * self._mm(p + "up_proj.weight", x)
                self.amax[p + "down_proj.weight"] = max(self.amax.get(p + "down_proj.weight", 0.0),
                                                        act.bfloat16().float().abs().max().item())
        return self._mm(name, x)

    def weight(self, name):
        return self.w[name]

    def kv(self, layer, k, v):
        return k, v


def test_calibrate_writes_the_runtime_models_activation_amax_over_2688(source, tmp_path, capsys):
    src, written = source
    contract = write_contract(tmp_path, "nvfp4")
    code, summary, err = _convert(contract, src, tmp_path / "out", capsys, "--calibrate")
    assert code == 0 and summary["calibrated_input_scales"] == summary["input_scales"] == 3 * 8 * 3
    assert summary["uncalibrated_input_scales"] == 0 and "WARNING" not in err
    out = load_tensors(tmp_path / "out")
    arch = Arch.from_catalog(catalog_from_checkpoint(src))
    rec = _Inputs({k: v.float() for k, v in written.items()}, arch.experts)
    forward(arch, rec, calibration_tokens())
    names = [n for n in out if n.endswith(".input_scale")]
    assert len(names) == 72
    for name in names:
        want = torch.tensor(rec.amax[name.replace(".input_scale", ".weight")] / (E2M1_MAX * E4M3_MAX),
                            dtype=torch.float32)
        assert out[name].dtype == torch.float32 and out[name].shape == ()
        assert torch.equal(out[name], want), name
    # every expert of a layer sees the layer's whole MLP input: one gate/up scale per layer, and not 1.0
    for layer in (1, 2, 3):
        gate = {float(out[EXPERTS.format(layer, e, "gate") + ".input_scale"]) for e in range(8)}
        assert len(gate) == 1 and gate != {1.0}
    code, report = _verify(contract, tmp_path / "out", src, capsys)
    assert code == 0 and report["uncalibrated_input_scales"] == 0 and not report["findings"]


def test_small_supported_model_is_calibrated_by_default(source, tmp_path, capsys):
    src, _ = source
    contract = write_contract(tmp_path, "nvfp4")
    code, summary, _ = _convert(contract, src, tmp_path / "auto", capsys)
    code2, forced, _ = _convert(contract, src, tmp_path / "forced", capsys, "--calibrate")
    assert code == code2 == 0 and summary["calibrated_input_scales"] == 72
    auto, cal = load_tensors(tmp_path / "auto"), load_tensors(tmp_path / "forced")
    assert all(torch.equal(auto[n], cal[n]) for n in auto if n.endswith(".input_scale"))


def test_source_input_scales_are_carried_over_and_shared_by_fused_projections(source, tmp_path, capsys):
    src, written = source
    mine = tmp_path / "modelopt"
    make_checkpoint(mine, "tiny_moe", shards=1)
    # a ModelOpt-calibrated source for layer 1's experts only: F32 [] and a BF16 [1] (both ModelOpt exports)
    extra = {EXPERTS.format(1, e, p) + ".input_scale": torch.tensor(0.001 * (1 + e) + 0.0001 * k, dtype=torch.float32)
             for e in range(8) for k, p in enumerate(("gate", "up", "down"))}
    extra[EXPERTS.format(1, 7, "down") + ".input_scale"] = torch.tensor([0.0625], dtype=torch.bfloat16)
    save_file(extra, str(mine / "modelopt_scales.safetensors"), metadata={"format": "pt"})
    index = json.loads((mine / "model.safetensors.index.json").read_text())
    index["weight_map"].update({n: "modelopt_scales.safetensors" for n in extra})
    (mine / "model.safetensors.index.json").write_text(json.dumps(index))
    contract = write_contract(tmp_path, "nvfp4")
    code, summary, _ = _convert(contract, mine, tmp_path / "out", capsys)
    assert code == 0, summary
    assert (summary["carried_input_scales"], summary["calibrated_input_scales"]) == (24, 48)
    out = load_tensors(tmp_path / "out")
    for name, value in extra.items():
        assert out[name].dtype == torch.float32 and out[name].shape == ()
        # an expert's gate and up are one fused GEMM with one input scale: the larger of the two carried
        fused = [name.replace(a, b) for a, b in (("up_proj", "gate_proj"), ("gate_proj", "up_proj"))]
        want = value.float().item() if "down_proj" in name else max(extra[n].float().item() for n in fused)
        assert out[name].item() == want, name
    assert out[EXPERTS.format(1, 2, "gate") + ".input_scale"].item() != extra[EXPERTS.format(1, 2, "gate")
                                                                             + ".input_scale"].item()
    calibrated = load_tensors(_calibrated(contract, src, tmp_path, capsys))  # same weights, no source scales
    layer2 = [n for n in out if n.startswith("model.layers.2.") and n.endswith(".input_scale")]
    assert layer2 and all(torch.equal(out[n], calibrated[n]) for n in layer2)
    code, report = _verify(contract, tmp_path / "out", mine, capsys)
    assert code == 0, report["problems"]
    # a carried scale that changed on the way is a verify-checkpoint problem
    tampered = dict(out)
    tampered[EXPERTS.format(1, 3, "up") + ".input_scale"] = torch.tensor(0.5)
    save_file(tampered, str(tmp_path / "out" / "model.safetensors"), metadata={"format": "pt"})
    code, report = _verify(contract, tmp_path / "out", mine, capsys)
    assert code == 1 and "source's input_scale" in report["problems"][0]["message"]


def _calibrated(contract, src, tmp_path, capsys):
    dst = tmp_path / "plain"
    assert _convert(contract, src, dst, capsys, "--calibrate")[0] == 0
    return dst


def test_without_calibration_it_warns_and_verify_reports_it(source, tmp_path, capsys):
    src, _ = source
    contract = write_contract(tmp_path, "nvfp4")
    code, summary, err = _convert(contract, src, tmp_path / "out", capsys, "--no-calibrate")
    assert code == 0 and summary["uncalibrated_input_scales"] == 72 and summary["calibrated_input_scales"] == 0
    assert "WARNING: 72 of 72 static input_scale" in err and "--no-calibrate" in err
    out = load_tensors(tmp_path / "out")
    assert all(out[n].item() == 1.0 for n in out if n.endswith(".input_scale"))
    code, report = _verify(contract, tmp_path / "out", src, capsys)
    assert code == 0 and report["uncalibrated_input_scales"] == 72
    assert report["findings"][0]["family"] == "input_scale" and "uncalibrated" in report["findings"][0]["message"]
    assert main(["verify-checkpoint", str(contract), str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "input_scale:" in err


def _dense_nvfp4(tmp_path, **config):
    src = tmp_path / "src"
    make_checkpoint(src, "tiny_dense", shards=1, **config)
    contract = tmp_path / "dense.prec"
    contract.write_text(f'contract dense {{\n  model from "{src}"\n  hardware B200\n'
                        "  rollout sglang {\n    linear : nvfp4\n    keep bf16 : embed, lm_head, norm\n  }\n"
                        "  trainer megatron {\n    gemm : bf16\n    optimizer adam\n  }\n  trainable all\n"
                        "  sync full_weights { schedule colocated bridge bf16 activation atomic }\n}\n")
    return contract, src


@pytest.mark.parametrize("config, named", [
    ({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}, "model_type 'qwen2'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling"),
])
def test_an_architecture_the_runtime_cannot_run_is_refused(config, named, tmp_path, capsys):
    contract, src = _dense_nvfp4(tmp_path, **config)
    code, summary, _ = _convert(contract, src, tmp_path / "out", capsys, "--calibrate")
    assert code == 1 and named in summary["diagnostics"][0]["message"]
    assert "config.json" in summary["diagnostics"][0]["message"]
    assert not (tmp_path / "out").exists()
    code, summary, err = _convert(contract, src, tmp_path / "out", capsys)  # default: written, loudly uncalibrated
    assert code == 0 and summary["uncalibrated_input_scales"] == summary["input_scales"] == 28
    assert named in summary["uncalibrated_reason"] and "WARNING" in err


def test_calibration_measures_what_transformers_computes(source, tmp_path, capsys):
    """The runtime model is the real architecture: each layer's MoE input amax from transformers'
    own Qwen3-MoE (FP32) agrees with the calibrated gate_proj scale within BF16 rounding (1%)."""
    transformers = pytest.importorskip("transformers")
    src, _ = source
    contract = write_contract(tmp_path, "nvfp4")
    out = load_tensors(_calibrated(contract, src, tmp_path, capsys))
    model = transformers.Qwen3MoeForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    amax = {}
    for i, layer in enumerate(model.model.layers):
        layer.mlp.register_forward_pre_hook(
            lambda _m, args, i=i: amax.__setitem__(i, max(amax.get(i, 0.0), args[0].abs().max().item())))
    with torch.no_grad():
        model(calibration_tokens())
    for layer in (1, 2, 3):
        got = out[EXPERTS.format(layer, 5, "gate") + ".input_scale"].item() * E2M1_MAX * E4M3_MAX
        assert abs(got / amax[layer] - 1) < 0.01, (layer, got, amax[layer])


def test_calibration_tokens_from_a_file(source, tmp_path, capsys):
    src, written = source
    contract = write_contract(tmp_path, "nvfp4")
    tokens = torch.randint(0, 512, (4, 9), generator=torch.Generator().manual_seed(5), dtype=torch.int32)
    save_file({"input_ids": tokens}, str(tmp_path / "tokens.safetensors"))
    code, summary, _ = _convert(contract, src, tmp_path / "out", capsys, "--calibration-tokens",
                                str(tmp_path / "tokens.safetensors"))
    assert code == 0 and summary["calibration_batch"].endswith("[4, 9]")
    arch = Arch.from_catalog(catalog_from_checkpoint(src))
    rec = _Inputs({k: v.float() for k, v in written.items()}, arch.experts)
    forward(arch, rec, tokens.long())
    out = load_tensors(tmp_path / "out")
    name = EXPERTS.format(2, 4, "down")
    assert out[name + ".input_scale"].item() == torch.tensor(rec.amax[name + ".weight"] / 2688.0).item()
    save_file({"input_ids": tokens + 600}, str(tmp_path / "bad.safetensors"))
    code, summary, _ = _convert(contract, src, tmp_path / "bad", capsys, "--calibration-tokens",
                                str(tmp_path / "bad.safetensors"))
    assert code == 1 and "outside [0, 512)" in summary["diagnostics"][0]["message"]
