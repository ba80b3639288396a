"""The Catalog, and the one assembler both catalog paths feed.

Built-in catalogs and checkpoints differ only in where tensor names and
shapes come from; classification, shape checks, KV-cache operators and
ordering all happen here, once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from pcc.models.base import (FAMILIES, READS, WEIGHT_DTYPES, CatalogError, Operator, check_config, config_dtype,
                             lm_config)
from pcc.models.classify import Slot, classify, order_key
from pcc.models.shapes import formula_shape


@dataclass(frozen=True)
class Catalog:
    """A model's operators. Shared between callers (catalogs are cached), so
    treat ``config`` as read-only."""

    name: str
    architecture: str
    config: dict
    operators: tuple[Operator, ...]
    extra_tensors: tuple[str, ...]
    source: str | None = None
    # what a checkpoint's catalog was computed from, hashed (pcc.models.checkpoint.fingerprint); None for a
    # built-in or config-only catalog, and for a quantized checkpoint (its catalog reads tensor values too)
    fingerprint: str | None = None

    @property
    def num_layers(self) -> int:
        return lm_config(self.config)["num_hidden_layers"]

    @property
    def num_experts(self) -> int:
        c = lm_config(self.config)
        return c.get("n_routed_experts") or c.get("num_experts") or c.get("num_local_experts") or 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def hidden_size(self) -> int:
        return lm_config(self.config)["hidden_size"]

    @property
    def num_attention_heads(self) -> int:
        return lm_config(self.config)["num_attention_heads"]

    @property
    def num_key_value_heads(self) -> int:
        c = lm_config(self.config)
        return c.get("num_key_value_heads") or c["num_attention_heads"]

    @property
    def vocab_size(self) -> int:
        return lm_config(self.config)["vocab_size"]

    @property
    def tie_word_embeddings(self) -> bool:
        return bool(lm_config(self.config).get("tie_word_embeddings", False))

    def family_index(self) -> dict[str, tuple[int, ...]]:
        """Operator indices per family (every family present, maybe empty)."""
        return self._family_index

    @cached_property
    def _family_index(self) -> dict[str, tuple[int, ...]]:
        index: dict[str, list[int]] = {family: [] for family in FAMILIES}
        for i, op in enumerate(self.operators):
            index[op.family].append(i)
        return {family: tuple(indices) for family, indices in index.items()}


# A tensor as a source lists it: name, shape (None: take the config formula),
# dtype, and the file it was read from (for error messages; None if none).
Record = tuple[str, tuple[int, ...] | None, str, str | None]


def assemble(name: str, config: dict, records: Iterable[Record], extra_tensors: Iterable[str],
             source: str | None = None, check_shapes: bool = True, fingerprint: str | None = None) -> Catalog:
    """Build a Catalog from ``*.weight`` records and the non-weight tensors.

    With ``check_shapes`` a given shape that disagrees with the config
    formula is an error; a missing shape is always taken from the formula.
    """
    check_config(config, f"{source}/config.json" if source else f"the config of {name}")
    formulas: dict[str, tuple[int, ...] | None] = {}
    placed: list[tuple[tuple, Operator]] = []
    unshaped: list[str] = []
    for tensor, shape, dtype, where in records:
        slot = classify(tensor, config)
        if slot.kind not in formulas:
            formulas[slot.kind] = formula_shape(slot.kind, config)
        expected = formulas[slot.kind]
        if shape is None:
            if expected is None and slot.family in ("other", "vision", "norm"):
                # Only the index lists it and the config does not shape it (a vision tower, a
                # module pcc does not model): it is carried as a tensor the converter copies as
                # it is, not as an operator.
                unshaped.append(tensor)
                continue
            if expected is None:
                raise CatalogError(
                    f"{tensor}: no shape, since only the index lists it and config.json does "
                    f"not determine it; provide the safetensors shard files")
            shape = expected
        elif check_shapes and expected is not None and shape != expected:
            raise CatalogError(_disagreement(tensor, where, shape, expected, dtype),
                               code="PCC208" if _packed(shape, expected, dtype) else "PCC204")
        if dtype not in WEIGHT_DTYPES:
            raise CatalogError(f"{tensor} in {where}: stored as {dtype}, not a weight dtype: {READS}", code="PCC210")
        if slot.family == "vision" and len(shape) != 2:
            slot = slot._replace(family="other")  # a patch-embedding convolution, a position table: no GEMM
        placed.append((order_key(slot, tensor), Operator(tensor, slot.family, slot.layer,
                                                         slot.expert, shape, dtype)))
    placed.extend(_kv_caches(placed, config))
    placed.sort(key=lambda item: item[0])
    operators = tuple(op for _, op in placed)
    _check_layers(config, operators, source or name)
    extras = tuple(sorted([*extra_tensors, *unshaped], key=_natural))
    return Catalog(name=name, architecture=_architecture(operators), config=config,
                   operators=operators, extra_tensors=extras, source=source, fingerprint=fingerprint)


def _check_layers(config: dict, operators: tuple[Operator, ...], where: str) -> None:
    """The tensors hold every decoder layer config.json counts (layers past the count are MTP layers, as
    DeepSeek-V3's 61). A config that counts more (10**7 beside an index of 4 layers) describes another model,
    and everything sized by the count (the engines' launch flags, the runtime's model) would follow it (PCC209).
    A checkpoint whose tensor names pcc sees no layers in is not checked."""
    want = lm_config(config)["num_hidden_layers"]
    if not isinstance(want, int):  # null: no count to hold them to
        return
    have = {op.layer for op in operators if op.layer is not None and op.layer < want}
    if have and len(have) < want:
        gap = next(k for k in range(want) if k not in have)
        raise CatalogError(f"{where}: config.json says num_hidden_layers is {want}, but the checkpoint's tensors hold "
                           f"{len(have)} decoder layer(s), none of layer {gap}: config.json and the weights describe "
                           "different models", code="PCC209")


# Stored dtype -> (what packs into one element, how many codes per element) for packed quantized weights.
_PACKING = {"uint8": ("two E2M1 (FP4) codes per byte", 2), "int8": ("two INT4 codes per byte", 2),
            "int32": ("eight INT4 codes per int32", 8)}


def _packed(shape: tuple, expected: tuple, dtype: str) -> bool:
    """Does the stored shape look like `expected` with K packed (FP4 or INT4 codes) into its dtype?"""
    pack = _PACKING.get(dtype)
    return (pack is not None and len(shape) == len(expected) == 2 and shape[0] == expected[0]
            and -(-expected[1] // pack[1]) == shape[1])


def _disagreement(tensor: str, where, shape: tuple, expected: tuple, dtype: str) -> str:
    """The shape error; where packing explains the difference, it says so and what is missing."""
    head = (f"{tensor} in {where}: the safetensors header says shape {list(shape)}, "
            f"config.json implies {list(expected)}")
    if not _packed(shape, expected, dtype):
        return head
    what, _ = _PACKING[dtype]
    return (f"{head}: the weight is stored packed ({dtype}, {what}), but pcc found no scales that make it a "
            f"quantized weight it reads (NVFP4: weight_scale F8_E4M3 + weight_scale_2 and a modelopt "
            f"quantization_config or hf_quant_config.json; INT4: compressed-tensors weight_packed + weight_scale "
            f"+ weight_shape); add the checkpoint's quantization files or use its BF16 release")


def _kv_caches(placed: list[tuple[tuple, Operator]], config: dict) -> list[tuple[tuple, Operator]]:
    """One pseudo operator per attention layer, its per-token shape read off the
    projection that produces the cache: (2, k_proj out) for MHA/GQA, and
    (kv_a_proj_with_mqa out,) = (kv_lora_rank + qk_rope_head_dim,) for MLA."""
    caches = []
    dtype = config_dtype(config)
    for _, op in placed:
        if op.family != "attn.kv":
            continue
        if op.tensor.endswith(".k_proj.weight"):
            shape = (2, op.shape[0])
        elif op.tensor.endswith(".kv_a_proj_with_mqa.weight"):
            shape = (op.shape[0],)
        else:
            continue
        tensor = op.tensor.rsplit(".", 2)[0] + ".kv_cache"
        slot = Slot("kv_cache", op.layer, None, "self_attn.kv_cache")
        caches.append((order_key(slot, tensor), Operator(tensor, "kv_cache", op.layer, None,
                                                         shape, dtype)))
    return caches


def _architecture(operators: tuple[Operator, ...]) -> str:
    """Read off the operators, so unknown model types get one too."""
    families = {op.family for op in operators}
    if any(op.family == "attn.kv" and op.tensor.endswith(".kv_a_proj_with_mqa.weight")
           for op in operators):
        return "mla_moe"
    return "moe" if "experts.gate_up" in families else "dense"


def _natural(tensor: str) -> tuple:
    """Sort key that puts layer 2 before layer 10; the name decides between names it reads alike (`x.01` and
    `x.1`), so the order is the names', never the headers' (a kept converter plan is taken for another
    checkpoint of the same names)."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", tensor)), tensor
