"""Block-scaled ``tcgen05.mma`` (``.kind::{mxf8f6f4,mxf4,mxf4nvf4}.block_scale``):
the instruction descriptor of the scaled kinds, the scale factors in TMEM,
and 4-bit (e2m1) operands. :mod:`.tcgen05` issues the MMA with these.

**Kinds and vectors.** ``kind::mxf8f6f4.block_scale[.scale_vec::1X]`` (fp8
e4m3/e5m2 operands, K = 32 an instruction, one ue8m0 scale a row of A and a
column of B: blocks of 32 elements); ``kind::mxf4.block_scale[.scale_vec::2X]``
and ``kind::mxf4nvf4.block_scale.scale_vec::{2X,4X}`` (e2m1 operands packed
two a byte, K = 64 an instruction, 2 scales a row -- blocks of 32, ue8m0 --
or 4 -- blocks of 16, ue8m0 or ue4m3 (mxf4nvf4 only)). jax 0.11.2 emits
``mxf8f6f4...scale_vec::1X`` and ``mxf4nvf4...scale_vec::{2X,4X}``; the f6/f4
operands of mxf8f6f4 (one element a byte in SMEM) are not modelled.

**Instruction descriptor** (the scaled kinds' format, as the PTX ISA
documents it): sparsity 2, the high bit of the K encoding 3 (mxf4*), the B
scale-factor data ID 4-5, A/B type 7-9 / 10-12 (mxf4*: 10-11, with the
sparsity version in 12), negate A/B 13/14, transpose A/B 15/16, N >> 3 in
17-22, the scale type 23 (1: ue8m0, 0: ue4m3), M >> 7 in 27-28, the A
scale-factor data ID 29-30, the low bit of the K encoding 31. K encodings
other than 0 (the dense K above) raise :class:`Unsupported`.

**Scale factors** are bytes of 32-bit TMEM cells, as jax's ``scales_layout``
lays them (``tcgen05.cp.32x128b.warpx4`` copies of 32 rows x 16 bytes into
each warp's 32 lanes: the layout PTX calls scale-factor layout 1X, which jax
uses for all three vector sizes). Each lane quarter ``q`` of the data path
reads the scales of the D elements it computes (D's lanes: data path layout
D, M = 128, row ``r`` at lane ``r``; layout B, M = 128 over a CTA pair,
row ``r`` (of 64) at lane ``r`` for the first ``N / 2`` columns and at lane
``64 + r`` for the others): row ``r``'s A scales in the row's lane, column
``a_col + r // 32``; column ``n``'s B scales at lane ``32 q + c % 32``,
column ``b_col + c // 32``, where ``c`` is ``n`` counted within the columns
the quarter computes (layout D: ``n``; layout B: ``n % (N / 2)``). Each
quarter has its own copy (they need not agree). With layout B this is what
``tcgen05.cp.64x128b.warpx2::01_23`` of jax's ``b_scales_m64_collective_layout``
provides (rows 0-31 of each 64-row tile, the first ``N / 2`` columns' scales,
to quarters 0 and 1; rows 32-63 to quarters 2 and 3: :mod:`.tcgen05_cp`) --
the PTX ISA's figures of the M = 128 cta_group::2 scale-factor layouts are
not quoted here; jax's ``test_mma_block_scaled_collective_m128`` matches
numpy with this reading. An instruction's ``V`` scales of a row are the
bytes ``id`` to ``id + V - 1`` of its cell (``id`` the data ID;
``id + V <= 4``).

**Numbers.** Operands and scales are decoded exactly (:mod:`..floats`;
ue4m3 is e4m3 without its sign bit, which is ignored; ue8m0's 0xFF is NaN),
each product ``(a s_a) (b s_b)`` is exact in float64, an instruction's K
products are summed in float64, added to D and rounded once to f32 -- a
reading of the PTX ISA (which leaves the internal precision open), not
validated on the hardware.
"""

from __future__ import annotations

import re
from typing import Any

import ml_dtypes
import numpy as np

from .. import floats, irtypes
from ..errors import EmulationError, Unsupported

SCALED = re.compile(r"(mxf8f6f4|mxf4|mxf4nvf4)\.block_scale(?:\.scale_vec::([124])X)?")

FP4 = np.dtype(ml_dtypes.float4_e2m1fn)
#: per scaled kind: A/B type codes -> element dtype (e2m1: packed two a byte)
TYPES = {
    "mxf8f6f4": {0: irtypes.SCALARS["f8E4M3FN"], 1: irtypes.SCALARS["f8E5M2"]},
    "mxf4": {1: FP4},
    "mxf4nvf4": {1: FP4},
}
#: per scaled kind: the scale vectors it takes (the first its default)
VECTORS = {"mxf8f6f4": (1,), "mxf4": (2,), "mxf4nvf4": (2, 4)}
SCALE_TYPES = {1: "ue8m0", 0: "ue4m3"}


def kind(text: str, where: str) -> tuple[str, int] | None:
    """(kind, scale vector) of a ``.kind::`` string of a scaled kind, else None."""
    m = SCALED.fullmatch(text)
    if m is None:
        return None
    base, vec = m[1], int(m[2]) if m[2] else None
    if vec is None:
        if base == "mxf4nvf4":
            raise EmulationError(f"tcgen05.mma.kind::{text} at {where}: kind::mxf4nvf4 needs "
                                 "an explicit .scale_vec::2X or ::4X")
        vec = VECTORS[base][0]
    if vec not in VECTORS[base]:
        raise EmulationError(f"tcgen05.mma.kind::{text} at {where}: kind::{base} takes "
                             f"scale_vec {', '.join(f'{v}X' for v in VECTORS[base])}")
    return base, vec


def idesc(d: int, base: str, vec: int, ctas: int, sparse: bool, where: str) -> dict:
    """The fields of a block-scaled kind's instruction descriptor, checked."""
    f: dict[str, Any] = {"sparse": (d >> 2) & 1, "k_hi": (d >> 3) & 1, "b_id": (d >> 4) & 3,
         "a": (d >> 7) & 7, "b": (d >> 10) & (3 if base != "mxf8f6f4" else 7),
         "neg_a": (d >> 13) & 1, "neg_b": (d >> 14) & 1, "trans_a": (d >> 15) & 1,
         "trans_b": (d >> 16) & 1, "n": ((d >> 17) & 0x3F) << 3, "scale": (d >> 23) & 1,
         "m": ((d >> 27) & 3) << 7, "a_id": (d >> 29) & 3, "k_lo": (d >> 31) & 1}
    op = f"tcgen05.mma.kind::{base}.block_scale.scale_vec::{vec}X"
    if d & 3 or (d >> 6) & 1 or (d >> 24) & 7:
        raise EmulationError(f"{op} instruction descriptor {d:#x} at {where} sets reserved "
                             "bits (0-1, 6 or 24-26)")
    if f["sparse"] != sparse:
        raise EmulationError(f"{op} instruction descriptor {d:#x} at {where}: its sparsity "
                             f"bit is {f['sparse']} on a{'' if sparse else ' non'}-sparse "
                             "instruction")
    if f["k_hi"] or f["k_lo"]:
        raise Unsupported(f"{op} with K encoding {f['k_hi']}{f['k_lo']} (instruction "
                          f"descriptor {d:#x}; the dense K, encoding 00, is modelled)", where)
    types_ = TYPES[base]
    if f["a"] not in types_ or f["b"] not in types_:
        raise Unsupported(f"{op} with A type {f['a']} and B type {f['b']} (instruction "
                          f"descriptor {d:#x}; modelled: "
                          f"{', '.join(str(t) for t in types_.values())})", where)
    scale = SCALE_TYPES[f["scale"]]
    if scale == "ue4m3" and not (base == "mxf4nvf4" and vec == 4):
        raise EmulationError(f"{op} instruction descriptor {d:#x} at {where} asks for ue4m3 "
                             "scale factors, which only kind::mxf4nvf4 with scale_vec::4X "
                             "takes")
    for who in ("a_id", "b_id"):
        if f[who] + vec > 4 or f[who] % vec:
            raise EmulationError(f"{op} instruction descriptor {d:#x} at {where}: "
                                 f"{who[0].upper()} scale-factor data ID {f[who]} with "
                                 f"{vec} scales a row (the ID must be a multiple of {vec} "
                                 "below 4)")
    if f["m"] not in ((128,) if ctas == 1 else (128, 256)):
        raise Unsupported(f"{op} in cta_group::{ctas} with M = {f['m']} (instruction "
                          f"descriptor {d:#x}; M = 128 in cta_group::1, 128 or 256 in "
                          "cta_group::2 are modelled)", where)
    if f["n"] % (8 * ctas) or not 8 * ctas <= f["n"] <= 256:
        raise EmulationError(f"{op} instruction descriptor {d:#x} at {where} has N = "
                             f"{f['n']}: N must be a multiple of {8 * ctas} from {8 * ctas} "
                             "to 256")
    if FP4 in (types_[f["a"]], types_[f["b"]]) and (f["trans_a"] or f["trans_b"]):
        raise EmulationError(f"{op} instruction descriptor {d:#x} at {where} transposes an "
                             "e2m1 operand: 4-bit operands must be K-major")
    f["a_dtype"], f["b_dtype"], f["scale_type"], f["vec"] = \
        types_[f["a"]], types_[f["b"]], scale, vec
    return f


def unpack_fp4(raw: np.ndarray) -> np.ndarray:
    """(rows, 2 n) e2m1 values (float64) of (rows, n) bytes, the low nibble first."""
    codes = np.empty(raw.shape[:-1] + (2 * raw.shape[-1],), np.uint8)
    codes[..., 0::2] = raw & 0xF
    codes[..., 1::2] = raw >> 4
    return floats.decode(codes, floats.FORMATS["e2m1"])


def decode_scales(codes: np.ndarray, scale_type: str) -> np.ndarray:
    """float64 values of scale-factor bytes (ue4m3: the sign bit ignored)."""
    if scale_type == "ue8m0":
        return floats.decode(codes, floats.FORMATS["ue8m0"])
    return floats.decode(np.asarray(codes) & 0x7F, floats.FORMATS["e4m3"])


def scale_bytes(cells: np.ndarray, first: int, vec: int) -> np.ndarray:
    """Bytes ``first .. first + vec - 1`` of each cell: (..., vec)."""
    return np.stack([(cells >> (8 * (first + j))) & 0xFF for j in range(vec)], axis=-1) \
        .astype(np.uint8)
