"""Static NVFP4 activation scales (ModelOpt calibration, SGLang's static input_scale) and the FP8 KV cache."""

from __future__ import annotations

import torch
from runtime_helpers import plan

from pcc.contract.scheme import preset
from pcc.numerics import quantize
from pcc.runtime.calibrate import NVFP4_RANGE, calibration_tokens, input_scales, quantize_static
from pcc.runtime.model import Arch, init_weights, forward
from pcc.runtime.rollout import RolloutEngine
from pcc.runtime.sync import manifest
from pcc.runtime.warmstart import _Plain
from pcc.runtime.weights import convert_full


def test_static_quantizer_is_the_dynamic_one_at_the_tensors_own_amax():
    s = preset("nvfp4")
    x = torch.randn(37, 72, generator=torch.Generator().manual_seed(0)) * 3
    dyn = quantize(x, s, "activation")
    st = quantize_static(x, s, (x.abs().max() / NVFP4_RANGE).reshape(()))
    assert torch.equal(dyn.codes, st.codes)
    assert torch.equal(dyn.scales.view(torch.uint8), st.scales.view(torch.uint8))
    # a smaller static scale saturates the largest elements at E2M1's 6 x block scale, as the kernel does
    clipped = quantize_static(x, s, (x.abs().max() / (4 * NVFP4_RANGE)).reshape(())).dequantize()
    assert float(clipped.abs().max()) < float(x.abs().max())


class _RouterInputs(_Plain):
    def __init__(self, w):
        super().__init__(w)
        self.seen = {}

    def linear(self, name, x):
        if name.endswith("mlp.gate.weight"):
            self.seen[name] = float(x.abs().max())
        return super().linear(name, x)


def test_every_expert_is_calibrated_on_every_token():
    p = plan("qwen38_nvfp4_lora")
    arch = Arch.from_catalog(p.catalog)
    w = init_weights(arch, 3)
    scales = input_scales(p, {k: v.to(torch.bfloat16) for k, v in w.items()})
    assert len(scales) == 3 * arch.experts * arch.layers  # gate, up, down of every expert
    rec = _RouterInputs({k: v.to(torch.bfloat16).float() for k, v in w.items()})
    forward(arch, rec, calibration_tokens())
    for i in range(arch.layers):  # each expert's gate_proj input is the whole layer's MLP input
        want = rec.seen[f"model.layers.{i}.mlp.gate.weight"] / NVFP4_RANGE
        got = {float(scales[f"model.layers.{i}.mlp.experts.{e}.gate_proj.input_scale"]) for e in range(arch.experts)}
        assert len(got) == 1 and abs(got.pop() / want - 1) < 1e-6


def _engine(name: str):
    p = plan(name)
    arch = Arch.from_catalog(p.catalog)
    w = {k: v.to(torch.bfloat16) for k, v in init_weights(arch, 1).items()}
    eng = RolloutEngine(arch, p)
    eng.activate(manifest(0, "full_weights", w, "bf16"), w)
    return eng


def _batch_gap(eng) -> float:
    """max |logp(row alone) - logp(row in a batch of 16)| for the same tokens."""
    toks = torch.randint(4, 14, (16, 11), generator=torch.Generator().manual_seed(2))
    full = eng.score(eng.active, toks, 6, 1.0)
    alone = torch.cat([eng.score(eng.active, toks[i:i + 1], 6, 1.0) for i in range(4)])
    return float((full[:4] - alone).abs().max())


def test_nvfp4_rollout_log_probs_do_not_depend_on_the_batch():
    eng = _engine("selective_nvfp4")
    assert eng.active.input_scales and all(float(s) != 1.0 for s in eng.active.input_scales.values())
    static = _batch_gap(eng)
    eng.active.input_scales = {}  # per-call scales, as before: the batch's amax sets every token's codes
    assert static < 1e-4 < _batch_gap(eng)


def test_converted_versions_carry_their_own_calibration():
    p = plan("selective_nvfp4")
    arch = Arch.from_catalog(p.catalog)
    a, b = (convert_full(p, {k: v.to(torch.bfloat16) for k, v in init_weights(arch, s).items()}) for s in (1, 2))
    names = [n for n in a if n.endswith(".input_scale")]
    assert names and any(not torch.equal(a[n], b[n]) for n in names)


def test_fp8_kv_cache_uses_sglangs_default_static_scale():
    eng = _engine("glm52_fp8_rollout")
    ex = eng._exec(eng.active)
    k = torch.tensor([[0.3, -2.7, 500.0, 1e-3]])
    kq, _ = ex.kv(0, k, k)
    want = k.clamp(-448, 448).to(torch.float8_e4m3fn).float()  # fp8(k / 1.0), saturating
    assert torch.equal(kq, want)
