"""gpt-oss in BF16 as transformers saves it (`GptOssForCausalLM.save_pretrained`): each MoE layer's experts fused
into `mlp.experts.gate_up_proj` [E, hidden, 2 x inter] (x @ W: gate columns even, up columns odd, as
`GptOssExperts.forward` splits `gate_up[..., ::2]`, `gate_up[..., 1::2]`) and `mlp.experts.down_proj`
[E, inter, hidden], with `_bias` tensors and no `.weight` suffix. pcc reads them as the per-expert operators of
the MXFP4 layout (`L.mlp.experts.j.{gate,up,down}_proj.weight` [N, K]), so `experts : mxfp4` selects them and
parameter and byte counts are those of the published MXFP4 checkpoint's config.

The model: openai/gpt-oss-20b's config.json (tests/models/published/openai--gpt-oss-20b.config.json) shrunk as
tests/models/test_models_published.py does, with intermediate 96 != hidden 64 so that a transposed expert
would have the wrong shape; built and saved (BF16, four shards) by transformers itself.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors import safe_open  # noqa: E402

from pcc.cli import main  # noqa: E402
from pcc.lower import compile_file  # noqa: E402
from pcc.models import catalog_from_checkpoint  # noqa: E402
from pcc.models.checkpoint import read_safetensors_header  # noqa: E402
from pcc.models.quantized import recognize  # noqa: E402
from model_helpers import partial_copies  # noqa: E402

PUBLISHED = json.loads((Path(__file__).parent / "published" / "openai--gpt-oss-20b.config.json").read_text())
TINY = dict(PUBLISHED, hidden_size=64, intermediate_size=96, head_dim=16, num_attention_heads=4, num_key_value_heads=2,
            num_local_experts=4, num_hidden_layers=2, vocab_size=128, layer_types=["sliding_attention", "full_attention"],
            pad_token_id=0, bos_token_id=1, eos_token_id=1)
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(transformers' shards + index, config-only copy, index-only copy, the model)."""
    kwargs = {k: v for k, v in TINY.items() if k not in ("quantization_config", "model_type", "architectures")}
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(transformers.GptOssConfig(**kwargs)).to(torch.bfloat16).eval()
    root = tmp_path_factory.mktemp("gpt-oss-bf16")
    shards = root / "shards"
    model.save_pretrained(str(shards), max_shard_size="100KB")
    assert (shards / INDEX).exists()
    copies = partial_copies(shards, root)
    return shards, copies, model


def _headers(directory: Path) -> dict:
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(read_safetensors_header(f))
    return out


def _view(catalog) -> tuple:
    return ([(op.tensor, op.family, op.shape, op.dtype) for op in catalog.operators], sorted(catalog.extra_tensors))


def test_transformers_names_are_the_fused_bf16_layout(saved):
    """What this reader is for: transformers writes the experts fused, without `.weight`."""
    shards, _, _ = saved
    h = _headers(shards)
    p = "model.layers.1.mlp.experts."
    assert h[p + "gate_up_proj"]["shape"] == [4, 64, 192] and h[p + "gate_up_proj"]["dtype"] == "BF16"
    assert h[p + "down_proj"]["shape"] == [4, 96, 64]
    assert h[p + "gate_up_proj_bias"]["shape"] == [4, 192] and h[p + "down_proj_bias"]["shape"] == [4, 64]
    assert not [n for n in h if ".experts." in n and n.endswith(".weight")]


def test_config_only_index_only_and_shards_agree(saved):
    shards, copies, _ = saved
    full = catalog_from_checkpoint(shards)
    assert _view(catalog_from_checkpoint(copies["index-only"])) == _view(full)
    assert _view(catalog_from_checkpoint(copies["config-only"])) == _view(full)
    by = {op.tensor: op for op in full.operators}
    gate, down = by["model.layers.1.mlp.experts.3.gate_proj.weight"], by["model.layers.1.mlp.experts.3.down_proj.weight"]
    assert (gate.family, gate.layer, gate.expert, gate.shape, gate.dtype) == ("experts.gate_up", 1, 3, (96, 64), "bf16")
    assert (down.family, down.shape, down.dtype) == ("experts.down", (64, 96), "bf16")
    fams = [op.family for op in full.operators]
    assert fams.count("experts.gate_up") == 2 * 4 * 2 and fams.count("experts.down") == 2 * 4
    assert not [t for t in full.extra_tensors if t.endswith(("gate_up_proj", "down_proj"))]
    assert {t.rsplit(".", 1)[-1] for t in full.extra_tensors} == {"bias", "sinks", "gate_up_proj_bias", "down_proj_bias"}
    assert "other" not in fams


def test_each_expert_is_the_matrix_transformers_multiplies_by(saved):
    """The view's per-expert weight, taken from the fused tensor as its encoding says (expert j, gate the even
    columns, up the odd, transposed), gives transformers' own gate/up/down products for expert j."""
    shards, _, model = saved
    h = _headers(shards)
    view = recognize(shards, json.loads((shards / "config.json").read_text()), h, None)
    experts = model.model.layers[0].mlp.experts
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
    for j in range(4):
        p = f"model.layers.0.mlp.experts.{j}."
        got = {}
        for proj in ("gate_proj", "up_proj", "down_proj"):
            enc = view.encodings[p + proj + ".weight"]
            fused = getattr(experts, enc.part("weight").rsplit(".", 1)[-1]).detach().float()[enc.expert]
            cols = {"even": fused[:, 0::2], "odd": fused[:, 1::2]}.get(enc.rows, fused)
            assert tuple(cols.T.shape) == enc.shape
            got[proj] = cols.T
        gate_up = x @ experts.gate_up_proj.detach().float()[j]
        assert torch.allclose(x @ got["gate_proj"].T, gate_up[:, ::2]) and torch.allclose(x @ got["up_proj"].T, gate_up[:, 1::2])
        y = torch.randn(5, 96, generator=torch.Generator().manual_seed(2))
        assert torch.allclose(y @ got["down_proj"].T, y @ experts.down_proj.detach().float()[j])


def _contract(tmp_path, directory, rule: str) -> Path:
    path = tmp_path / "c.prec"
    path.write_text(f'contract c {{\n  model from "{directory}"\n  hardware B200\n  rollout sglang {{\n    {rule}\n'
                    "  }\n  routing replay rollout\n}\n", encoding="utf-8")
    return path


def test_experts_mxfp4_selects_the_experts_and_counts_as_published(saved, tmp_path):
    """`experts : mxfp4` quantizes every expert and nothing else; parameters and rollout bytes are those of the
    config alone (which pcc catalogs as the published MXFP4 layout)."""
    shards, copies, _ = saved
    plans = {}
    for kind, directory in (("shards", shards), ("config-only", copies["config-only"])):
        compiled = compile_file(str(_contract(tmp_path, directory, "experts : mxfp4\n    keep bf16 : router")))
        assert compiled.ok, [d.render(compiled.sources) for d in compiled.diagnostics if d.is_error]
        plans[kind] = compiled.plan
    plan = plans["shards"]
    for i, op in enumerate(plan.catalog.operators):
        if op.family != "kv_cache":
            assert plan.scheme_name("rollout", i) == ("mxfp4" if op.family.startswith("experts.") else "bf16"), op.tensor
    assert (plan.params, plan.rollout_bytes) == (plans["config-only"].params, plans["config-only"].rollout_bytes)
    expert = 2 * 4 * (2 * 96 * 64 + 64 * 96)
    assert plan.params - expert == sum(math.prod(op.shape) for op in plan.catalog.operators
                                       if not op.family.startswith("experts.") and op.family != "kv_cache")
    target = plan.rollout_tensors[plan.index["model.layers.0.mlp.experts.2.up_proj.weight"]]
    assert target["targets"]["model.layers.0.mlp.experts.gate_up_proj_blocks"]["shape"] == [4, 192, 2, 16]


def test_check_and_explain_exit_zero(saved, tmp_path, capsys):
    shards, _, _ = saved
    path = _contract(tmp_path, shards, "experts : mxfp4")
    for command in ("check", "explain"):
        assert main([command, str(path)]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "experts" in out


def _tensors(directory) -> dict:
    out = {}
    for f in sorted(Path(directory).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            out.update({n: h.get_tensor(n) for n in h.keys()})
    return out


def _convert(shards: Path, rule: str, tmp_path: Path, capsys) -> tuple[Path, Path]:
    """`pcc convert` of the saved model with one rollout rule: (the contract, the rollout checkpoint)."""
    contract = tmp_path / "convert.prec"
    contract.write_text(f'contract c {{\n  model from "{shards}"\n  hardware B200\n  rollout sglang {{\n    {rule}\n'
                        "  }\n  trainer megatron {\n    gemm : bf16\n  }\n  routing replay rollout\n}\n", encoding="utf-8")
    dst = tmp_path / "rollout"
    code = main(["convert", str(contract), "--source", str(shards), "-o", str(dst), "--json"])
    assert code == 0, capsys.readouterr().out
    return contract, dst


def test_convert_experts_mxfp4_loads_in_transformers(saved, tmp_path, capsys):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    shards, _, model = saved
    _, dst = _convert(shards, "experts : mxfp4", tmp_path, capsys)
    written = _tensors(dst)
    state = {n: t.float() for n, t in written.items() if not n.endswith(("_blocks", "_scales"))}
    for layer in range(2):
        p = f"model.layers.{layer}.mlp.experts."
        for f in ("gate_up_proj", "down_proj"):
            state[p + f] = convert_moe_packed_tensors(written[p + f + "_blocks"], written[p + f + "_scales"],
                                                      dtype=torch.float32)
    config = json.loads((dst / "config.json").read_text())
    config.pop("quantization_config", None)
    loaded = transformers.GptOssForCausalLM(transformers.GptOssConfig(**config)).eval()
    loaded.load_state_dict(state, strict=True)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref, got = copy.deepcopy(model).float()(ids).logits, loaded(ids).logits
    assert (got - ref).abs().max() <= 0.1 * ref.abs().max()


def test_convert_experts_kept_bf16_loads_in_gpt_oss_for_causal_lm(saved, tmp_path, capsys):
    """Experts kept wide: the rollout checkpoint is transformers' own BF16 layout, every tensor the source's
    bytes, loaded by `from_pretrained` with nothing missing or unexpected and the same logits."""
    shards, _, _ = saved
    contract, dst = _convert(shards, "all : bf16", tmp_path, capsys)
    source, written = _tensors(shards), _tensors(dst)
    assert sorted(written) == sorted(source)
    for name, t in source.items():
        assert written[name].dtype == t.dtype and torch.equal(written[name], t), name
    for args in (["--source", str(shards), "--full"], []):  # verify-checkpoint reads the fused layout from the Plan
        assert main(["verify-checkpoint", str(contract), str(dst), "--json", *args]) == 0, capsys.readouterr().out
    capsys.readouterr()
    from pcc.runtime.weights import decode_operator

    plan = compile_file(str(contract)).plan
    by = {op.tensor: i for i, op in enumerate(plan.catalog.operators)}
    gate_up, down = source["model.layers.1.mlp.experts.gate_up_proj"], source["model.layers.1.mlp.experts.down_proj"]
    for name, want in (("gate_proj", gate_up[3][:, 0::2].T), ("up_proj", gate_up[3][:, 1::2].T), ("down_proj", down[3].T)):
        got = decode_operator(plan, by[f"model.layers.1.mlp.experts.3.{name}.weight"], written)  # this expert, [N, K]
        assert torch.equal(got, want.float()), name
    loaded, info = transformers.GptOssForCausalLM.from_pretrained(str(dst), dtype=torch.bfloat16,
                                                                  output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    ref = transformers.GptOssForCausalLM.from_pretrained(str(shards), dtype=torch.bfloat16).eval()  # loaded alike
    with torch.no_grad():
        assert torch.equal(loaded.eval()(ids).logits, ref(ids).logits)
