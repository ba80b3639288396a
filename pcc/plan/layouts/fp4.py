"""FP4 E2M1 layouts: MXFP4 (gpt-oss's fused experts) and NVFP4 (ModelOpt)."""

from __future__ import annotations

from functools import lru_cache

from pcc.plan.layouts import Layout, entry, fuse_of, packed_codes, parity, register

# ModelOpt NVFP4 needs a static activation scale, which weights alone do not give: this 1.0 is a
# placeholder that `pcc convert` replaces with the source's or a calibrated scale (pcc.convert.calibration)
# and otherwise counts as uncalibrated; the runtime's sync replaces it with its calibration.
NVFP4_INPUT_SCALE = 1.0


@register("mxfp4")
class Mxfp4(Layout):
    """gpt-oss layout (SGLang's mxfp4.py `Mxfp4Config`, routed experts only): each MoE layer's experts
    fused into `experts.{gate_up,down}_proj_{blocks,scales}`, [E, rows, K/32, 16] uint8 (two E2M1 per
    byte) and [E, rows, K/32] E8M0; gate and up rows interleaved (gate row r at 2r, up row r at 2r+1),
    as gpt-oss's SwiGLU reads them."""

    packs = True
    every_moe_layer = True
    e8m0_scales = True
    element = (2**-2, 0.5, 6.0)

    def accepts(self, spec):
        return spec.format == "mxfp4"

    def targets(self, plan, i):
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
        return {"layout": self.name, "targets": _fused_targets(base + fused, e, rows, k),
                "fuse": fuse_of(op.expert, parity(kind), e * (2 if fused == "gate_up_proj" else 1))}

    def encode(self, q, targets, shape, rows):
        from pcc.numerics.packing import pack_e2m1x2

        n, k = shape
        return [packed_codes(q, pack_e2m1x2).reshape(n, k // 32, 16), q.scales.reshape(n, k // 32)]

    def decode(self, t, shape, scheme):
        import torch

        from pcc.numerics import Quantized
        from pcc.numerics.packing import unpack_e2m1x2

        n, k = shape
        codes = t[0].reshape(n, k // 2)
        codes = codes if scheme.packing else unpack_e2m1x2(codes, k)
        return Quantized(codes, t[1], torch.Size(shape), scheme, "weight")

    def _copies(self, enc, spec):
        return spec.weights.size == enc.block[1]

    def stored(self, enc, parts):
        import torch

        n, k = enc.shape
        return [parts["weight"].reshape(n, k // 32, 16), parts["scale"].view(torch.uint8).reshape(n, k // 32)]

    def quantization_config(self, spec, skip, kv):
        return {"quant_method": "mxfp4", "modules_to_not_convert": skip}


@lru_cache(maxsize=None)
def _fused_targets(prefix: str, e: int, rows: int, k: int) -> dict:
    """One MoE layer's fused mxfp4 tensors; shared by all its experts' entries, so read-only."""
    return {prefix + "_blocks": entry("uint8", (e, rows, k // 32, 16)),
            prefix + "_scales": entry("uint8", (e, rows, k // 32))}


@register("nvfp4")
class Nvfp4(Layout):
    """ModelOpt NVFP4 (SGLang's modelopt_quant.py `ModelOptFp4Config`): packed E2M1 `weight`, E4M3
    `weight_scale` per 16, `weight_scale_2` = 1 / the global encode scale, static `input_scale`."""

    packs = True
    global_scale = True
    shares_fused_scale = True
    piece_kinds = ("block", "group", "row")
    element = (2**-2, 0.5, 6.0)
    input_range = 6.0 * 448.0  # ModelOpt's NVFP4 input scale: amax / (6 * 448)
    modelopt_algo = "NVFP4"

    def accepts(self, spec):
        return spec.format == "nvfp4"

    def mixed_member(self, spec):
        return "nvfp4" if spec.activations is not None else "nvfp4_w4a16"

    def tensors(self, w, symmetric, shape, dtype):
        n, k = shape
        return ((None, "uint8", (n, -(-k // 2))), (".weight_scale", "float8_e4m3fn", (n, -(-k // 16))),
                (".weight_scale_2", "float32", ()), (".input_scale", "float32", ()))

    def encode(self, q, targets, shape, rows):
        import torch

        from pcc.numerics.packing import pack_e2m1x2

        scale_2 = (torch.ones((), dtype=torch.float32) / q.outer_scale.float()).reshape(())
        return [packed_codes(q, pack_e2m1x2), q.scales, scale_2, torch.full((), NVFP4_INPUT_SCALE, dtype=torch.float32)]

    def decode(self, t, shape, scheme):
        import torch

        from pcc.numerics import Quantized
        from pcc.numerics.packing import unpack_e2m1x2

        codes = t[0] if scheme.packing else unpack_e2m1x2(t[0], shape[1])
        return Quantized(codes, t[1], torch.Size(shape), scheme, "weight", outer_scale=(1.0 / t[2].float()).reshape(()))

    def _copies(self, enc, spec):
        return spec.weights.size == enc.block[1]

    def stored(self, enc, parts):
        import torch

        one = torch.ones((), dtype=torch.float32)  # the placeholder; the carried or calibrated scale replaces it
        return [parts.get("weight"), parts["scale"], parts["scale_2"], parts.get("input_scale", one)]

    def quantization_config(self, spec, skip, kv):
        # The flat config.json form: SGLang reads exclusions from `ignore`; `exclude_modules` is the same
        # list under the name of ModelOpt's hf_quant_config.json. vLLM's ModelOptQuantConfigBase.from_config
        # reads the flat form's KV cache only from `kv_cache_scheme` (SGLang from it, else `kv_cache_quant_algo`).
        cfg = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
               "kv_cache_quant_algo": kv, "ignore": skip, "exclude_modules": skip}
        if kv:
            cfg["kv_cache_scheme"] = {"type": "float", "num_bits": 8 if kv == "FP8" else 4, "dynamic": False}
        return cfg

    def hf_quant_config(self, skip, kv):
        return {"producer": {"name": "pcc"},
                "quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": kv,
                                 "exclude_modules": skip}}


@register("nvfp4_w4a16")
class Nvfp4W4A16(Nvfp4):
    """NVFP4 weights under BF16 activations, as a MIXED_PRECISION member (`W4A16_NVFP4`): ModelOpt's layout
    without the `input_scale` (vLLM's `resolve` builds no activation parameter for it, modelopt.py; a genuine
    export has none). Chosen by the Plan only inside a mixed checkpoint (`accepts` is False)."""

    input_range = None
    modelopt_algo = "W4A16_NVFP4"

    def accepts(self, spec):
        return False

    def copies(self, enc, spec):
        return enc.kind == "nvfp4" and spec.weights is not None and self._copies(enc, spec)

    def tensors(self, w, symmetric, shape, dtype):
        return super().tensors(w, symmetric, shape, dtype)[:3]

    def encode(self, q, targets, shape, rows):
        return super().encode(q, targets, shape, rows)[:3]

    def stored(self, enc, parts):
        return super().stored(enc, parts)[:3]
