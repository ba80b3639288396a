"""The kernels' object code cache (pcc.fused `_cache_read`): a second process loads the code the first compiled
(its entry is not rewritten) without LLVM (`pcc.objcode`) and gets the same bytes, which are ml_dtypes' E4M3
rounding of x / (amax / 448); a damaged or another key's entry is never loaded: the kernel is compiled again and
the entry rewritten whole."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from pcc import fused

pytestmark = pytest.mark.skipif(not fused.available(), reason="no llvmlite, or PCC_FUSED=0")

ROWS, COLS, BLOCK = 256, 384, 128
linux_x86 = sys.platform == "linux" and os.uname().machine == "x86_64"
# in a fresh process: quantize the BF16 bits given on stdin, print the codes', scales' and magnitude's results
CHILD = """
import ctypes, json, sys
from pcc import fused
x = bytearray(sys.stdin.buffer.read())
codes, scales = bytearray(%(n)d), bytearray(4 * %(nb)d)
at = lambda b: ctypes.addressof((ctypes.c_char * len(b)).from_buffer(b))
bad = fused.fp8_fp32_blocks("bf16", at(x), at(codes), at(scales), %(rows)d, %(cols)d, %(block)d, %(block)d, 0, %(nbr)d)
mag = fused.magnitude_max(16, at(x), %(n)d)
print(json.dumps({"bad": bad, "codes": codes.hex(), "scales": scales.hex(), "mag": mag,
                  "llvm": "llvmlite.binding" in sys.modules}))
""" % {"n": ROWS * COLS, "nb": (ROWS // BLOCK) * (COLS // BLOCK), "rows": ROWS, "cols": COLS, "block": BLOCK,
       "nbr": ROWS // BLOCK}


def _weights() -> np.ndarray:
    rng = np.random.default_rng(29)
    return (rng.standard_normal((ROWS, COLS)) * rng.uniform(0.01, 4, (ROWS, 1))).astype(ml_dtypes.bfloat16)


def _child(cache: Path, x: np.ndarray, llvm: bool | None = None) -> dict:
    """The child's results; `llvm`: whether it must have loaded LLVM (None: either)."""
    env = os.environ | {"PCC_CACHE": str(cache), "PYTHONPATH": str(Path(fused.__file__).parents[1])}
    got = subprocess.run([sys.executable, "-c", CHILD], input=x.tobytes(), capture_output=True, env=env, check=True)
    out = json.loads(got.stdout)
    loaded = out.pop("llvm")
    assert llvm is None or loaded == llvm
    return out


def _reference(x: np.ndarray) -> dict:
    """Block FP8 by ml_dtypes: each 128x128 block's scale amax / 448 in float32, codes x / scale rounded to E4M3."""
    w = x.astype(np.float32)
    blocks = w.reshape(ROWS // BLOCK, BLOCK, COLS // BLOCK, BLOCK)
    scales = (np.abs(blocks).max(axis=(1, 3)) / np.float32(448)).astype(np.float32)
    codes = (blocks / scales[:, None, :, None]).astype(ml_dtypes.float8_e4m3fn).reshape(ROWS, COLS)
    mag = int((x.view(np.uint16) & 0x7FFF).max())
    return {"bad": -1, "codes": codes.view(np.uint8).tobytes().hex(), "scales": scales.tobytes().hex(), "mag": mag}


def _entries(cache: Path) -> dict[str, tuple[int, bytes]]:
    return {p.name: (p.stat().st_ino, p.read_bytes()) for p in (cache / "kernels").glob("*.o")}


def test_second_process_loads_the_cached_code(tmp_path):
    x = _weights()
    first = _child(tmp_path, x, llvm=True)
    assert first == _reference(x)
    entries = _entries(tmp_path)
    assert len(entries) == 2  # the bf16 kernel and the magnitude kernels
    for name, (_, data) in entries.items():  # named by its key, holding key and the object's SHA-256
        head = len(fused._CACHE_MAGIC) + 64
        assert data.startswith(fused._CACHE_MAGIC) and data[len(fused._CACHE_MAGIC):][:32].hex() == name[:-2]
        assert data[head - 32:head] == hashlib.sha256(data[head:]).digest()
    assert _child(tmp_path, x, llvm=not linux_x86) == first  # (elsewhere LLVM loads the cached code)
    assert _entries(tmp_path) == entries  # loaded, not compiled again: no entry was replaced


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "swap"])
def test_a_damaged_entry_is_compiled_again(tmp_path, damage):
    x = _weights()
    first = _child(tmp_path, x)
    entries = _entries(tmp_path)
    (a, (_, data_a)), (b, (_, data_b)) = sorted(entries.items())
    path = tmp_path / "kernels" / a
    if damage == "flip":  # one bit of the object code
        path.write_bytes(data_a[:-100] + bytes([data_a[-100] ^ 1]) + data_a[-99:])
    elif damage == "truncate":
        path.write_bytes(data_a[:-1])
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # another key's whole, valid entry under this name
        path.write_bytes(data_b)
    assert _child(tmp_path, x, llvm=True) == first
    again = _entries(tmp_path)
    assert again[a][1] == data_a and again[a][0] != entries[a][0]  # rewritten whole, through a rename
    assert again[b] == entries[b]


def test_an_unwritable_cache_is_no_error(tmp_path):
    x = _weights()
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    assert _child(blocked, x) == _reference(x)
