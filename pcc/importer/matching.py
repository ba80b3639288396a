"""Which of a model's operators a checkpoint's quantization config quantizes, by each tool's own rule.

pcc decides per operator with its own precedence (keep beats patterns, the later rule wins); a
checkpoint's config is decided by the code that loads it, and those rules differ. Each function
here is one tool's rule, reproduced from its source (docs/import.md cites the files):

* `sglang_skipped`: SGLang's `is_layer_skipped` (layers/quantization/utils.py), used by
  `Fp8Config` for `modules_to_not_convert`/`ignored_layers` and by ModelOpt for Linear layers:
  dotted-path boundary matching, fused modules decided by their shards (which must agree), and
  a FusedMoE layer skipped when any expert-naming entry contains its prefix.
* `modelopt_excluded`: SGLang's `ModelOptQuantConfig.is_layer_excluded` (layers/quantization/
  modelopt_quant.py): `*` is `.*`, `.` literal, full match against the whole prefix or any one
  dotted part, plus the MLA fused-projection substring rule; `modelopt_exclusions` is the list
  as `apply_weight_name_mapper` leaves it (each `language_model.` entry also without the prefix).
* `ct_*`: compressed-tensors' `match_name`/`match_targets`/`apply_quantization_config`
  (utils/match.py, quantization/lifecycle/apply.py): exact names, `re:` patterns by `re.match`
  (anchored at the start only), class names; ignore beats targets; among matching targets
  exact names first, then regexes, then classes, each group alphabetically.

Module names are the checkpoint's (tensor name without `.weight`). SGLang asks about its own
modules: `qkv_proj`, `gate_up_proj` and (MLA) `fused_qkv_a_proj_with_mqa` are fused from their
checkpoint shards, and a MoE layer's routed experts are one FusedMoE module `...mlp.experts`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from pcc.lang.diagnostics import PccError
from pcc.models import Catalog, Operator
from pcc.models.base import lm_config
from pcc.plan.tensors import FUSED_LINEARS

# SGLang fused module -> its checkpoint shards (utils.py _FALLBACK_FUSED_SHARDS, the DeepSeek model's
# packed_modules_mapping for MLA, and Qwen3.5's for its Gated DeltaNet layers: targets/sglang.yaml
# `gated_deltanet` `merged`): pcc.plan.tensors.FUSED_LINEARS, which the converter's NVFP4 scale groups read too.
_SHARD_OF = {shard: fused for fused, shards in FUSED_LINEARS.items() for shard in shards}
# Model types whose router is a custom gate module, not a torch Linear (DeepSeek's MoEGate,
# Glm4MoeTopkRouter): a compressed-tensors "Linear" target does not select it.
_CUSTOM_GATE_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe", "glm_moe_dsa"})


def module_name(op: Operator) -> str:
    """The checkpoint module that holds an operator's weight."""
    return op.tensor.removesuffix(".weight")


@dataclass(frozen=True)
class SglangModule:
    """The module SGLang builds for an operator: its prefix and the checkpoint shards it fuses."""

    prefix: str
    shards: tuple[str, ...]  # checkpoint module names; () when it is one module
    moe: bool = False  # a FusedMoE layer (all routed experts of one layer)


def sglang_module(op: Operator) -> SglangModule:
    name = module_name(op)
    if op.family.startswith("experts."):
        return SglangModule(name.split(".experts.")[0] + ".experts", (), moe=True)
    head, _, leaf = name.rpartition(".")
    fused = _SHARD_OF.get(leaf)
    if fused is None or (fused == "fused_qkv_a_proj_with_mqa" and not head.endswith("self_attn")):
        return SglangModule(name, ())
    if fused == "qkv_proj" and op.family not in ("attn.q", "attn.kv"):
        return SglangModule(name, ())
    return SglangModule(f"{head}.{fused}", tuple(f"{head}.{s}" for s in FUSED_LINEARS[fused]))


def module_path_match(ignored: str, prefix: str) -> bool:
    """SGLang `_module_path_match`: equal, a dotted prefix, or a dotted run inside the path."""
    ignored, prefix = ignored.rstrip("."), prefix.rstrip(".")
    return ignored == prefix or prefix.startswith(ignored + ".") or f".{ignored}." in f".{prefix}."


class FusedDisagreement(PccError, ValueError):
    """Some shards of a fused module are listed and others not: SGLang refuses to load it."""


def sglang_skipped(module: SglangModule, ignored: list[str]) -> bool:
    """SGLang `is_layer_skipped(prefix, ignored_layers)` for one module, with the shard rule."""
    if module.shards:
        verdicts = {any(module_path_match(e, s) for e in ignored) for s in module.shards}
        if len(verdicts) > 1:
            raise FusedDisagreement(f"{module.prefix}: some but not all of its shards ({', '.join(module.shards)}) "
                                    "are listed; SGLang refuses to load a fused layer of mixed precision")
        return verdicts.pop()
    skipped = any(module_path_match(e, module.prefix) for e in ignored)
    if module.moe:
        skipped = skipped or any(module.prefix in e for e in ignored if "experts" in e)
    return skipped


def normalized_fp8_ignores(entries: list[str]) -> list[str]:
    """`Fp8Config.from_config` keeps every entry with and without its "model." prefix."""
    out = []
    for e in entries:
        base = e.removeprefix("model.")
        out += [base, f"model.{base}"]
    return out


@lru_cache(maxsize=4096)
def _modelopt_regex(pattern: str) -> re.Pattern:
    return re.compile(pattern.replace(".", r"\.").replace("*", r".*"))


def modelopt_exclusions(entries: list[str]) -> list[str]:
    """SGLang `ModelOptQuantConfig.apply_weight_name_mapper` (modelopt_quant.py, called by
    model_loader/loader.py for models with an HF-to-SGLang name mapper, which the multimodal
    wrappers that export `language_model.` names have): each `language_model.` entry is kept and
    also added without the prefix, so it matches the text model's own `model.`/`lm_head` names."""
    out = []
    for e in entries:
        out.append(e)
        if e.startswith("language_model."):
            out.append(e.removeprefix("language_model."))
    return list(dict.fromkeys(out))


_MLA_FUSED_PARTS = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")


def modelopt_excluded(prefix: str, entries: list[str]) -> bool:
    """SGLang `ModelOptQuantConfig.is_layer_excluded(prefix)`."""
    variants = [prefix] + ([prefix.removeprefix("language_model.")] if prefix.startswith("language_model.") else [])
    for pattern in entries:
        rx = _modelopt_regex(pattern)
        for p in variants:
            if rx.fullmatch(p) or any(rx.fullmatch(part) for part in p.split(".")):
                return True
        tail = pattern.rsplit(".", 1)[-1]
        if tail in _MLA_FUSED_PARTS and any(tail in p.rsplit(".", 1)[-1] for p in variants):
            return True
    return False


# -- compressed-tensors ---------------------------------------------------------------------------

def ct_classes(op: Operator, catalog: Catalog) -> tuple[str, ...]:
    """The torch class names a compressed-tensors class target can match for this operator's
    module in the Hugging Face model ("Linear" for nn.Linear, "Embedding" for nn.Embedding).
    Unknown modules ("other") get none: only a name or regex target selects them."""
    fam = op.family
    if fam == "embed":
        return ("Embedding",)
    if fam == "router":
        mt = (catalog.config.get("text_config") or catalog.config).get("model_type")
        return () if mt in _CUSTOM_GATE_TYPES else ("Linear",)
    if fam in ("norm", "kv_cache", "other"):
        return ()
    return ("Linear",)


def ct_match_name(name: str, target: str) -> bool:
    """compressed-tensors `match_name` (no fused mapping: checkpoint names are not fused)."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name


def ct_matched_targets(name: str, classes: tuple[str, ...], targets: list[str]) -> list[str]:
    """compressed-tensors `match_targets`: name matches (exact before `re:`, each alphabetical),
    then class matches, in that order; the first one's scheme applies."""
    ordered = sorted(targets, key=lambda t: ("re:" in t, t))
    out = [t for t in ordered if ct_match_name(name, t)]
    out += [t for t in ordered if t in classes and t not in out]
    return out


# -- parts of a checkpoint no catalog lists -----------------------------------------------------------

_UNCATALOGED = re.compile(r"(?:model\.)?(?P<vision>visual|vision_tower|vision_model)(?:[.*]|$)|(?P<mtp>mtp)(?:[.*]|$)")


def uncataloged(entry: str, config: dict) -> bool:
    """The entry names the vision tower of a config with a vision_config, or the MTP layer(s) of a config with
    mtp_num_hidden_layers: parts of the checkpoint no catalog lists (pcc/models/builtin.py)."""
    m = _UNCATALOGED.match(entry)
    if m is None:
        return False
    if m.group("vision"):
        return isinstance(config.get("vision_config"), dict)
    return bool(lm_config(config).get("mtp_num_hidden_layers"))
