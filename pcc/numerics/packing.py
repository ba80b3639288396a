"""Bit packing of 4-bit codes, in the byte orders the serving engines load.

e2m1x2: two E2M1 codes per uint8 along the last axis, element 2i in the low
nibble and 2i+1 in the high nibble (gpt-oss/SGLang `*_blocks`, ModelOpt's
`fuse_uint4_to_uint8`, compressed-tensors' `pack_fp4_to_uint8`).

int32x8: eight INT4 codes per int32 along the last (input) axis, code c stored
as the unsigned nibble c + 8 and element 8i+j in bits 4j..4j+3, low bits first
(compressed-tensors' `pack_to_int32`).  Odd tails are padded with nibble 0.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F


def _pad_last(t: torch.Tensor, multiple: int) -> torch.Tensor:
    extra = -t.shape[-1] % multiple
    return F.pad(t, (0, extra)) if extra else t


def pack_e2m1x2(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 of shape [..., K] -> uint8 [..., ceil(K/2)]."""
    c = _pad_last(codes.to(torch.uint8), 2)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_e2m1x2(packed: torch.Tensor, k: int) -> torch.Tensor:
    """Inverse of pack_e2m1x2; `k` is the logical length of the last axis."""
    p = packed.to(torch.uint8)
    both = torch.stack((p & 0xF, p >> 4), dim=-1)
    return both.flatten(-2)[..., :k]


_SHIFTS = tuple(4 * j for j in range(8))


def pack_int32x8(codes: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """int8 codes in [-8, 7] -> int32 words holding eight codes each along `dim`.

    Nibble pairs are packed into bytes (element 2i low), and four bytes read as one int32; on a
    little-endian machine byte j holds bits 8j..8j+7, so element 8i+j lands in bits 4j..4j+3."""
    c = codes.movedim(dim, -1)
    u = _pad_last((c + 8).to(torch.uint8), 8)
    pairs = u[..., 0::2] | (u[..., 1::2] << 4)
    if sys.byteorder != "little":  # a native int32 reads its bytes in reverse: store them so
        pairs = pairs.unflatten(-1, (-1, 4)).flip(-1).flatten(-2)
    return pairs.contiguous().view(torch.int32).movedim(-1, dim)


def unpack_int32x8(packed: torch.Tensor, k: int, dim: int = -1) -> torch.Tensor:
    """Inverse of pack_int32x8; `k` is the logical length of `dim`."""
    w = packed.movedim(dim, -1).to(torch.int64) & 0xFFFFFFFF
    shifts = torch.tensor(_SHIFTS, dtype=torch.int64, device=w.device)
    nib = (w.unsqueeze(-1) >> shifts) & 0xF
    return (nib.flatten(-2)[..., :k] - 8).to(torch.int8).movedim(-1, dim)
