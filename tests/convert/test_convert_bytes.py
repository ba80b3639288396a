"""The converter's output bytes are the ones pcc wrote before it was made faster (issue 29): each case converts
a checkpoint generated from a fixed seed with a version-stable generator (numpy's PCG64, rounded to BF16 here,
not torch.randn) and compares the SHA-256 of every written safetensors file with the digests the code of main
at d336179 wrote for the same input (`python tests/convert/test_convert_bytes.py` prints them). Cases: every
rollout format of the converter tests; block FP8 with small pieces (weights quantized in row pieces, tensors
written as stored in pieces) and with BF16, FP16 and FP32 sources; FP8 tensor scaling and NVFP4 in pieces (an
amax pass first); the block FP8 source converted to NVFP4 (a quantized source dequantized and requantized).
A digest that changes because the plan changed on purpose (a new tensor, another layout) is regenerated with
that command; one that changes because the converter did is a bug."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from convert_helpers import FORMATS, config_for  # noqa: E402

from pcc.models.builtin import catalog_from_config  # noqa: E402

# case -> (format of convert_helpers.FORMATS or a rollout rule, source dtype, piece bytes or None[, shard bytes])
CASES = {
    "fp8_block": ("fp8_block", "bf16", None),
    "int4": ("linear : int4_g32\n    keep bf16 : embed, lm_head, router, norm", "bf16", None),
    "mxfp8": ("mxfp8", "bf16", None),
    "nvfp4": ("nvfp4", "bf16", None),
    "mxfp4": ("mxfp4", "bf16", None),
    "fp8_block pieces": ("fp8_block", "bf16", 4096),
    "fp8_block shards": ("fp8_block", "bf16", 65536, 2_000_000),
    "fp8_block fp16": ("fp8_block", "fp16", None),
    "fp8_block fp32": ("fp8_block", "fp32", 4096),
    "fp8_tensor pieces": ("linear : fp8_tensor\n    keep bf16 : embed, lm_head, router, norm", "bf16", 4096),
    "nvfp4 pieces": ("linear : nvfp4\n    keep bf16 : embed, lm_head, router, norm", "bf16", 4096),
    "fp8_block source -> nvfp4": ("linear : nvfp4\n    keep bf16 : embed, lm_head, router, norm", "fp8_block", None),
}
# widened so block FP8 has partial 128-blocks and several row pieces (tiny_moe: hidden 128, experts 64)
WIDEN = dict(hidden_size=384, moe_intermediate_size=320, num_attention_heads=12)

# the digest of the *.safetensors files written (`convert_case`), as main at d336179 wrote them
EXPECTED = {
    'fp8_block': '3209c1e0957f5bcde253404f9f488071c0455e934b6879bcb82ece3cd3cd825f',
    'int4': 'a228ca8b64f3b8203c43697dd21030aacb764fd9a9e017ebe71ba3102c6e07c3',
    'mxfp8': 'ac1c3e3ae308545c79bb3c9d74a5b210d06dd441554cd3b05a920552354834e7',
    'nvfp4': 'b7b70a0956ec568e3f55ce9ad46fedb39043c4308183e1d21219c2c3d1b466a4',
    'mxfp4': '69d826a7e27821d1ef99646aad1d1c8598a2b33a93962d140f67d3b7b0ebe958',
    'fp8_block pieces': '3209c1e0957f5bcde253404f9f488071c0455e934b6879bcb82ece3cd3cd825f',
    'fp8_block shards': '6be3639e8cd5ae8a36c08e33c07f4f493ebce92aa6cc2bd530ae320fc56feccd',
    'fp8_block fp16': '6c2c6fa2e7cd1b4163de0036fd37efcaf13865be795fe960652acdc8fd3cb919',
    'fp8_block fp32': 'da7b0aafe73bb308073f51272bc1d406e33f9dde8918ab8fdea2705b4faab549',
    'fp8_tensor pieces': 'c846435a69368a02b6b372e8a16512240078f45d725bb2412647bc06ecf9a7cd',
    'nvfp4 pieces': '90a1b9064b536db3d8b4e6ca35cc993d740d6c50df6e0ec591df24d5f625e758',
    'fp8_block source -> nvfp4': '7d2e79674a392630d18cb2d577dfbf3ed56ad372f90d815efd76bc997fecdb4f',
}


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bit patterns, rounded to nearest even (x is finite)."""
    b = x.astype(np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def _header_file(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    """A safetensors file written by hand (no torch): names in order, 8-byte aligned header."""
    header, offset = {}, 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for _, _, data in tensors.values():
            f.write(data)


def make_source(directory: Path, dtype: str, seed: int = 29) -> None:
    """tiny_moe (WIDEN) in two shards, weights N(0, (0.02 (1 + k % 7))^2) with a few exact zeros, signed zeros and
    subnormals, from numpy's PCG64: the same bytes on every platform and version."""
    directory.mkdir(parents=True, exist_ok=True)
    config = config_for("tiny_moe", **WIDEN)
    catalog = catalog_from_config("tiny_moe", config)
    rng = np.random.Generator(np.random.PCG64(seed))
    tensors = {}
    for k, op in enumerate(o for o in catalog.operators if o.family != "kv_cache"):
        x = (rng.standard_normal(op.shape, dtype=np.float32) * np.float32(0.02 * (1 + k % 7))).reshape(-1)
        x[:: 97] = 0.0
        x[1:: 389] = -0.0
        x[2:: 1013] = np.float32(1e-40)  # float32 subnormal (BF16 and FP16: rounds to their own or to zero)
        if dtype == "bf16":
            tensors[op.tensor] = ("BF16", list(op.shape), _bf16_bits(x).tobytes())
        elif dtype == "fp16":
            tensors[op.tensor] = ("F16", list(op.shape), x.astype(np.float16).tobytes())
        else:
            tensors[op.tensor] = ("F32", list(op.shape), x.tobytes())
    names = list(tensors)
    half = len(names) // 2
    weight_map = {}
    for s, part in enumerate((names[:half], names[half:])):
        file = f"model-{s + 1:05d}-of-00002.safetensors"
        _header_file(directory / file, {n: tensors[n] for n in part})
        weight_map.update({n: file for n in part})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps(config, indent=2))


def _contract(directory: Path, case: str, rule: str) -> Path:
    model, hw, rules = FORMATS.get(rule, ("tiny_moe", "H100" if "int4" in rule or "fp8" in rule else "B200", rule))
    text = (f"contract bytes-{len(case)} {{\n  model {model}\n  hardware {hw}\n"
            f"  rollout sglang {{\n    {rules}\n  }}\n"
            "  trainer megatron {\n    gemm : bf16\n    optimizer adam\n  }\n  trainable all\n"
            "  sync full_weights { schedule colocated bridge bf16 activation atomic }\n"
            "  routing replay rollout\n}\n")
    path = directory / "contract.prec"
    path.write_text(text, encoding="utf-8")
    return path


def convert_case(case: str, root: Path) -> str:
    """Convert `case` under `root`: the SHA-256 over every written safetensors file's name and SHA-256."""
    import pcc.convert.run as run

    rule, dtype, piece, *shard = CASES[case]
    src = root / "src"
    if dtype == "fp8_block":  # a block-FP8 source: the BF16 one converted by pcc itself
        make_source(root / "bf16", "bf16")
        run.convert(str(_contract(root / "bf16", case, "fp8_block")), str(root / "bf16"), str(src), calibrate=False)
    else:
        make_source(src, dtype)
    keep = run.PIECE_BYTES
    run.PIECE_BYTES = piece or keep
    try:
        run.convert(str(_contract(root, case, rule)), str(src), str(root / "out"), calibrate=False,
                    **({"max_shard_bytes": shard[0]} if shard else {}))
    finally:
        run.PIECE_BYTES = keep
    files = sorted((root / "out").glob("*.safetensors"))
    return hashlib.sha256("".join(f"{f.name} {hashlib.sha256(f.read_bytes()).hexdigest()}\n"
                                  for f in files).encode()).hexdigest()


@pytest.mark.parametrize("case", list(CASES))
def test_converted_bytes_are_the_ones_pcc_wrote_before(case, tmp_path):
    assert convert_case(case, tmp_path) == EXPECTED[case]


if __name__ == "__main__":  # print EXPECTED for this tree's converter
    import tempfile

    print("EXPECTED = {")
    for c in CASES:
        with tempfile.TemporaryDirectory() as d:
            print(f"    {c!r}: {convert_case(c, Path(d))!r},")
    print("}")
