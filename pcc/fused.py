"""A fused block-FP8 quantizing kernel, compiled for this CPU by llvmlite (a dependency:
LLVM in a wheel, no compiler on the machine); `pcc.numerics.quantize`
uses it where it gives that module's own bytes, and its torch path everywhere else.

E4M3 scaled by float32 blocks, rows or runs (`fp8_block`, `fp8_row`) of BF16 or float32 weights, one block
row at a time: each column's max magnitude over the block row's rows (integer max of the magnitude bits, a
BF16's 16 of them: twice the lanes per vector),
each block's scale amax / 448 (at least the smallest normal, 1 for an all-zero block), then every element
divided by its block's scale in float32 (for BF16, the same quotient as a product by the scale's reciprocal
and one exact correction: `_MARKSTEIN`) and rounded to E4M3 by c10's float -> Float8_e4m3fn rule (the cast
torch applies), all in loops over whole rows that LLVM vectorizes, 512 bits wide where the CPU has them.
Eager torch makes five passes over each chunk for the same codes (the magnitude bits, their max, a float32
copy, the division, the cast): on one core here 1.7-1.9 ns per element against 0.6-0.8 (docs/numerics.md
"Speed").

The kernel is LLVM IR (`_IR`), compiled when first used (about 0.05 s, against numba's 0.5 s to import and
load a cached kernel, which ate the gain); its object code is kept in the user cache and later processes load
it from there without LLVM (`_cache_read`, `pcc.objcode`: a millisecond). It is called through ctypes, which
lets go of the GIL. Codes and scales are bit for bit the torch path's: the rounding on every float32
magnitude below E4M3's NaN threshold in steps and around every rounding boundary, the scale of every BF16
amax, every BF16 x of sampled amax values, and whole tensors (tests/numerics/test_fused.py). `PCC_FUSED=0`
turns it off. A block holding NaN or inf is reported,
not quantized: the caller takes the torch path, whose error names the block.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import sys
import threading

_LOCK = threading.Lock()
_SCRATCH = threading.local()  # each thread's scratch for the block-FP8 kernel (`fp8_fp32_blocks`)
_KERNELS: dict = {}  # source element -> its ctypes function, or None where llvmlite is missing or it is off

# c10's float -> Float8_e4m3fn for |y|'s float32 bits %fa (sign %sign): at or above bits(480.0) NaN (0x7F; not
# reached: the scale bounds |x/s| by 448 (1 + 2^-22)); below bits(2^-6) the FPU rounds |y| + 2^14 and the
# low byte of its bits less bits(2^14) is the code; else (f - (120 << 23) + 0x7FFFF + mantissa bit 20) >> 20.
# The kernels' loops in 512-bit vectors where the CPU has them (LLVM's tuning for Intel's server cores prefers
# 256-bit ones, for the whole program's clock): the same operations on twice the lanes, 10% less time per weight
# on an Emerald Rapids core (docs/numerics.md "Speed"); where vectors are narrower, the widest there are; 256 bits
# on the cores whose clock drops for 512-bit code (`_wide`).
_DECLARE = """
attributes #0 = { "prefer-vector-width"="WIDTH" }
declare i32 @llvm.umax.i32(i32, i32)
declare i16 @llvm.umax.i16(i16, i16)
declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)
declare float @llvm.fma.f32(float, float, float)
"""
_IR = """
define i64 @fp8_blocks(ptr noalias nocapture readonly %x, ptr noalias nocapture %codes,
                       ptr noalias nocapture %scales, i64 %rows, i64 %cols, i64 %R, i64 %C, i64 %first,
                       i64 %stop, ptr noalias nocapture %colmax, ptr noalias nocapture %colscale) #0 {
entry:
  %nbc.0 = add i64 %cols, %C
  %nbc.1 = sub i64 %nbc.0, 1
  %nbc = udiv i64 %nbc.1, %C
  %cm.bytes = mul i64 %cols, MAGTBYTES
  br label %br.head

br.head:
  %br = phi i64 [%first, %entry], [%br.next, %codes.done]
  %br.more = icmp slt i64 %br, %stop
  br i1 %br.more, label %br.body, label %ret.ok

br.body:
  %a = mul i64 %br, %R
  %a.R = add i64 %a, %R
  %b.lt = icmp slt i64 %a.R, %rows
  %b = select i1 %b.lt, i64 %a.R, i64 %rows
  call void @llvm.memset.p0.i64(ptr %colmax, i8 0, i64 %cm.bytes, i1 false)
  br label %amax.row

amax.row:
  %i = phi i64 [%a, %br.body], [%i.next, %amax.row.done]
  %i.more = icmp slt i64 %i, %b
  br i1 %i.more, label %amax.row.body, label %blocks.head

amax.row.body:
  %row = mul i64 %i, %cols
  br label %amax.col

amax.col:
  %c = phi i64 [0, %amax.row.body], [%c.next, %amax.col]
  %xi = add i64 %row, %c
  %px = getelementptr ELT, ptr %x, i64 %xi
  %v = load ELT, ptr %px
  MAG(%v, %mag)
  %pm = getelementptr MAGT, ptr %colmax, i64 %c
  %m0 = load MAGT, ptr %pm
  %m1 = call MAGT @llvm.umax.MAGT(MAGT %m0, MAGT %mag)
  store MAGT %m1, ptr %pm
  %c.next = add i64 %c, 1
  %c.more = icmp slt i64 %c.next, %cols
  br i1 %c.more, label %amax.col, label %amax.row.done

amax.row.done:
  %i.next = add i64 %i, 1
  br label %amax.row

blocks.head:
  %j = phi i64 [0, %amax.row], [%j.next, %fill.done]
  %tiny = phi i1 [false, %amax.row], [%tiny.next, %fill.done]
  %j.more = icmp slt i64 %j, %nbc
  br i1 %j.more, label %blocks.body, label %codes.start

blocks.body:
  %c0 = mul i64 %j, %C
  %c0.C = add i64 %c0, %C
  %c1.lt = icmp slt i64 %c0.C, %cols
  %c1 = select i1 %c1.lt, i64 %c0.C, i64 %cols
  br label %bmax

bmax:
  %k = phi i64 [%c0, %blocks.body], [%k.next, %bmax]
  %bm = phi MAGT [0, %blocks.body], [%bm.1, %bmax]
  %pk = getelementptr MAGT, ptr %colmax, i64 %k
  %mk = load MAGT, ptr %pk
  %bm.1 = call MAGT @llvm.umax.MAGT(MAGT %bm, MAGT %mk)
  %k.next = add i64 %k, 1
  %k.more = icmp slt i64 %k.next, %c1
  br i1 %k.more, label %bmax, label %bmax.done

bmax.done:
  BITS(%bm.1, %bmf)
  %sidx.0 = mul i64 %br, %nbc
  %sidx = add i64 %sidx.0, %j
  %bad = icmp uge i32 %bmf, 2139095040
  br i1 %bad, label %ret.bad, label %scale

scale:
  %amf = bitcast i32 %bmf to float
  %s.0 = fdiv float %amf, 4.480000e+02
  %small = fcmp olt float %s.0, 0x3810000000000000
  %s.1 = select i1 %small, float 0x3810000000000000, float %s.0
  %zero = icmp eq i32 %bmf, 0
  %s = select i1 %zero, float 1.000000e+00, float %s.1
  %s.tiny = fcmp olt float %s, 0x3BF0000000000000
  %tiny.next = or i1 %tiny, %s.tiny
  %ps = getelementptr float, ptr %scales, i64 %sidx
  store float %s, ptr %ps
  %rcp = fdiv float 1.000000e+00, %s
  br label %fill

fill:
  %f = phi i64 [%c0, %scale], [%f.next, %fill]
  %pf = getelementptr float, ptr %colscale, i64 %f
  store float %s, ptr %pf
  %f.r = add i64 %f, %cols
  %pfr = getelementptr float, ptr %colscale, i64 %f.r
  store float %rcp, ptr %pfr
  %f.next = add i64 %f, 1
  %f.more = icmp slt i64 %f.next, %c1
  br i1 %f.more, label %fill, label %fill.done

fill.done:
  %j.next = add i64 %j, 1
  br label %blocks.head

codes.start:
CODES_LOOPS
codes.done:
  %br.next = add i64 %br, 1
  br label %br.head

ret.ok:
  ret i64 -1

ret.bad:
  ret i64 %sidx
}
"""
# the codes loop over a block row's rows (`_codes_loop`): one copy with QUOTIENT as the element's, one dividing;
# %sc is the element's scale, %rc its reciprocal (colscale's second half; a quotient that divides leaves it unread)
_CODES = """codes.row:
  %i2 = phi i64 [%a, %codes.start], [%i2.next, %codes.row.done]
  %i2.more = icmp slt i64 %i2, %b
  br i1 %i2.more, label %codes.row.body, label %codes.done

codes.row.body:
  %row2 = mul i64 %i2, %cols
  br label %codes.col

codes.col:
  %e = phi i64 [0, %codes.row.body], [%e.next, %codes.col]
  %xe = add i64 %row2, %e
  %px2 = getelementptr ELT, ptr %x, i64 %xe
  %v2 = load ELT, ptr %px2
  WIDEN(%v2, %w2)
  %xf = bitcast i32 %w2 to float
  %pcs = getelementptr float, ptr %colscale, i64 %e
  %sc = load float, ptr %pcs
  %e.r = add i64 %e, %cols
  %pcr = getelementptr float, ptr %colscale, i64 %e.r
  %rc = load float, ptr %pcr
  QUOTIENT(%xf, %sc, %rc, %y)
  %yb = bitcast float %y to i32
  %sign = and i32 %w2, -2147483648
  %fa = and i32 %yb, 2147483647
  %odd.0 = lshr i32 %fa, 20
  %odd = and i32 %odd.0, 1
  %n.0 = add i32 %fa, -1006632960
  %n.1 = add i32 %n.0, 524287
  %n.2 = add i32 %n.1, %odd
  %normal = lshr i32 %n.2, 20
  %faf = bitcast i32 %fa to float
  %dsum = fadd float %faf, 1.638400e+04
  %db = bitcast float %dsum to i32
  %denormal = sub i32 %db, 1182793728
  %isden = icmp ult i32 %fa, 1015021568
  %r.0 = select i1 %isden, i32 %denormal, i32 %normal
  %isnan = icmp uge i32 %fa, 1139802112
  %r.1 = select i1 %isnan, i32 127, i32 %r.0
  %sg = lshr i32 %sign, 24
  %r.2 = or i32 %r.1, %sg
  %code = trunc i32 %r.2 to i8
  %pc = getelementptr i8, ptr %codes, i64 %xe
  store i8 %code, ptr %pc
  %e.next = add i64 %e, 1
  %e.more = icmp slt i64 %e.next, %cols
  br i1 %e.more, label %codes.col, label %codes.row.done

codes.row.done:
  %i2.next = add i64 %i2, 1
  br label %codes.row

"""
# the largest magnitude (bits & mask) of n 16- or 32-bit floats: for x >= 0 the bits order as the values do, so
# it is at or above the format's inf exactly where NaN or inf is present (the check of tensors copied as stored)
_MAGNITUDE_IR = """
define i32 @magnitude_max_$W(ptr noalias nocapture readonly %x, i64 %n) #0 {
entry:
  %empty = icmp sle i64 %n, 0
  br i1 %empty, label %none, label %loop

loop:
  %i = phi i64 [0, %entry], [%i.next, %loop]
  %m = phi i32 [0, %entry], [%m.1, %loop]
  %p = getelementptr i$W, ptr %x, i64 %i
  %v = load i$W, ptr %p
  $WIDEN
  %a = and i32 %w, $MASK
  %m.1 = call i32 @llvm.umax.i32(i32 %m, i32 %a)
  %i.next = add i64 %i, 1
  %more = icmp slt i64 %i.next, %n
  br i1 %more, label %loop, label %done

done:
  ret i32 %m.1

none:
  ret i32 0
}
"""
_MAGNITUDE = {16: ("%w = zext i16 %v to i32", 32767), 32: ("%w = add i32 %v, 0", 2147483647)}
_MAGNITUDE_SIGNATURE = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int64)

# source element -> (its IR type, how it becomes its value's float32 bits, the integer type of its magnitude bits
# and how they are taken, how a maximum of them becomes float32 bits): a BF16 amax is taken on its 16 bits (they
# order as the values do), twice the lanes per vector of widening each element first
_BF16_BITS = "{t}.z = zext i16 {v} to i32\n  {t} = shl i32 {t}.z, 16"  # a BF16 is a float32's top 16 bits
# x / s rounded to float32 ({x} / {s} into {y}, {r} the reciprocal of s rounded): a division, or for a BF16 x the
# product by that reciprocal corrected once by the exact residual x - q s (Markstein's iteration, two
# FMAs): the same codes for every BF16 x and every scale of at least 2^-64 a block of BF16 can have, all 1.07
# billion pairs compared with ml_dtypes (bench/kernel_exhaustive.py). Below 2^-64 the residual can underflow
# (206 pairs differed, at amax near 2^-117), so a block row holding such a block divides (`_module`). The
# division's throughput bounded the loop: 0.34 ns per weight against 0.40 dividing (bench/kernel.py, one core).
_DIVIDE = "{y} = fdiv float {x}, {s}"
_MARKSTEIN = """{y}.q = fmul float {x}, {r}
  {y}.n = fneg float {y}.q
  {y}.e = call float @llvm.fma.f32(float {y}.n, float {s}, float {x})
  {y} = call float @llvm.fma.f32(float {y}.e, float {r}, float {y}.q)"""
_ELEMENTS = {
    "bf16": ("i16", _BF16_BITS, "i16", "{t} = and i16 {v}, 32767", _BF16_BITS, _MARKSTEIN),
    "f32": ("float", "{t} = bitcast float {v} to i32", "i32",
            "{t}.i = bitcast float {v} to i32\n  {t} = and i32 {t}.i, 2147483647", "{t} = add i32 {v}, 0", _DIVIDE),
}
_SIGNATURE = ctypes.CFUNCTYPE(ctypes.c_int64, *[ctypes.c_void_p] * 3, *[ctypes.c_int64] * 6,
                              *[ctypes.c_void_p] * 2)


def _codes_loop(suffix: str, quotient: str, widen: str) -> str:
    """`_CODES` with `quotient` (and the element's `widen`), its labels and values named apart by `suffix`."""
    text = _CODES.replace("QUOTIENT(%xf, %sc, %rc, %y)", quotient.format(x="%xf", s="%sc", r="%rc", y="%y"))
    text = text.replace("WIDEN(%v2, %w2)", widen.format(v="%v2", t="%w2"))
    text = re.sub(r"(%?)codes\.(row|col)", rf"\1codes{suffix}.\2", text)
    defined = set(re.findall(r"^\s*(%[\w.]+) =", text, re.MULTILINE))
    return re.sub(r"%[\w.]+", lambda m: m[0] + suffix if m[0] in defined else m[0], text)


def _module(element: str) -> str:
    """The LLVM module of a kernel, for this CPU (its vector width, its quotient)."""
    wide = _wide()
    head = _DECLARE.replace("WIDTH", "512" if wide else "256")
    if element == "magnitude":
        return head + "".join(_MAGNITUDE_IR.replace("$WIDEN", widen).replace("$W", str(w)).replace("$MASK", str(mask))
                       for w, (widen, mask) in _MAGNITUDE.items())
    ir_type, widen, mag_type, mag, bits, quotient = _ELEMENTS[element]
    if quotient != _DIVIDE and not (_fma() and wide):  # (at 256 bits it was slower than the division here)
        quotient = _DIVIDE
    if quotient == _DIVIDE:
        loops = "  br label %codes.m.row\n\n" + _codes_loop(".m", quotient, widen)
    else:  # (a block row with a tiny scale divides: there the residual of Markstein's step would underflow)
        loops = "  br i1 %tiny, label %codes.d.row, label %codes.m.row\n\n" + _codes_loop(".m", quotient, widen) \
            + _codes_loop(".d", _DIVIDE, widen)
    text = _IR.replace("CODES_LOOPS", loops).replace("@fp8_blocks", f"@fp8_blocks_{element}").replace("ELT", ir_type)
    text = text.replace("MAGTBYTES", str(int(mag_type[1:]) // 8)).replace("MAGT", mag_type)
    text = text.replace("MAG(%v, %mag)", mag.format(v="%v", t="%mag"))
    text = text.replace("BITS(%bm.1, %bmf)", bits.format(v="%bm.1", t="%bmf"))
    return head + text


def kernel(element: str):
    """The compiled block-FP8 kernel for source elements "bf16" or "f32", or ("magnitude") the magnitude
    maxima of 16- and 32-bit floats by width; each compiled once per process when first asked for. None
    without llvmlite or with PCC_FUSED=0."""
    got = _KERNELS.get(element, False)
    if got is False:
        with _LOCK:
            got = _KERNELS.get(element, False)
            if got is False:
                got = _KERNELS[element] = _compile(element)
    return got


def available() -> bool:
    """Can kernels be had here (llvmlite installed, PCC_FUSED not 0)? Importing llvmlite's LLVM waits until a
    kernel is compiled: one already in the cache is loaded without it (`pcc.objcode`)."""
    if os.environ.get("PCC_FUSED", "1") == "0":
        return False
    try:
        import llvmlite  # noqa: F401  (its version only; its binding loads LLVM, 25-40 ms)
    except ImportError:
        return False
    return True


_ENGINES: list = []  # the JITs holding the machine code; alive as long as the process
# each kernel's functions, as its module defines them
_FUNCTIONS = {"bf16": ("fp8_blocks_bf16",), "f32": ("fp8_blocks_f32",),
              "magnitude": tuple(f"magnitude_max_{w}" for w in _MAGNITUDE)}


def _compile(element: str):
    if not available():
        return None
    try:
        text = _module(element)
        key = _host_key(text)
        cached = _cache_read(key) if key is not None else None
        if cached is not None:
            from pcc import objcode

            try:
                return _functions(element, objcode.load(cached, _FUNCTIONS[element]))
            except ValueError:  # (not an object it takes: LLVM loads it)
                pass
        return _jit(element, text, key, cached)
    except Exception as err:  # an llvmlite whose API or LLVM differs: the torch path, said once
        import warnings

        warnings.warn(f"pcc: the fused FP8 kernel did not compile ({err}); quantizing with torch", stacklevel=3)
        return None


def _functions(element: str, address: dict[str, int]):
    if element == "magnitude":
        return {w: _MAGNITUDE_SIGNATURE(address[f"magnitude_max_{w}"]) for w in _MAGNITUDE}
    return _SIGNATURE(address[f"fp8_blocks_{element}"])


def _jit(element: str, text: str, key: bytes | None, cached: bytes | None):
    """The kernel compiled by LLVM (MCJIT), or its cached object code loaded by it."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
    machine = llvm.Target.from_default_triple().create_target_machine(cpu=cpu, features=features, opt=3)
    module = llvm.parse_assembly(text)  # MCJIT finds the functions by the module, cached code or not
    module.verify()
    if key is None or (cached is None and not _listed(features)):  # the host as LLVM sees it names the code
        key = _cache_key(text, machine.triple, cpu, features, llvm.llvm_version_info)
        cached = _cache_read(key)
    if cached is None:
        tuning = llvm.create_pipeline_tuning_options(speed_level=3)
        tuning.loop_vectorization = True
        tuning.slp_vectorization = True
        builder = llvm.create_pass_builder(machine, tuning)
        builder.getModulePassManager().run(module, builder)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.set_object_cache(lambda _, obj: _cache_write(key, obj), lambda _: cached)
    engine.finalize_object()
    _ENGINES.append(engine)
    return _functions(element, {name: engine.get_function_address(name) for name in _FUNCTIONS[element]})


# The machine code of each kernel is kept in the user cache (`pcc.resources.cache_dir("kernels")`): the passes
# and code generation are 0.05-0.09 s of every conversion, loading it through llvmlite 0.05, through
# `pcc.objcode` a millisecond. An entry is named by a hash of all that shapes the code (the IR, the LLVM of this
# llvmlite, the passes' settings, the target and its CPU) and holds that hash and the SHA-256 of the object
# code before it: an entry that is damaged, short, or another key's is not loaded, the kernel is compiled and
# the entry rewritten. On Linux the CPU is /proc/cpuinfo's (`_host`: the model and feature flags that LLVM's
# host detection reads too, through CPUID), so that a cached kernel is found without loading LLVM; elsewhere it
# is the CPU name and features LLVM detects.
_CACHE_MAGIC = b"pcc-kernel-1\n"
_PASSES = "speed_level=3 loop_vectorization slp_vectorization opt=3"
# LLVM host features the kernels' code may use, which /proc/cpuinfo must list too for its key (`_listed`)
_KEY_FEATURES = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl")
# the /proc/cpuinfo fields that name a CPU and what it offers (x86, then Arm); not its clock, cores or microcode
_CPU_FIELDS = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags",
               "CPU implementer", "CPU architecture", "CPU variant", "CPU part", "CPU revision", "Features")


@functools.cache
def _host() -> dict[str, str] | None:
    """This CPU as Linux describes it (its first processor's `_CPU_FIELDS`), or None; read once per process."""
    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break
                name, _, value = line.partition(":")
                if name.strip() in _CPU_FIELDS:
                    fields[name.strip()] = value.strip()
    except OSError:
        return None
    return fields if "flags" in fields or "Features" in fields else None


def _flags() -> set[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (x86 `flags`, Arm `Features`); empty elsewhere."""
    host = _host() or {}
    return set(host.get("flags", host.get("Features", "")).split())


def _listed(features: str) -> bool:
    """Does /proc/cpuinfo list every vector feature LLVM found on this host (so that code compiled for LLVM's
    view may be kept under the cpuinfo key)? Not where a kernel or hypervisor hides one from Linux."""
    flags = _flags()
    return all(f"+{name}" not in features.split(",") or name in flags for name in _KEY_FEATURES)


def _wide() -> bool:
    """512-bit vectors for the kernels: not on Intel's Skylake, Cascade Lake and Cooper Lake server cores (family 6
    model 85), whose clock drops for 512-bit floating point (LLVM's reason to prefer 256 bits for them)."""
    host = _host() or {}
    return (host.get("vendor_id"), host.get("cpu family"), host.get("model")) != ("GenuineIntel", "6", "85")


def _fma() -> bool:
    """Has this CPU fused multiply-add (x86 `fma`; every 64-bit Arm core)? Markstein's step needs it: elsewhere
    `llvm.fma` is a libm call per element, and the kernel divides."""
    flags = _flags()
    return "fma" in flags or ("asimd" in flags and os.uname().machine in ("aarch64", "arm64"))


def _host_key(text: str) -> bytes | None:
    """The cache key of the kernel `text` on this machine, where /proc/cpuinfo names its CPU; else None."""
    host = _host()
    if host is None:
        return None
    uname = os.uname()
    cpu = "\n".join(f"{name}: {host[name]}" for name in _CPU_FIELDS if name in host)
    return _cache_key(text, "cpuinfo", sys.platform, uname.sysname, uname.machine, cpu)


def _cache_key(text: str, *machine) -> bytes:
    import hashlib

    import llvmlite

    parts = (text, *map(str, machine), llvmlite.__version__, _PASSES)
    return hashlib.sha256("\0".join(parts).encode()).digest()


def _cache_path(key: bytes):
    from pcc.resources import cache_dir

    return cache_dir("kernels") / f"{key.hex()}.o"


def _cache_read(key: bytes) -> bytes | None:
    """The object code cached under `key`, or None (absent, unreadable, or not exactly what it says)."""
    import hashlib

    try:
        data = _cache_path(key).read_bytes()
    except (OSError, RuntimeError):  # (RuntimeError: no home directory)
        return None
    head = len(_CACHE_MAGIC) + 64
    obj = data[head:]
    if data[:head] != _CACHE_MAGIC + key + hashlib.sha256(obj).digest() or not obj:
        return None
    return obj


def _cache_write(key: bytes, obj: bytes) -> None:
    """Store `obj` under `key` through a rename (readers see a whole entry or none); a cache that cannot be
    written is no error."""
    import hashlib
    import tempfile

    try:
        path = _cache_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_CACHE_MAGIC + key + hashlib.sha256(obj).digest() + obj)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except (OSError, RuntimeError):
        pass


def fp8_fp32_blocks(element: str, x: int, codes: int, scales: int, rows: int, cols: int, block_rows: int,
                    block_cols: int, first: int, stop: int) -> int:
    """Quantize block rows [first, stop) of the row-major [rows, cols] `element`s ("bf16" or "f32") at address
    `x` into E4M3 bytes at `codes` (row-major, the same shape) and float32 scales at `scales` (row-major
    [ceil(rows / block_rows), ceil(cols / block_cols)]); -1, or the flat index of a scale block holding NaN or
    inf (quantizing stopped there). Runs without the GIL; `kernel(element)` must not be None."""
    scratch = getattr(_SCRATCH, "buffer", None)  # each column's max magnitude, then its block's scale and that
    if scratch is None or len(scratch) < 12 * cols:  # scale's reciprocal: the calling thread's, kept between calls
        scratch = _SCRATCH.buffer = ctypes.create_string_buffer(12 * cols)
        _SCRATCH.at = ctypes.addressof(scratch)
    at = _SCRATCH.at
    return kernel(element)(x, codes, scales, rows, cols, block_rows, block_cols, first, stop, at, at + 4 * cols)


def magnitude_max(width: int, x: int, n: int) -> int:
    """max(bits & the sign's complement) over the n `width`-bit (16 or 32) floats at address `x`; without the
    GIL. `kernel("magnitude")` must not be None."""
    return kernel("magnitude")[width](x, n)
