"""Load the object code LLVM wrote for a kernel (pcc.fused's cached entries) into executable memory, without LLVM.

Importing llvmlite and handing a cached object to its MCJIT cost 50-60 ms of every conversion here, a tenth of
the MoE's whole conversion (docs/convert.md "The kernels loaded without LLVM; the kernel's division"); the
objects MCJIT writes for pcc's kernels are small relocatable ELF files with a few sections and absolute
relocations, which this module lays out, relocates and maps read-and-execute in a millisecond. It takes only
what it fully understands: an x86-64 little-endian ELF64 relocatable object whose allocated sections are code
or read-only data, whose relocations are R_X86_64_64, PC32 or PLT32, and whose undefined symbols are the C
library's memset, memcpy or memmove; anything else raises ValueError (a builtin: this stage comes before pcc's
error classes), and pcc.fused hands the object to MCJIT as before.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import struct
import sys

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_RELA = struct.Struct("<QQq")
_PROGBITS, _SYMTAB, _RELA_T, _NOBITS, _REL_T = 1, 2, 4, 8, 9
_WRITE, _ALLOC = 0x1, 0x2
_R_64, _R_PC32, _R_PLT32 = 1, 2, 4
_SHN_UNDEF, _SHN_LORESERVE, _SHN_ABS = 0, 0xFF00, 0xFFF1
_LIBC = ("memset", "memcpy", "memmove")
_MAX_BYTES = 16 << 20  # what a kernel's sections may take in all (pcc's take a few KiB)
_KEPT: list = []  # the mappings holding loaded code: alive as long as the process (as MCJIT's engines were)


def load(obj: bytes, names: tuple[str, ...]) -> dict[str, int]:
    """Each of `names` (functions defined in `obj`) -> its address in executable memory this process keeps."""
    if sys.platform != "linux":
        raise ValueError("not Linux")
    try:
        return _load(memoryview(obj), names)
    except (struct.error, IndexError) as err:  # (offsets past the end)
        raise ValueError(f"malformed: {err}") from None
    except OSError as err:  # (the mapping or its protection refused)
        raise ValueError(f"cannot map: {err}") from None


def _load(obj: memoryview, names: tuple[str, ...]) -> dict[str, int]:
    ident, etype, machine, _, _, _, shoff, _, _, _, _, shentsize, shnum, _ = _EHDR.unpack_from(obj, 0)
    if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1 or etype != 1 or machine != 62:
        raise ValueError("not an x86-64 little-endian ELF64 relocatable object")
    if shentsize != _SHDR.size or not 0 < shnum < 256:
        raise ValueError("unexpected section header table")
    sections = [_SHDR.unpack_from(obj, shoff + i * _SHDR.size) for i in range(shnum)]
    for _, kind, _, _, offset, size, *_ in sections:
        if kind != _NOBITS and offset + size > len(obj):
            raise ValueError("a section runs past the end of the object")
    # lay out the allocated sections, each at its alignment
    place, end = {}, 0
    for i, (_, kind, flags, _, _, size, _, _, align, _) in enumerate(sections):
        if not flags & _ALLOC:
            continue
        if flags & _WRITE or kind not in (_PROGBITS, _NOBITS):
            raise ValueError(f"section {i}: writable or not code or data")
        align = max(align, 1)
        if align & (align - 1) or align > mmap.PAGESIZE:
            raise ValueError(f"section {i}: alignment {align}")
        end = -(-end // align) * align
        place[i], end = end, end + size
    if not place or not 0 < end <= _MAX_BYTES:
        raise ValueError(f"sections of {end} bytes in all")
    length = -(-end // mmap.PAGESIZE) * mmap.PAGESIZE
    memory = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
    window = (ctypes.c_char * length).from_buffer(memory)
    base = ctypes.addressof(window)
    for i, at in place.items():
        if sections[i][1] == _PROGBITS:
            offset, size = sections[i][4], sections[i][5]
            memory[at:at + size] = obj[offset:offset + size]
    symbols, functions = _symbols(obj, sections, place, base)
    for _, kind, _, _, offset, size, link, info, _, entsize in sections:
        if kind == _REL_T:
            raise ValueError("REL relocations")
        if kind != _RELA_T or info not in place:  # (relocations of sections not loaded)
            continue
        if entsize != _RELA.size or link >= len(sections) or sections[link][1] != _SYMTAB:
            raise ValueError("unexpected relocation section")
        target, target_size = place[info], sections[info][5]
        for r_offset, r_info, addend in _RELA.iter_unpack(obj[offset:offset + size]):
            if r_info >> 32 not in symbols:
                raise ValueError(f"relocation at {r_offset} against a symbol not loaded")
            rtype, value = r_info & 0xFFFFFFFF, symbols[r_info >> 32] + addend
            where = base + target + r_offset
            if rtype == _R_64 and r_offset + 8 <= target_size:
                struct.pack_into("<Q", memory, target + r_offset, value & 0xFFFFFFFFFFFFFFFF)
            elif rtype in (_R_PC32, _R_PLT32) and r_offset + 4 <= target_size and -2**31 <= value - where < 2**31:
                struct.pack_into("<i", memory, target + r_offset, value - where)
            else:
                raise ValueError(f"relocation type {rtype} at {r_offset} not taken")
    missing = [name for name in names if name not in functions]
    if missing:
        raise ValueError(f"functions not defined: {missing}")
    if _libc().mprotect(ctypes.c_void_p(base), ctypes.c_size_t(length), mmap.PROT_READ | mmap.PROT_EXEC) != 0:
        raise OSError(ctypes.get_errno(), "mprotect")
    _KEPT.append((memory, window))
    return {name: functions[name] for name in names}


def _symbols(obj: memoryview, sections: list, place: dict, base: int) -> tuple[dict, dict]:
    """Symbol index -> address (the symbols relocations may name), and defined function name -> address."""
    tables = [s for s in sections if s[1] == _SYMTAB]
    if len(tables) != 1 or tables[0][9] != _SYM.size or tables[0][6] >= len(sections):
        raise ValueError("not one symbol table")
    _, _, _, _, offset, size, link, *_ = tables[0]
    strtab = sections[link]
    names = bytes(obj[strtab[4]:strtab[4] + strtab[5]])
    out, functions = {}, {}
    for index, (name_at, st_info, _, shndx, value, length) in enumerate(_SYM.iter_unpack(obj[offset:offset + size])):
        name = names[name_at:names.index(b"\0", name_at)].decode("ascii", "replace") if name_at else ""
        if shndx == _SHN_UNDEF:
            if index == 0:
                continue
            if name not in _LIBC:
                raise ValueError(f"undefined symbol {name!r}")
            address = ctypes.cast(getattr(_libc(), name), ctypes.c_void_p).value
        elif shndx == _SHN_ABS:
            address = value
        elif shndx in place:
            if value + length > sections[shndx][5]:
                raise ValueError(f"symbol {name!r} runs past its section")
            address = base + place[shndx] + value
        elif shndx < _SHN_LORESERVE:  # (a symbol of a section not loaded: no relocation may use it)
            continue
        else:
            raise ValueError(f"symbol {name!r} in special section {shndx:#x}")
        out[index] = address
        if st_info & 0xF == 2 and shndx in place:  # STT_FUNC
            functions[name] = address
    return out, functions


@functools.cache
def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc
