"""NVFP4 as the loaders read it: projections an engine fuses into one GEMM share one global scale.

SGLang's and vLLM's fused MoE keep only w13's first `weight_scale_2` (gate's), their linear loaders the
max of the members' without requantizing the block scales; ModelOpt's export gives the members one amax.
The reference here is the NVFP4 definition worked by hand with numpy and ml_dtypes (float4_e2m1fn,
float8_e4m3fn), with the group's amax taken from the source weights, never from pcc.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import torch
from convert_helpers import e2m1, load_tensors, make_checkpoint, nvfp4_reference, qwen3_5_moe_checkpoint, unpack_fp4

from pcc.cli import main
from pcc.lower import compile_file

RULES = {"tiny_moe": "linear : nvfp4\n    keep bf16 : embed, lm_head, router, norm",
         "tiny_shared_moe": "linear : nvfp4\n    keep bf16 : embed, lm_head, router, norm"}


def _contract(directory, model, rules=None):
    text = (f"contract fused-{model.replace('_', '-')} {{\n  model {model}\n  hardware B200\n"
            f"  rollout sglang {{\n    {rules or RULES[model]}\n  }}\n"
            "  trainer megatron {\n    gemm : bf16\n    optimizer adam\n  }\n  trainable all\n"
            "  sync full_weights { schedule colocated bridge bf16 activation atomic }\n}\n")
    path = directory / f"{model}.prec"
    path.write_text(text, encoding="utf-8")
    return path


def _groups(model: str) -> dict[str, list[str]]:
    """The fused groups by hand, from the tensor names (what SGLang fuses)."""
    if model == "tiny_moe":
        groups = {}
        for layer in range(4):
            p = f"model.layers.{layer}."
            groups[p + "qkv"] = [p + f"self_attn.{m}_proj.weight" for m in "qkv"]
            for e in range(8):
                q = f"{p}mlp.experts.{e}."
                groups[q + "w13"] = [q + "gate_proj.weight", q + "up_proj.weight"]
        return groups
    groups = {}
    for layer in range(4):
        p = f"model.layers.{layer}."
        groups[p + "qkv_a"] = [p + "self_attn.q_a_proj.weight", p + "self_attn.kv_a_proj_with_mqa.weight"]
        mlps = [p + "mlp."] if layer == 0 else [f"{p}mlp.experts.{e}." for e in range(8)] + [p + "mlp.shared_experts."]
        for q in mlps:
            groups[q + "gate_up"] = [q + "gate_proj.weight", q + "up_proj.weight"]
    return groups


@pytest.mark.parametrize("model", ["tiny_moe", "tiny_shared_moe"])
def test_the_plan_names_each_fused_group_once(model, tmp_path):
    plan = compile_file(str(_contract(tmp_path, model))).plan
    want = {tuple(g) for g in _groups(model).values()}
    got = {tuple(t["scale_group"]) for t in plan.rollout_tensors if t is not None and "scale_group" in t}
    assert got == want
    for i, t in enumerate(plan.rollout_tensors):  # every member names its own group; nothing else has one
        name = plan.catalog.operators[i].tensor
        member = [g for g in want if name in g]
        assert (t or {}).get("scale_group") == (list(member[0]) if member else None), name
    # the converter plan carries it, so a consumer reads the groups instead of re-deriving them
    from pcc.lower.converter import converter_plan

    entries = {e["source"]: e for e in converter_plan(plan)["tensors"]}
    assert all(entries[m]["scale_group"] == list(g) for g in want for m in g)


def test_a_member_kept_wide_leaves_the_group():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        plan = compile_file(str(_contract(Path(d), "tiny_moe",
                                          "linear : nvfp4\n    keep bf16 : embed, lm_head, router, norm, "
                                          "attn.q"))).plan
    groups = {tuple(t["scale_group"]) for t in plan.rollout_tensors if t and "scale_group" in t}
    assert ("model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight") in groups
    assert not any("q_proj" in m for g in groups for m in g)


@pytest.mark.parametrize("model", ["tiny_moe", "tiny_shared_moe"])
def test_fused_members_share_one_global_scale_and_reconstruct(model, tmp_path):
    src = tmp_path / "src"
    weights = make_checkpoint(src, model)
    contract = _contract(tmp_path, model)
    assert main(["convert", str(contract), "--from", str(src), "--to", str(tmp_path / "out"), "--no-calibrate"]) == 0
    out = load_tensors(tmp_path / "out")
    ratios = []
    for members in _groups(model).values():
        xs = {m: weights[m].float().numpy() for m in members}
        own = {m: np.abs(x).max() for m, x in xs.items()}
        ratios.append(max(own.values()) / min(own.values()))
        amax = np.float32(max(own.values()))
        scale_2 = {m: out[m.removesuffix(".weight") + ".weight_scale_2"] for m in members}
        assert len({v.numpy().tobytes() for v in scale_2.values()}) == 1, members  # one global scale, bit for bit
        for m, x in xs.items():
            p = m.removesuffix(".weight")
            codes, s_b, ws2 = nvfp4_reference(x, amax)
            assert float(scale_2[m]) == float(ws2)
            assert abs(float(ws2) - float(amax) / 2688) <= float(ws2) * 2**-23  # ModelOpt's amax / (6 * 448)
            k = x.shape[1]
            got_codes = unpack_fp4(out[m].numpy(), k)
            assert np.array_equal(got_codes, codes), m
            assert np.array_equal(out[p + ".weight_scale"].view(torch.uint8).numpy(), s_b), m
            # dequantized as the loaders do: e2m1 x e4m3 block scale x weight_scale_2
            d = s_b.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * ws2
            value = e2m1(got_codes).reshape(x.shape[0], k // 16, 16) * d[..., None]
            err = np.abs(value.reshape(x.shape) - x)
            per = np.repeat(d, 16, axis=1)
            # E2M1 rounding: half a step, 0.25 below 2 and |y|/4 above, times the block's scale, plus
            # what saturates at 6 x scale (the e4m3 block scale may round below amax_b / 6); a tie is
            # exactly half a step, so float32's own rounding of x and of the product gets 2^-20
            bound = (np.maximum(0.25 * per, np.abs(x) / 4) + np.maximum(np.abs(x) - 6 * per, 0)) * (1 + 2**-20)
            assert (err <= bound).all(), m
    assert max(ratios) > 1.1  # members' own amaxes differ: per-member scales would not be equal
    assert main(["verify-checkpoint", str(contract), str(tmp_path / "out"), "--source", str(src), "--full"]) == 0


def test_qwen3_5_gated_deltanet_pairs_share_one_global_scale(tmp_path):
    """SGLang and vLLM load Qwen3.5's in_proj_qkv and in_proj_z as one in_proj_qkvz (packed_modules_mapping, the
    table of targets/sglang.yaml `gated_deltanet.merged`), whose NVFP4 loader keeps one weight_scale_2: the
    converter writes the pair's, from the larger amax, and each member's codes are NVFP4 by definition with it
    (before, each had its own scale, and the loader dequantized one with the other's)."""
    pytest.importorskip("transformers")
    src = tmp_path / "src"
    qwen3_5_moe_checkpoint(src)
    contract = tmp_path / "c.prec"
    contract.write_text(f"""contract q35-nvfp4 {{
  model from "{src}"
  hardware B200
  rollout sglang {{
    linear : nvfp4
    keep bf16 : embed, lm_head, norm, router
  }}
  routing replay rollout
}}
""", encoding="utf-8")
    plan = compile_file(str(contract)).plan
    head = "model.language_model.layers.0.linear_attn."
    pair = [head + "in_proj_qkv.weight", head + "in_proj_z.weight"]
    assert json.loads(_plan_json(plan))[head + "in_proj_qkv.weight"] == pair
    assert main(["convert", str(contract), "--from", str(src), "--to", str(tmp_path / "out"), "--no-calibrate"]) == 0
    weights, out = load_tensors(src), load_tensors(tmp_path / "out")
    xs = {m: weights[m].float().numpy() for m in pair}
    amax = np.float32(max(np.abs(x).max() for x in xs.values()))
    assert min(np.abs(x).max() for x in xs.values()) < amax  # their own amaxes differ
    for m, x in xs.items():
        p = m.removesuffix(".weight")
        codes, s_b, ws2 = nvfp4_reference(x, amax)
        assert float(out[p + ".weight_scale_2"]) == float(ws2), m
        assert np.array_equal(unpack_fp4(out[m].numpy(), x.shape[1]), codes), m
        assert np.array_equal(out[p + ".weight_scale"].view(torch.uint8).numpy(), s_b), m
    assert main(["verify-checkpoint", str(contract), str(tmp_path / "out"), "--source", str(src), "--full"]) == 0


def _plan_json(plan) -> str:
    """Each NVFP4 operator's scale group in the converter plan (`convert/plan.json`), by source tensor."""
    from pcc.lower.converter import converter_plan

    return json.dumps({e["source"]: e["scale_group"] for e in converter_plan(plan)["tensors"] if "scale_group" in e})


def test_the_live_sync_shares_the_same_scales(tmp_path):
    """The runtime's convert_full (what every live sync installs) writes the converter's bytes."""
    from pcc.runtime.weights import convert_full

    src = tmp_path / "src"
    weights = make_checkpoint(src, "tiny_moe")
    contract = _contract(tmp_path, "tiny_moe")
    assert main(["convert", str(contract), "--from", str(src), "--to", str(tmp_path / "out"), "--no-calibrate"]) == 0
    out = load_tensors(tmp_path / "out")
    live = convert_full(compile_file(str(contract)).plan, weights)
    names = [n for n in out if not n.endswith(".input_scale")]
    assert len(names) > 300
    def raw(t):
        return t.contiguous().view(-1).view(torch.uint8)

    assert all(torch.equal(raw(live[n]), raw(out[n])) for n in names)


def test_num_local_experts_is_calibrated_as_moe(tmp_path, capsys):
    """transformers 5 writes a Qwen3-MoE / Mixtral config's expert count as `num_local_experts`."""
    contract = _contract(tmp_path, "tiny_moe", "experts : nvfp4")
    summaries = {}
    for key in ("num_experts", "num_local_experts"):
        src = tmp_path / key
        make_checkpoint(src, "tiny_moe", shards=1)
        config = json.loads((src / "config.json").read_text())
        config[key] = config.pop("num_experts")
        (src / "config.json").write_text(json.dumps(config))
        dst = tmp_path / f"out-{key}"
        code = main(["convert", str(contract), "--from", str(src), "--to", str(dst), "--calibrate", "--json"])
        summaries[key] = json.loads(capsys.readouterr().out)
        assert code == 0, summaries[key]["diagnostics"]
        assert summaries[key]["result"]["calibrated_input_scales"] == 4 * 8 * 3
    a, b = load_tensors(tmp_path / "out-num_experts"), load_tensors(tmp_path / "out-num_local_experts")
    scales = [n for n in a if n.endswith(".input_scale")]
    assert len(scales) == 96 and all(torch.equal(a[n], b[n]) for n in scales)
    assert len({float(a[n]) for n in scales}) > 10  # measured, not the 1.0 placeholder


def test_an_nvfp4_source_that_scaled_fused_members_apart_is_requantized_with_one_scale(tmp_path):
    """A source whose expert gate and up carry different weight_scale_2 (the loaders would apply gate's to
    both) is requantized as a group from its own values; members that agree are copied bit for bit."""
    from safetensors.torch import save_file

    wide = tmp_path / "bf16"
    make_checkpoint(wide, "tiny_moe", shards=1)
    contract = _contract(tmp_path, "tiny_moe", "experts : nvfp4")
    src = tmp_path / "modelopt"
    assert main(["convert", str(contract), "--from", str(wide), "--to", str(src), "--no-calibrate"]) == 0
    tensors = load_tensors(src)
    p = "model.layers.2.mlp.experts.5."
    tensors[p + "up_proj.weight_scale_2"] = tensors[p + "up_proj.weight_scale_2"] * 0.75  # a legit, other weight
    (src / "pcc_convert.json").unlink()
    save_file(tensors, str(next(src.glob("*.safetensors"))), metadata={"format": "pt"})
    dst = tmp_path / "out"
    assert main(["convert", str(contract), "--from", str(src), "--to", str(dst), "--no-calibrate"]) == 0
    out = load_tensors(dst)
    # the group: the source's values (e2m1 x e4m3 x its own weight_scale_2), requantized with their joint amax
    values = {}
    for m in ("gate_proj", "up_proj"):
        q = p + m
        codes = unpack_fp4(tensors[q + ".weight"].numpy(), 128)
        block = tensors[q + ".weight_scale"].view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        values[m] = e2m1(codes) * np.repeat(block, 16, 1) * tensors[q + ".weight_scale_2"].numpy()
    amax = np.float32(max(np.abs(v).max() for v in values.values()))
    for m, x in values.items():
        codes, s_b, ws2 = nvfp4_reference(x.astype(np.float32), amax)
        assert float(out[p + m + ".weight_scale_2"]) == float(ws2)
        assert np.array_equal(unpack_fp4(out[p + m + ".weight"].numpy(), 128), codes)
    # one scale for both, so one member's differs from the source's: requantized, where a copy keeps both
    assert torch.equal(out[p + "up_proj.weight_scale_2"], out[p + "gate_proj.weight_scale_2"])
    moved = [m for m in ("gate_proj", "up_proj")
             if not torch.equal(out[p + m + ".weight_scale_2"], tensors[p + m + ".weight_scale_2"])
             and not torch.equal(out[p + m + ".weight_scale"].view(torch.uint8),
                                 tensors[p + m + ".weight_scale"].view(torch.uint8))]
    assert moved
    same = [n for n in tensors if ".experts.5." not in n or ".layers.2." not in n]
    assert len(same) > 300 and all(torch.equal(out[n].view(torch.uint8) if out[n].dtype != torch.float32 else out[n],
                                                tensors[n].view(torch.uint8) if tensors[n].dtype != torch.float32
                                                else tensors[n]) for n in same)
    assert main(["verify-checkpoint", str(contract), str(dst), "--source", str(src), "--full"]) == 0
