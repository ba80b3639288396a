"""The wide layout: the source's own values, in its wide dtype."""

from __future__ import annotations

from pcc.plan.layouts import SOURCE_DTYPES, Layout, entry, fuse_of, parity, register


@register("wide")
class Wide(Layout):
    """The source's values in its wide dtype; gpt-oss's routed experts fused as transformers saves them."""

    quantized = False

    def accepts(self, spec):
        return spec.wide

    def targets(self, plan, i):
        op = plan.catalog.operators[i]
        return self._fused(plan, i) if _fused_wide_experts(plan.catalog, op) else self._own(plan, i)

    def tensors(self, w, symmetric, shape, dtype):
        return ((None, SOURCE_DTYPES.get(dtype, dtype), shape),)

    def _fused(self, plan, i: int) -> dict:
        """gpt-oss BF16 layout: input-major (x @ W) fused tensors, expert j's gate the even columns of
        `gate_up_proj[j]`, up the odd, down `down_proj[j]`, each its weight transposed (`fuse["transposed"]`,
        placed by pcc.plan.encode.place_fused)."""
        cat = plan.catalog
        op = cat.operators[i]
        n, k = op.shape
        base = op.tensor.split(".experts.")[0] + ".experts."
        kind = op.tensor.rsplit(".", 2)[-2]
        gate_up = kind in ("gate_proj", "up_proj", "w1", "w3")
        e = cat.num_experts
        shape = (e, k, 2 * n) if gate_up else (e, k, n)
        fuse = dict(fuse_of(op.expert, parity(kind), e * (2 if gate_up else 1)), transposed=True)
        name = base + ("gate_up_proj" if gate_up else "down_proj")
        target = entry(SOURCE_DTYPES.get(op.dtype, op.dtype), shape)
        return {"layout": self.name, "targets": {name: target}, "fuse": fuse}

    def decode(self, t, shape, scheme):
        return t[0].float()

    def quantization_config(self, spec, skip, kv):
        return None


def _fused_wide_experts(cat, op) -> bool:
    """gpt-oss routed experts kept wide: transformers' `GptOssForCausalLM` (and the engines' BF16 gpt-oss
    loaders) read them fused, `experts.gate_up_proj` [E, H, 2I] and `experts.down_proj` [E, I, H]."""
    from pcc.models.base import lm_config

    return (lm_config(cat.config).get("model_type") == "gpt_oss" and op.family.startswith("experts.")
            and op.expert is not None and len(op.shape) == 2)
