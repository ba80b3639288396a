"""Issue 30's dense catalogs against transformers' own model of the same config, full size, on the meta device.

transformers builds each model from the catalog's config (pcc/models/configs/<name>.json, `_source` aside) with
`torch.device("meta")`: no memory, every parameter at its real shape. Its parameters (a tied lm_head is the
embedding's, counted once) must be exactly the catalog's operators and extra tensors, name for name, and every
operator's shape the parameter's. transformers 5 holds a MoE model's experts fused (one 3-D gate_up_proj per layer) and
converts on load and save; for the MoE catalogs its parameters are first mapped back to checkpoint names and shapes by
its own save-time conversion (`revert_weight_conversion`, what `save_pretrained` writes).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcc.models import load_catalog

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIGS = Path(__file__).resolve().parents[2] / "pcc" / "models" / "configs"
MOE = ("moonlight_16b_a3b", "qwen3_235b_a22b")
DENSE = ("llama3_2_1b", "qwen2_5_14b", "qwen2_5_1_5b", "qwen2_5_32b", "qwen2_5_72b", "qwen3_0_6b", "qwen3_1_7b")


@pytest.mark.parametrize("name", DENSE + MOE)
def test_catalog_is_transformers_model_of_its_config(name):
    config = json.loads((CONFIGS / f"{name}.json").read_text(encoding="utf-8"))
    config.pop("_source")
    hf = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf)
    params = dict(model.named_parameters())  # tied lm_head: once, as the embedding
    if name in MOE:
        from transformers.core_model_loading import revert_weight_conversion

        persistent = model.state_dict()
        params.update((n, b) for n, b in model.named_buffers() if n in persistent)  # e_score_correction_bias
        fused = len(params)
        params = revert_weight_conversion(model, params)
        assert len(params) > fused  # the experts came apart
    params = {n: tuple(p.shape) for n, p in params.items()}
    catalog = load_catalog(name)
    ops = {op.tensor: tuple(op.shape) for op in catalog.operators if op.family != "kv_cache"}
    assert set(params) == set(ops) | set(catalog.extra_tensors)
    assert {n: params[n] for n in ops} == ops
    assert ("lm_head.weight" in ops) == (not config["tie_word_embeddings"])
