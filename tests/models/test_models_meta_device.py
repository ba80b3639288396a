"""Issue 30's dense catalogs against transformers' own model of the same config, full size, on the meta device.

transformers builds each model from the catalog's config (pcc/models/configs/<name>.json, `_source` aside) with
`torch.device("meta")`: no memory, every parameter at its real shape. Its parameters (a tied lm_head is the
embedding's, counted once) must be exactly the catalog's operators and extra tensors, name for name, and every
operator's shape the parameter's. The MoE catalogs' checkpoint names are not transformers 5's in-memory ones (it fuses
the experts and converts on load and save), so those are checked where transformers writes a checkpoint:
tests/models/test_models_transformers_names.py (Qwen3-MoE, the qwen3_235b_a22b type).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcc.models import load_catalog

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIGS = Path(__file__).resolve().parents[2] / "pcc" / "models" / "configs"
DENSE = ("llama3_2_1b", "qwen2_5_14b", "qwen2_5_1_5b", "qwen2_5_32b", "qwen2_5_72b", "qwen3_0_6b", "qwen3_1_7b")


@pytest.mark.parametrize("name", DENSE)
def test_catalog_is_transformers_model_of_its_config(name):
    config = json.loads((CONFIGS / f"{name}.json").read_text(encoding="utf-8"))
    config.pop("_source")
    hf = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf)
    params = {n: tuple(p.shape) for n, p in model.named_parameters()}  # tied lm_head: once, as the embedding
    catalog = load_catalog(name)
    ops = {op.tensor: tuple(op.shape) for op in catalog.operators if op.family != "kv_cache"}
    assert set(params) == set(ops) | set(catalog.extra_tensors)
    assert {n: params[n] for n in ops} == ops
    assert ("lm_head.weight" in ops) == (not config["tie_word_embeddings"])
