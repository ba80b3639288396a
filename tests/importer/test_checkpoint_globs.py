"""ModelOpt exclusion globs matched against a large MoE's module paths (pcc/importer/checkpoint.py): each pattern
meets only the paths starting with its literal head, and what that narrowing keeps is exactly what a full scan
with the same regex finds."""

from __future__ import annotations

import pytest

from pcc.importer.checkpoint import _literal_head, _Paths
from pcc.importer.matching import uncataloged as _uncataloged
from pcc.importer.matching import _modelopt_regex
from pcc.models import load_catalog


@pytest.mark.parametrize("entry, head", [
    ("model.layers.7.self_attn*", "model.layers.7.self_attn"),
    ("*.mlp.shared_expert.*", ""),
    ("model.layers.1?.mlp*", "model.layers."),  # '?' makes its '1' optional
    ("model.layers.1+", "model.layers."),
    ("model.layers.1{2}", "model.layers."),
    ("model.layers.[0-3].mlp", "model.layers."),
    ("lm_head|model.layers.0*", ""),  # an alternation may match elsewhere
    ("lm_head", "lm_head"),
])
def test_the_literal_head_is_what_every_match_starts_with(entry, head):
    assert _literal_head(entry) == head


@pytest.mark.parametrize("entry", ["model.layers.1*", "model.layers.1?.mlp.experts*", "*experts.1?.up_proj",
                                   "model.layers.[0-2].self_attn*", "lm_head|model.layers.0.mlp*", "model.norm",
                                   "model.layers.0.mlp.experts.(3|4).*", "nothing*"])
def test_candidates_lose_no_match_of_a_full_scan(entry):
    paths = _Paths(load_catalog("tiny_moe_128"))
    rx = _modelopt_regex(entry)
    full = {a for a in paths.ancestors if rx.fullmatch(a)}
    assert {a for a in paths.candidates(entry) if rx.fullmatch(a)} == full
    assert paths.glob_match(entry) == bool(full)


def test_only_a_config_with_a_vision_tower_or_mtp_layer_excuses_their_entries():
    qwen3_5 = load_catalog("qwen3_5_35b_a3b").config
    plain = load_catalog("qwen3_30b_a3b").config
    assert _uncataloged("model.visual*", qwen3_5) and _uncataloged("mtp*", qwen3_5)
    assert _uncataloged("mtp.layers.0*", qwen3_5)
    assert not _uncataloged("model.visual*", plain) and not _uncataloged("mtp*", plain)
    assert not _uncataloged("model.visualizer*", qwen3_5) and not _uncataloged("model.layers.0*", qwen3_5)
