"""The rollout checkpoint's tensors of every operator: names, dtypes and shapes, as SGLang's loaders
read them. A derived fact of the Plan, computed once (`Plan.rollout_tensors`): `pcc convert` writes
it, `pcc verify-checkpoint` checks against it, the runtime installs it, and every byte count
(explain, the converter plan, diff) sums it, so they cannot disagree.

Layouts: fp8_block / fp8_tensor / mxfp8 (`weight` + `weight_scale[_inv]`), nvfp4 (ModelOpt:
packed `weight`, `weight_scale`, `weight_scale_2`, `input_scale`), int4 (compressed-tensors
pack-quantized), mxfp4 (gpt-oss fused experts), wide (as the source). An operator whose scheme
has no layout gets None; the targets report that (PCC608, PCC307, PCC205, PCC206).

An NVFP4 operator the engines fuse with others into one GEMM also names its `scale_group`: the
members that must share one `weight_scale_2` and `input_scale` (`FUSED_PROJECTIONS`).
"""

from __future__ import annotations

import math
from functools import lru_cache

from pcc.contract.scheme import Scheme

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "uint8": 1, "int8": 1,
               "int32": 4, "int64": 8}
# Source dtype (the catalog's) -> the dtype of that tensor kept wide, and of its BF16 bridge. A weight a
# quantized source stores as codes + scales (block FP8 `fp8_e4m3`; `nvfp4`, `mxfp4`, `int4` from the
# converter's reading of such sources, pcc.convert.quantized) has no wide dtype of its own: kept wide it is
# written as the BF16 rounding of its dequantized value, and a BF16 bridge moves it as BF16.
SOURCE_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8_e4m3": "bfloat16",
                 "nvfp4": "bfloat16", "mxfp4": "bfloat16", "int4": "bfloat16"}


def layout_of(spec: Scheme) -> str | None:
    """The checkpoint layout of one rollout weight scheme; None when SGLang reads none."""
    f, w = spec.format, spec.weights
    if spec.wide:
        return "wide"
    if f == "fp8_e4m3" and w is not None and w.kind in ("block", "tensor"):
        return "fp8_" + w.kind
    if f in ("mxfp8", "mxfp4", "nvfp4"):
        return f
    if f == "int4" and w is not None and w.kind == "group":
        return "int4"
    return None


# Projections SGLang and vLLM load into one fused linear, by module name under a common prefix: qkv_proj
# (QKVParallelLinear), DeepSeek MLA's fused_qkv_a_proj_with_mqa, gate_up_proj (MergedColumnParallelLinear,
# dense and shared experts) and a routed expert's w13 (HF gate/up and Mixtral's w1/w3). A fused NVFP4 linear
# has ONE global scale: the linear loaders take the max of the members' weight_scale_2 and input_scale
# without requantizing the block scales, the MoE loaders keep w13's first (gate's) weight_scale_2
# ("w1_weight_scale_2 must match w3_weight_scale_2"), so members must share it, as ModelOpt's export
# makes them (`preprocess_linear_fusion`: one amax, the max over linears that read the same input).
FUSED_PROJECTIONS = (("q_proj", "k_proj", "v_proj"), ("q_a_proj", "kv_a_proj_with_mqa"),
                     ("gate_proj", "up_proj"), ("w1", "w3"))
_FUSED_WITH = {m: group for group in FUSED_PROJECTIONS for m in group}


def scale_group(plan, i: int) -> tuple[str, ...] | None:
    """Source tensors of the NVFP4 operators fused with operator i (itself included, catalog order) that
    share one global scale; None when it is fused with no other NVFP4 operator."""
    name = plan.catalog.operators[i].tensor
    prefix, _, rest = name.rpartition(".")[0].rpartition(".")
    group = _FUSED_WITH.get(rest) if name.endswith(".weight") else None
    if group is None:
        return None
    index = plan.index
    members = [m for m in (f"{prefix}.{part}.weight" for part in group)
               if m in index and layout_of(plan.scheme("rollout", index[m])) == "nvfp4"]
    return tuple(sorted(members, key=index.__getitem__)) if len(members) > 1 else None


@lru_cache(maxsize=4096)
def _t(dtype: str, shape: tuple) -> dict:
    """A target's {dtype, shape}; shared between tensors of the same shape, so read-only."""
    return {"dtype": dtype, "shape": list(shape)}


def nbytes(t: dict) -> int:
    return DTYPE_BYTES[t["dtype"]] * math.prod(t["shape"])


def tensor_targets(plan, i: int) -> dict | None:
    """{"targets": {name: {dtype, shape}}, "layout": ..., "fuse": ...?} for operator i; None when
    its rollout scheme has no checkpoint layout for this tensor."""
    op = plan.catalog.operators[i]
    spec = plan.scheme("rollout", i)
    layout = layout_of(spec)
    if layout == "mxfp4":
        return _mxfp4_targets(plan, i)
    if layout is None or layout != "wide" and len(op.shape) != 2:
        return None
    if layout == "wide" and _fused_wide_experts(plan.catalog, op):
        return _wide_fused_targets(plan, i)
    prefix = op.tensor[: -len(".weight")] if op.tensor.endswith(".weight") else op.tensor
    g = spec.weights
    key = (layout, g.rows, g.cols, g.size, spec.symmetric) if g is not None else (layout, None, None, None, True)
    targets = {(op.tensor if suffix is None else prefix + suffix): t
               for suffix, t in _template(*key, tuple(op.shape), op.dtype)}
    out = {"layout": layout, "targets": targets}
    group = scale_group(plan, i) if layout == "nvfp4" else None
    if group is not None:
        out["scale_group"] = list(group)
    return out


@lru_cache(maxsize=None)
def _template(layout: str, rows, cols, size, symmetric: bool, shape: tuple, dtype: str) -> tuple:
    """(suffix after the module name or None for the tensor's own name, {dtype, shape}) per target.
    The dicts are shared by every tensor of the same layout and shape: read-only."""
    return tuple((suffix, _t(dt, sh)) for suffix, dt, sh in _layout(layout, rows, cols, size, symmetric, shape, dtype))


def _layout(layout: str, rows, cols, size, symmetric: bool, shape: tuple, dtype: str) -> tuple:
    if layout == "wide":
        return ((None, SOURCE_DTYPES.get(dtype, dtype), shape),)
    n, k = shape
    if layout == "fp8_block":
        r, c = rows, cols
        return ((None, "float8_e4m3fn", shape), (".weight_scale_inv", "float32", (-(-n // r), -(-k // c))))
    if layout == "fp8_tensor":
        return ((None, "float8_e4m3fn", shape), (".weight_scale", "float32", ()))
    if layout == "mxfp8":
        return ((None, "float8_e4m3fn", shape), (".weight_scale_inv", "uint8", (n, -(-k // 32))))
    if layout == "nvfp4":
        return ((None, "uint8", (n, -(-k // 2))), (".weight_scale", "float8_e4m3fn", (n, -(-k // 16))),
                (".weight_scale_2", "float32", ()), (".input_scale", "float32", ()))
    g = size  # int4, compressed-tensors pack-quantized
    out = ((".weight_packed", "int32", (n, -(-k // 8))), (".weight_scale", "float32", (n, -(-k // g))),
           (".weight_shape", "int64", (2,)))
    if not symmetric:
        out += ((".weight_zero_point", "int32", (-(-n // 8), -(-k // g))),)
    return out


def _mxfp4_targets(plan, i: int) -> dict | None:
    """gpt-oss layout: each MoE layer's routed experts fused into `experts.{gate_up,down}_proj_{blocks,scales}`,
    [E, rows, K/32, 16] uint8 (two E2M1 per byte) and [E, rows, K/32] E8M0; gate and up rows interleaved
    (gate row r at 2r, up row r at 2r+1), as gpt-oss's SwiGLU reads them."""
    cat = plan.catalog
    op = cat.operators[i]
    if not op.family.startswith("experts.") or len(op.shape) != 2 or op.shape[1] % 32:
        return None  # SGLang's mxfp4 layout holds routed experts whose K divides into blocks of 32
    n, k = op.shape
    base = op.tensor.split(".experts.")[0] + ".experts."
    kind = op.tensor.rsplit(".", 2)[-2]  # gate_proj | up_proj | down_proj | w1 | w3 | w2
    fused = "gate_up_proj" if kind in ("gate_proj", "up_proj", "w1", "w3") else "down_proj"
    rows = 2 * n if fused == "gate_up_proj" else n
    e = cat.num_experts
    parity = {"gate_proj": "even", "w1": "even", "up_proj": "odd", "w3": "odd"}.get(kind, "all")
    return {"layout": "mxfp4", "targets": _fused_targets(base + fused, e, rows, k),
            "fuse": _fuse(op.expert, parity, e * (2 if fused == "gate_up_proj" else 1))}


@lru_cache(maxsize=None)
def _fused_targets(prefix: str, e: int, rows: int, k: int) -> dict:
    """One MoE layer's fused mxfp4 tensors; shared by all its experts' entries, so read-only."""
    return {prefix + "_blocks": _t("uint8", (e, rows, k // 32, 16)), prefix + "_scales": _t("uint8", (e, rows, k // 32))}


@lru_cache(maxsize=None)
def _fuse(expert: int, rows: str, parts: int) -> dict:
    return {"expert": expert, "rows": rows, "parts": parts}


def own_bytes(t: dict) -> int:
    """Bytes one operator contributes to its targets (a fused target counts its share)."""
    parts = t.get("fuse", {}).get("parts", 1)
    return sum(nbytes(x) for x in t["targets"].values()) // parts


def sync_size(plan, i: int) -> int:
    """Bytes operator i moves in a full-weight sync: the source dtype over a BF16 bridge (and for
    wide operators), else its packed rollout tensors."""
    op, t = plan.catalog.operators[i], plan.rollout_tensors[i]
    if plan.contract.sync.bridge == "bf16" or t is None or t["layout"] == "wide":
        return nbytes(_t(SOURCE_DTYPES.get(op.dtype, op.dtype), tuple(op.shape)))
    return own_bytes(t)


def _fused_wide_experts(cat, op) -> bool:
    """gpt-oss routed experts kept wide: transformers' `GptOssForCausalLM` (and the engines' BF16 gpt-oss
    loaders) read them fused, `experts.gate_up_proj` [E, H, 2I] and `experts.down_proj` [E, I, H]."""
    from pcc.models.base import lm_config

    return (lm_config(cat.config).get("model_type") == "gpt_oss" and op.family.startswith("experts.")
            and op.expert is not None and len(op.shape) == 2)


def _wide_fused_targets(plan, i: int) -> dict:
    """gpt-oss BF16 layout as transformers saves it: input-major (x @ W) fused tensors, expert j's gate
    the even columns of `gate_up_proj[j]`, up the odd, down `down_proj[j]`, each its weight transposed
    (`fuse["transposed"]`, placed by pcc.layout.tensors.place_fused)."""
    cat = plan.catalog
    op = cat.operators[i]
    n, k = op.shape
    base = op.tensor.split(".experts.")[0] + ".experts."
    kind = op.tensor.rsplit(".", 2)[-2]
    gate_up = kind in ("gate_proj", "up_proj", "w1", "w3")
    e = cat.num_experts
    dtype = SOURCE_DTYPES.get(op.dtype, op.dtype)
    shape = (e, k, 2 * n) if gate_up else (e, k, n)
    parity = {"gate_proj": "even", "w1": "even", "up_proj": "odd", "w3": "odd"}.get(kind, "all")
    fuse = dict(_fuse(op.expert, parity, e * (2 if gate_up else 1)), transposed=True)
    return {"layout": "wide", "targets": {base + ("gate_up_proj" if gate_up else "down_proj"): _t(dtype, shape)},
            "fuse": fuse}
