"""pcc.objcode: the object code MCJIT kept for pcc's kernels, loaded without LLVM, computes what ml_dtypes does;
an object it does not fully understand (another machine, a relocation or a symbol it does not take, a writable
section, a short file) is refused with ValueError, and pcc.fused then loads the entry through LLVM."""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from pcc import fused, objcode

pytestmark = [pytest.mark.skipif(not fused.available(), reason="no llvmlite, or PCC_FUSED=0"),
              pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64",
                                 reason="the loader takes x86-64 Linux objects")]

ROWS, COLS, BLOCK = 256, 384, 128


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> dict[str, bytes]:
    """The objects MCJIT wrote for the bf16 and magnitude kernels (a fresh cache, a child process), by kernel."""
    cache = tmp_path_factory.mktemp("cache")
    env = os.environ | {"PCC_CACHE": str(cache), "PYTHONPATH": str(Path(fused.__file__).parents[1])}
    subprocess.run([sys.executable, "-c", "from pcc import fused; fused.kernel('bf16'); fused.kernel('magnitude')"],
                   env=env, check=True)
    out = {}
    for path in (cache / "kernels").glob("*.o"):
        obj = path.read_bytes()[len(fused._CACHE_MAGIC) + 64:]
        out["bf16" if b"fp8_blocks_bf16" in obj else "magnitude"] = obj
    assert sorted(out) == ["bf16", "magnitude"]
    return out


def _weights() -> np.ndarray:
    rng = np.random.default_rng(7)
    return (rng.standard_normal((ROWS, COLS)) * rng.uniform(0.001, 30, (ROWS, 1))).astype(ml_dtypes.bfloat16)


def _at(a: np.ndarray) -> int:
    return a.ctypes.data


def test_the_loaded_kernel_is_ml_dtypes_rounding(objects):
    fn = fused._SIGNATURE(objcode.load(objects["bf16"], ("fp8_blocks_bf16",))["fp8_blocks_bf16"])
    x = _weights()
    x[3, 200] = ml_dtypes.bfloat16(np.nan)  # in block (0, 1): reported, quantizing stops there
    codes, scales = np.zeros((ROWS, COLS), np.uint8), np.zeros((ROWS // BLOCK, COLS // BLOCK), np.float32)
    scratch = ctypes.create_string_buffer(12 * COLS)
    at = ctypes.addressof(scratch)
    assert fn(_at(x), _at(codes), _at(scales), ROWS, COLS, BLOCK, BLOCK, 0, 2, at, at + 4 * COLS) == 1
    assert fn(_at(x), _at(codes), _at(scales), ROWS, COLS, BLOCK, BLOCK, 1, 2, at, at + 4 * COLS) == -1
    w = x[BLOCK:].astype(np.float32).reshape(1, BLOCK, COLS // BLOCK, BLOCK)
    want_scales = (np.abs(w).max(axis=(1, 3)) / np.float32(448)).astype(np.float32)
    want = (w / want_scales[:, None, :, None]).astype(ml_dtypes.float8_e4m3fn).reshape(BLOCK, COLS)
    assert np.array_equal(scales[1], want_scales[0])
    assert codes[BLOCK:].tobytes() == want.view(np.uint8).tobytes()


def test_the_magnitude_kernels(objects):
    got = objcode.load(objects["magnitude"], ("magnitude_max_16", "magnitude_max_32"))
    x = _weights()
    f32 = x.astype(np.float32)
    m16 = fused._MAGNITUDE_SIGNATURE(got["magnitude_max_16"])(_at(x), x.size)
    m32 = fused._MAGNITUDE_SIGNATURE(got["magnitude_max_32"])(_at(f32), f32.size)
    assert m16 == int((x.view(np.uint16) & 0x7FFF).max())
    assert m32 == int((f32.view(np.uint32) & 0x7FFFFFFF).max())


def test_pc_relative_relocations():
    """MCJIT's objects relocate absolutely (the large code model); an object of the small one, its constants
    addressed relative to the code, loads as well."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3, reloc="pic",
        codemodel="small")
    module = llvm.parse_assembly(fused._module("magnitude"))
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    tuning.loop_vectorization = True
    builder = llvm.create_pass_builder(machine, tuning)
    builder.getModulePassManager().run(module, builder)
    obj = machine.emit_object(module)
    assert 2 in _relocation_types(obj)  # R_X86_64_PC32
    fn = fused._MAGNITUDE_SIGNATURE(objcode.load(obj, ("magnitude_max_16",))["magnitude_max_16"])
    x = _weights()
    assert fn(_at(x), x.size) == int((x.view(np.uint16) & 0x7FFF).max())


def _sections(obj: bytes) -> list[tuple]:
    shoff, shnum = struct.unpack_from("<Q", obj, 0x28)[0], struct.unpack_from("<H", obj, 0x3C)[0]
    return [(shoff + 64 * i, *struct.unpack_from("<IIQQQQIIQQ", obj, shoff + 64 * i)) for i in range(shnum)]


def _relocation_types(obj: bytes) -> set[int]:
    out = set()
    for _, _, kind, _, _, offset, size, *_ in _sections(obj):
        if kind == 4:
            out |= {info & 0xFFFFFFFF for _, info, _ in struct.iter_unpack("<QQq", obj[offset:offset + size])}
    return out


def _damage(obj: bytes, how: str) -> bytes:
    b = bytearray(obj)
    if how == "machine":  # aarch64
        struct.pack_into("<H", b, 0x12, 183)
    elif how == "short":
        del b[len(b) // 2:]
    elif how == "relocation":  # the first relocation made R_X86_64_32 (an absolute 32-bit address)
        at = next(offset for _, _, kind, _, _, offset, *_ in _sections(obj) if kind == 4)
        info = struct.unpack_from("<Q", b, at + 8)[0]
        struct.pack_into("<Q", b, at + 8, info & ~0xFFFFFFFF | 10)
    elif how == "symbol":  # the call to memset bound to another C library function
        at = b.index(b"\0memset\0") + 1
        b[at:at + 6] = b"system"
    elif how == "huge":  # a read-only data section made NOBITS of 2^62 bytes (zeros it would map)
        at = next(header for header, _, kind, flags, *_ in _sections(obj) if kind == 1 and not flags & 0x4
                  and flags & 0x2)
        struct.pack_into("<I", b, at + 4, 8)
        struct.pack_into("<Q", b, at + 32, 1 << 62)
    elif how == "past":  # the function's value past the end of its section
        strtab_at = b.index(b"\0fp8_blocks_bf16\0") + 1
        symtab = next((offset, size) for _, _, kind, _, _, offset, size, *_ in _sections(obj) if kind == 2)
        for at in range(symtab[0], symtab[0] + symtab[1], 24):
            name_at = struct.unpack_from("<I", b, at)[0]
            strtab = next(offset for _, _, kind, _, _, offset, *_ in _sections(obj) if kind == 3)
            if strtab + name_at == strtab_at:
                struct.pack_into("<Q", b, at + 8, 0x7000_0000_0000)
    elif how == "writable":
        at = next(header for header, _, kind, flags, *_ in _sections(obj) if kind == 1 and flags & 0x4)
        struct.pack_into("<Q", b, at + 8, struct.unpack_from("<Q", b, at + 8)[0] | 0x1)
    return bytes(b)


@pytest.mark.parametrize("how", ["machine", "short", "relocation", "symbol", "huge", "past", "writable"])
def test_what_it_does_not_take_is_refused(objects, how):
    with pytest.raises(ValueError):
        objcode.load(_damage(objects["bf16"], how), ("fp8_blocks_bf16",))


def test_a_function_it_does_not_define_is_refused(objects):
    with pytest.raises(ValueError, match="not defined"):
        objcode.load(objects["magnitude"], ("fp8_blocks_bf16",))


def test_fused_loads_a_refused_entry_through_llvm(objects, tmp_path, monkeypatch):
    """A cache entry objcode refuses is MCJIT's to load: the kernel is the same, the entry is not rewritten."""
    key = fused._host_key(fused._module("magnitude"))
    monkeypatch.setenv("PCC_CACHE", str(tmp_path))
    fused._cache_write(key, objects["magnitude"])
    entry = fused._cache_path(key)
    before = entry.stat().st_ino

    def refuse(obj, names):
        raise ValueError("refused (test)")

    monkeypatch.setattr(objcode, "load", refuse)
    monkeypatch.setattr(fused, "_KERNELS", {})
    got = fused.kernel("magnitude")
    x = _weights()
    assert got[16](_at(x), x.size) == int((x.view(np.uint16) & 0x7FFF).max())
    assert entry.stat().st_ino == before


def test_code_for_features_linux_does_not_list_is_kept_under_llvms_key(monkeypatch):
    """A feature LLVM finds that /proc/cpuinfo does not list (hidden by a kernel or hypervisor) keeps compiled code
    out of the cpuinfo key; and without FMA the kernel divides (no libm call per element)."""
    features = "+avx,+avx2,+fma,+avx512f"
    monkeypatch.setattr(fused, "_host", lambda: {"vendor_id": "GenuineIntel", "flags": "fpu avx avx2 fma avx512f"})
    assert fused._listed(features) and fused._fma()
    assert "llvm.fma.f32(float %y.e.m" in fused._module("bf16")
    monkeypatch.setattr(fused, "_host", lambda: {"vendor_id": "GenuineIntel", "flags": "fpu avx avx2"})
    assert not fused._listed(features) and not fused._fma()
    text = fused._module("bf16")
    assert "@llvm.fma.f32(float %" not in text and "%y.m = fdiv float %xf.m, %sc.m" in text


def test_cores_whose_clock_drops_for_512_bit_code_keep_256(monkeypatch):
    """Skylake, Cascade Lake and Cooper Lake server cores (Intel family 6 model 85) keep LLVM's 256-bit loops and
    divide (the corrected product was slower than the division at 256 bits); other AVX-512 cores get 512."""
    skx = {"vendor_id": "GenuineIntel", "cpu family": "6", "model": "85", "flags": "fpu avx avx2 fma avx512f"}
    monkeypatch.setattr(fused, "_host", lambda: skx)
    text = fused._module("bf16")
    assert '"prefer-vector-width"="256"' in text and "%y.m = fdiv float %xf.m, %sc.m" in text
    monkeypatch.setattr(fused, "_host", lambda: skx | {"model": "207"})
    text = fused._module("bf16")
    assert '"prefer-vector-width"="512"' in text and "llvm.fma.f32(float %y.e.m" in text


def test_the_key_names_the_cpu(monkeypatch):
    """Another CPU (its /proc/cpuinfo model or flags) is another entry; where there is no /proc/cpuinfo, the
    key is LLVM's view of the host (computed by `_jit`)."""
    text = fused._module("magnitude")
    here = fused._host_key(text)
    assert here is not None and fused._host() is not None
    monkeypatch.setattr(fused, "_host", lambda: {"vendor_id": "GenuineIntel", "flags": "fpu sse2"})
    assert fused._host_key(text) not in (None, here)
    monkeypatch.setattr(fused, "_host", lambda: None)
    assert fused._host_key(text) is None


def test_any_damage_is_an_object_error_or_a_load(objects):
    """Bytes flipped anywhere (seeded): every object is loaded or refused with ValueError, never another
    exception (the caller then loads the entry through LLVM, which has its own checks: its hash comes first)."""
    rng = np.random.default_rng(29)
    obj = objects["bf16"]
    refused = 0
    for _ in range(300):
        b = bytearray(obj)
        for at in rng.integers(0, len(b), int(rng.integers(1, 4))):
            b[at] = int(rng.integers(0, 256))
        try:
            objcode.load(bytes(b), ("fp8_blocks_bf16",))
        except ValueError:
            refused += 1
    assert 0 < refused < 300
