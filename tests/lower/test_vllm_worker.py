"""pcc's vLLM worker extension (pcc/lower/vllm_worker.py), the parts that run without vLLM: the manifest check
against files and manifests as pcc's sync and HTTP client write them, the read-back of a weight through a
GEMM that holds it (torch's own BF16 linear as the kernel), and the tensor encoding the client decodes.
The rest runs inside vLLM's worker: tests/validate/test_validate_vllm_live.py."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from pcc.lower import vllm_worker as W
from pcc.runtime.sync import manifest
from pcc.validate.vllm_http import _tensor


def _version(tmp_path, tensors, prefix="", man=None):
    save_file({prefix + k: v for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "pcc_manifest.json").write_text(json.dumps(man or manifest(3, "full_weights", tensors)))
    return str(tmp_path)


@pytest.fixture
def tensors():
    g = torch.Generator().manual_seed(0)
    return {"model.layers.0.mlp.down_proj.weight": torch.randn(8, 16, generator=g).to(torch.bfloat16),
            "model.norm.weight": torch.randn(16, generator=g)}


def test_a_whole_version_passes_and_loads_the_bytes_it_checked(tmp_path, tensors):
    got, why = W._checked(_version(tmp_path, tensors))
    assert why == "" and set(got) == set(tensors)
    assert all(torch.equal(got[k], v) for k, v in tensors.items())


@pytest.mark.parametrize("fault,words", [("missing", "missing"), ("damaged", "sha256"), ("extra", "not in the manifest"),
                                         ("dtype", "the manifest says")])
def test_a_partial_or_damaged_version_is_refused(tmp_path, tensors, fault, words):
    man = manifest(3, "full_weights", tensors)
    bad = dict(tensors)
    name = "model.layers.0.mlp.down_proj.weight"
    if fault == "missing":
        del bad[name]
    elif fault == "damaged":
        bad[name] = bad[name].clone()
        bad[name].reshape(-1).view(torch.uint8)[0] ^= 0xFF
    elif fault == "extra":
        bad["lm_head.weight"] = torch.zeros(2, 2)
    else:
        bad[name] = bad[name].float()
    got, why = W._checked(_version(tmp_path, bad, man=man))
    assert got is None and words in why and "version 3" in why


def test_a_file_that_does_not_load_or_a_malformed_manifest_is_refused(tmp_path, tensors):
    d = _version(tmp_path, tensors)
    raw = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(raw[:20])
    got, why = W._checked(d)
    assert got is None and "does not load" in why
    (tmp_path / "model.safetensors").write_bytes(raw)
    (tmp_path / "pcc_manifest.json").write_text(json.dumps({"version": 3, "tensors": {"model.norm.weight": {"shape": [16]}}}))
    got, why = W._checked(d)
    assert got is None and "malformed pcc_manifest.json" in why


def test_an_adapter_is_checked_under_peft_names(tmp_path):
    lora = {"model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(8, 16, dtype=torch.bfloat16)}
    d = _version(tmp_path, lora, W.ADAPTER_PREFIX, manifest(1, "adapter", lora))
    assert W.PccWorkerExtension().pcc_check_adapter(d) == {"checked": 1}
    assert "refused" in W.PccWorkerExtension().pcc_check_adapter(str(tmp_path / "nowhere"))


def test_a_weight_is_read_back_exactly_through_the_gemm_that_holds_it():
    """As vLLM's CPU build leaves a linear: `weight` empty, the values inside the GEMM's closure."""
    w = torch.randn(40, 24).to(torch.bfloat16)
    layer = torch.nn.Module()
    layer.input_size_per_partition, layer.params_dtype = 24, torch.bfloat16
    layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, w, bias)
    got = W._through_kernel(layer, rows=7)  # rows not dividing K: the identity in several blocks
    assert got.dtype == torch.bfloat16 and torch.equal(got, w)


def test_the_client_decodes_what_the_extension_encodes():
    t = torch.randn(3, 5).to(torch.bfloat16)
    assert torch.equal(_tensor(W._encode(t)), t)
    bad = {**W._encode(t), "shape": [3, 4]}
    with pytest.raises(ValueError, match="bytes for a bfloat16"):
        _tensor(bad)
    with pytest.raises(ValueError, match="not a torch dtype"):
        _tensor({**W._encode(t), "dtype": "Tensor"})


def test_int8_codes_are_recovered_exactly_from_a_kernel_within_a_few_ulps():
    """A W8A8 layer as vLLM's CPU build leaves it (`weight` None, codes inside the GEMM): its output on the
    identity, code x scale off by a few FP32 ulps as oneDNN's per-token scale and epilogue round, gives back
    codes x scale exactly."""
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(-127, 128, (24, 40), generator=g).to(torch.int8)
    scale = torch.rand(24, 1, generator=g) * 0.01 + 1e-3
    layer = torch.nn.Module()
    layer.input_size_per_partition, layer.weight_scale = 40, scale

    class Method:
        def apply(self, module, x):
            out = x @ (codes.float() * scale).t()
            return out * (1 + 4e-7 * (torch.rand(out.shape, generator=g) - 0.5))  # a few ulps either way

    layer.quant_method = Method()
    got = W._int8_through_kernel(layer, rows=16)
    assert torch.equal(got, codes.float() * scale)


def _sgl_pack(codes: torch.Tensor, block: int = 32) -> torch.Tensor:
    """torch.ops._C.convert_weight_packed on int8 (vLLM's csrc/cpu/sgl-kernels/gemm.cpp pack_vnni<int8_t>), which
    vLLM's CPU build does not put where these tests run: per block of 32 channels, the codes as [K/4, 32, 4], then
    each channel's s8s8 compensation 128 x sum(codes) as int32 (checked byte for byte against vLLM's op on an AMX
    CPU)."""
    n, k = codes.shape
    vnni = codes.reshape(n // block, block, k // 4, 4).permute(0, 2, 1, 3).reshape(n // block, block * k)
    comp = (codes.to(torch.int32) * 128).reshape(n // block, block, k).sum(-1, dtype=torch.int32)
    return torch.cat([vnni, comp.contiguous().view(torch.int8)], 1).reshape(n, k + 4)


def test_int8_codes_packed_for_the_amx_kernel_are_read_back_exactly_and_only_as_held():
    """A W8A8 layer as vLLM's CPU build leaves it on an AMX CPU (`weight` the SGL kernel's packed codes): read back
    as codes x scale exactly; codes that differ from the checkpoint's read back as they are held, so the readback
    still sees them; a packing that its codes do not reproduce (a damaged compensation) is not read at all."""
    g = torch.Generator().manual_seed(2)
    codes = torch.randint(-128, 128, (64, 40), generator=g).to(torch.int8)
    scale = torch.rand(64, 1, generator=g) * 0.01 + 1e-3
    layer = torch.nn.Module()
    layer.input_size_per_partition, layer.weight_scale = 40, scale
    assert torch.equal(W._int8_unpacked(layer, _sgl_pack(codes), _sgl_pack), codes.float() * scale)
    other = codes.clone()
    other[37, 5] += 1
    got = W._int8_unpacked(layer, _sgl_pack(other), _sgl_pack)
    assert torch.equal(got, other.float() * scale) and not torch.equal(got, codes.float() * scale)
    damaged = _sgl_pack(codes)
    damaged.reshape(2, -1)[0, -1] ^= 1  # the first block's last compensation byte, not a code
    assert W._int8_unpacked(layer, damaged, _sgl_pack) is None
    assert W._int8_unpacked(layer, codes, _sgl_pack) is None  # unpacked [N, K]: not this layout
