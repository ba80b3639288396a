"""Qwen3.5/3.6 MoE as Qwen publishes it: each layer's routed experts fused output-major, `mlp.experts.gate_up_proj`
[E, 2 x inter, hidden] (gate rows first) and `mlp.experts.down_proj` [E, hidden, inter], no `.weight` (the layout of
transformers 5's own Qwen3_5MoeExperts module, which loads it as it is). `pcc convert` reads each expert's gate, up
and down as its own operator, as both engines load them, and writes the rollout checkpoint per expert
(`mlp.experts.J.{gate,up,down}_proj.weight` with `weight_scale_inv`; kept wide, the same names in BF16): the names
SGLang's `FusedMoE.make_expert_params_mapping` (compiled from the installed source) maps onto its w13/w2 parameters,
scales included, where its fused-checkpoint mapping (models/qwen3_5.py) carries no scale.

Checked against independent references: a random-weight transformers model of a shrunk Qwen3.5-35B-A3B config,
saved once as its module state (fused) and once with `save_pretrained` (transformers converts back to per-expert
tensors): both convert to the same bytes, and each converted expert dequantizes to the transformers module's own
`gate_up_proj[j][:I]`, `[I:]` and `down_proj[j]` within the format's rounding."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from pcc.cli import main  # noqa: E402
from pcc.models import CatalogError, catalog_from_checkpoint  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "pcc" / "models" / "configs"
TEXT = dict(hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128, vocab_size=256,
            num_hidden_layers=2, pad_token_id=0, bos_token_id=1, eos_token_id=2, moe_intermediate_size=128,
            shared_expert_intermediate_size=128, num_experts=4, num_experts_per_tok=2, linear_num_key_heads=2,
            linear_num_value_heads=2, linear_key_head_dim=64, linear_value_head_dim=64,
            layer_types=["linear_attention", "full_attention"])
VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 256,
          "patch_size": 4, "num_position_embeddings": 16}


def _model(form: str):
    config = json.loads((CONFIGS / "qwen3_5_35b_a3b.json").read_text(encoding="utf-8"))
    text = {k: v for k, v in {**config["text_config"], **TEXT}.items() if k != "model_type"}
    torch.manual_seed(0)
    if form == "text":
        model = transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(**text))
    else:
        vision = {**{k: v for k, v in config["vision_config"].items() if k != "model_type"}, **VISION}
        top = {k: v for k, v in config.items() if k not in ("model_type", "text_config", "vision_config", "_source")}
        model = transformers.AutoModelForImageTextToText.from_config(
            transformers.Qwen3_5MoeConfig(**top, text_config=text, vision_config=vision))
    return model.to(torch.bfloat16).eval()


def _save_fused(model, d: Path) -> Path:
    """The published layout: the module's own state (fused experts), in two shards with an index."""
    model.save_pretrained(str(d))  # config.json (and the per-expert tensors, replaced below)
    for f in [*d.glob("*.safetensors"), *d.glob("*.index.json")]:
        f.unlink()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    names = sorted(state)
    files = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for f, keys in files.items():
        save_file({k: state[k] for k in keys}, str(d / f), metadata={"format": "pt"})
    weight_map = {k: f for f, keys in files.items() for k in keys}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


def _tensors(d: Path) -> dict:
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            out.update({n: h.get_tensor(n) for n in h.keys()})
    return out


def _convert(tmp: Path, src: Path, rules: str, tag: str, capsys) -> Path:
    contract = tmp / f"{src.name}-{tag}.prec"
    contract.write_text(f'contract c {{\n  model from "{src}"\n  hardware B200\n  rollout sglang {{\n{rules}  }}\n}}\n',
                        encoding="utf-8")
    dst = tmp / f"{src.name}-{tag}-rollout"
    assert main(["convert", str(contract), "--source", str(src), "-o", str(dst), "--json"]) == 0, capsys.readouterr()
    capsys.readouterr()
    return dst


def _fp8(w, s):
    n, k = w.shape
    return w.float() * s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]


def _nvfp4(packed, scale, scale_2):
    """ModelOpt NVFP4 decoded from its definition: e2m1 codes (low nibble first) x e4m3 group scale x global."""
    lut = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    b = packed.view(torch.uint8).long()
    codes = torch.stack([b & 15, b >> 4], -1).reshape(b.shape[0], -1)
    return lut[codes] * scale.float().repeat_interleave(16, 1) * scale_2.float()


def _sglang_expert_mapping():
    """SGLang's `FusedMoE.make_expert_params_mapping` (layers/moe/fused_moe_triton/layer.py), compiled from the
    installed source: the package imports GPU kernels."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "srt/layers/moe/fused_moe_triton/layer.py"
    cls = next(n for n in ast.parse(path.read_text()).body if getattr(n, "name", None) == "FusedMoE")
    fn = next(n for n in cls.body if getattr(n, "name", None) == "make_expert_params_mapping")
    fn.decorator_list = []
    ns = {"List": list, "Tuple": tuple}
    exec(compile(ast.fix_missing_locations(ast.Module([fn], [])), str(path), "exec"), ns)
    return ns["make_expert_params_mapping"]


LAYER = {"text": "model.layers.", "vl": "model.language_model.layers."}


@pytest.mark.parametrize("form", ["text", "vl"])
@torch.no_grad()
def test_fused_experts_convert_like_per_expert_and_dequantize_to_the_module(form, tmp_path, capsys):
    model = _model(form)
    fused = _save_fused(model, tmp_path / "fused")
    per_expert = tmp_path / "per-expert"
    model.save_pretrained(str(per_expert))
    lm = LAYER[form]
    stored = _tensors(fused)
    assert stored[f"{lm}0.mlp.experts.gate_up_proj"].shape == (4, 256, 256)
    assert f"{lm}0.mlp.experts.0.gate_proj.weight" in _tensors(per_expert)  # transformers' save converts back

    # The catalog from shards: per-expert operators, as config-only and as the per-expert checkpoint.
    ops = {op.tensor: op for op in catalog_from_checkpoint(fused).operators}
    assert ops[f"{lm}1.mlp.experts.3.up_proj.weight"].shape == (128, 256)
    assert ops[f"{lm}1.mlp.experts.3.down_proj.weight"].shape == (256, 128)
    assert ops[f"{lm}1.mlp.experts.3.gate_proj.weight"].family == "experts.gate_up"
    assert ({(o.tensor, o.shape, o.family) for o in catalog_from_checkpoint(per_expert).operators}
            == {(o.tensor, o.shape, o.family) for o in ops.values()})

    converted = {}
    for scheme, rules in (("fp8_block", "    linear : fp8_block\n    keep bf16 : experts[1]\n"),
                          ("nvfp4", "    experts : nvfp4\n")):
        out = _tensors(_convert(tmp_path, fused, rules, scheme, capsys))
        ref = _tensors(_convert(tmp_path, per_expert, rules, scheme, capsys))
        assert sorted(out) == sorted(ref)
        for n in ref:  # the same bytes from either layout
            assert out[n].dtype == ref[n].dtype and torch.equal(out[n].reshape(-1).view(torch.uint8), ref[n].reshape(-1).view(torch.uint8)), n
        assert not [n for n in out if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
        converted[scheme] = out

    mlp = [layer.mlp.experts for layer in (model.model.layers if form == "text" else model.model.language_model.layers)]
    inter = 128
    for li, experts in enumerate(mlp):
        for j in range(4):
            base = f"{lm}{li}.mlp.experts.{j}."
            want = {"gate_proj": experts.gate_up_proj[j][:inter], "up_proj": experts.gate_up_proj[j][inter:],
                    "down_proj": experts.down_proj[j]}
            for proj, w in want.items():
                w, n = w.float(), base + proj + ".weight"
                out = converted["fp8_block"]
                if li == 1:  # kept wide: the module's values, bit for bit
                    assert out[n].dtype == torch.bfloat16 and torch.equal(out[n].float(), w), n
                else:  # block FP8: e4m3 keeps 3 mantissa bits (half a step: 1/16 of the value), subnormals
                    # step 2^-9 of the block's scale
                    assert out[n].dtype == torch.float8_e4m3fn and out[n].shape == w.shape, n
                    s = out[n + "_scale_inv"]
                    err = (_fp8(out[n], s) - w).abs()
                    assert (err <= w.abs() / 16 + _fp8(torch.ones_like(w), s) * 2.0 ** -10).all(), n
                out = converted["nvfp4"]
                assert out[n].dtype == torch.uint8 and out[n].shape == (w.shape[0], w.shape[1] // 2), n
                got = _nvfp4(out[n], out[n + "_scale"], out[n + "_scale_2"])
                # e2m1's largest step is 2 (between 4 and 6): half of it is 1/6 of a group's largest value, plus
                # the e4m3 rounding of the group scale (1/16)
                assert (got - w).abs().max() <= 0.25 * w.abs().max(), n
                assert (got - w).abs().mean() < 0.1 * w.abs().mean(), n
    out = converted["fp8_block"]
    q = f"{lm}1.self_attn.q_proj.weight"  # attention too: block FP8 within its rounding of the source
    assert (_fp8(out[q], out[q.replace("weight", "weight_scale_inv")]) - stored[q].float()).abs().max() \
        <= 0.07 * stored[q].float().abs().max()

    mapping = _sglang_expert_mapping()
    if mapping is not None:  # every expert tensor written is one SGLang loads into its w13 / w2 parameters
        table = mapping(None, "gate_proj", "down_proj", "up_proj", 4)  # (cls, ...)
        for n in [*converted["fp8_block"], *converted["nvfp4"]]:
            if ".mlp.experts." not in n:
                continue
            hits = [(p, e, s) for p, w, e, s in table if w in n]
            assert len(hits) == 1, n
            param, expert, _ = hits[0]
            assert n.split(".mlp.experts.")[1].startswith(f"{expert}.")
            assert param + n.rsplit(".", 1)[1] in {f"experts.w{g}_{s}" for g in (13, 2) for s in (
                "weight", "weight_scale_inv", "weight_scale", "weight_scale_2", "input_scale")}, n


def test_fused_experts_of_the_wrong_shape_are_refused(tmp_path):
    """A fused experts tensor whose shape is not [E, 2 x inter, hidden] by config.json (an input-major one, as
    gpt-oss stores them) is PCC208 naming both shapes, never read as the wrong experts."""
    config = {"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text", **TEXT}
    d = tmp_path / "bad"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    e = "model.layers.0.mlp.experts."
    save_file({e + "gate_up_proj": torch.zeros(4, 256, 256, dtype=torch.bfloat16),
               e + "down_proj": torch.zeros(4, 128, 256, dtype=torch.bfloat16)}, str(d / "model.safetensors"))
    with pytest.raises(CatalogError, match=r"down_proj: BF16 \[4, 128, 256\].*output-major.*\[4, 256, 128\]") as err:
        catalog_from_checkpoint(d)
    assert err.value.code == "PCC208"


def test_row_pieces_of_a_fused_expert_are_its_rows(tmp_path):
    """The converter streams a large requantized weight in row pieces (`read_rows`): a piece of an output-major fused
    expert (gate, up or down) reads only its rows, the same values as those rows of the whole expert as read."""
    from pcc.convert.quantized import read, read_rows
    from pcc.convert.source import open_source

    config = {"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
              **dict(TEXT, num_hidden_layers=1, layer_types=["linear_attention"])}
    d = tmp_path / "src"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    e = "model.layers.0.mlp.experts."
    gate_up = torch.randn(4, 256, 256).to(torch.bfloat16)
    down = torch.randn(4, 256, 128).to(torch.bfloat16)
    save_file({e + "gate_up_proj": gate_up, e + "down_proj": down}, str(d / "model.safetensors"))
    src = open_source(d)
    want = {"gate_proj": gate_up[:, :128], "up_proj": gate_up[:, 128:], "down_proj": down}
    for proj, full in want.items():
        for j in (0, 3):
            enc = src.view.encodings[f"{e}{j}.{proj}.weight"]
            whole = read(src, enc).dequantize()
            assert torch.equal(whole, full[j].float())
            n = enc.shape[0]
            for r0, r1 in ((0, 40), (40, n - 8), (n - 8, n)):
                assert torch.equal(read_rows(src, enc, r0, r1).dequantize(), whole[r0:r1]), (proj, j, r0)


def test_row_pieces_of_an_input_major_fused_expert(tmp_path):
    """gpt-oss's input-major layout ([E, H, 2I], gate columns even): a row piece is those rows of the transpose."""
    from pcc.convert.quantized import read, read_rows
    from pcc.convert.source import open_source

    d = tmp_path / "src"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "gpt_oss", "num_hidden_layers": 1, "hidden_size": 64,
                                               "intermediate_size": 32, "num_local_experts": 2}))
    e = "model.layers.0.mlp.experts."
    gate_up, down = torch.randn(2, 64, 64).to(torch.bfloat16), torch.randn(2, 32, 64).to(torch.bfloat16)
    save_file({e + "gate_up_proj": gate_up, e + "down_proj": down}, str(d / "model.safetensors"))
    src = open_source(d)
    want = {"gate_proj": gate_up[:, :, 0::2], "up_proj": gate_up[:, :, 1::2], "down_proj": down}
    for proj, full in want.items():
        enc = src.view.encodings[f"{e}1.{proj}.weight"]
        whole = read(src, enc).dequantize()
        assert torch.equal(whole, full[1].T.float())
        assert torch.equal(read_rows(src, enc, 8, 24).dequantize(), whole[8:24]), proj
