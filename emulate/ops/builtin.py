"""``builtin.unrealized_conversion_cast`` (the glue Mosaic GPU leaves between
memrefs, LLVM structs and pointers, and between Warpgroup-level vectors and
their registers) and ``func.call`` of the host runtime's
``mosaic_gpu_init_tma_desc``."""

from __future__ import annotations

import numpy as np

from .. import subbyte
from ..compiler import MOVES, Op, Step, rule
from ..errors import Unsupported
from ..machine import TMA_MAGIC, Frame, TmaDescriptor
from ..values import UNDEF, Bundle, MemRef
from .memref import _contiguous_strides

# TMA moves bits: each element type code (launch_context._tma_dma_type) is
# copied as an unsigned int of its size; 0 (4-bit) and 8 (2-bit) as bytes
TMA_DTYPES = {5: np.uint16, 6: np.uint32, 7: np.uint16, 1: np.uint8, 2: np.uint16,
              3: np.uint32, 4: np.uint64, 9: np.uint32, 10: np.uint64, 0: np.uint8, 8: np.uint8}
TMA_SUBBYTE_BITS = {0: 4, 8: 2}


def _packed_map(sizes, strides, window, bits: int, where: str):
    """A map of packed ``bits``-wide elements as one of bytes: the innermost
    size and box divided by the elements per byte, the outer strides (in
    elements) turned into bytes."""
    per = 8 // bits
    if sizes[-1] % per or window[-1] % per or any(s * bits % 8 for s in strides[:-1]):
        raise Unsupported(f"a TMA map of {bits}-bit elements whose rows do not fill whole bytes "
                          f"(sizes {sizes}, strides {strides}, box {window})", where)
    return (sizes[:-1] + (sizes[-1] // per,), tuple(s * bits // 8 for s in strides[:-1]) + (1,),
            window[:-1] + (window[-1] // per,))


class Opaque:
    """A value only Warpgroup-level ops could use; reading it is Unsupported.
    A Warpgroup-level view of a memref keeps the memref (``source``, of type
    text ``source_type``): casting the view back to that type is the memref
    again, as MLIR's reconciliation of the two casts makes it."""

    def __init__(self, why: str, source=None, source_type: str = "") -> None:
        self.why = why
        self.source = source
        self.source_type = source_type


@rule("builtin.unrealized_conversion_cast", accumulators=MOVES)
def cast(o: Op) -> Step:
    ins, outs = o.in_types, o.out_types
    loc = o.loc
    if len(ins) == 1 and len(outs) == 1:
        a, b = ins[0], outs[0]
        (src,), (out,) = o.ins, o.outs
        if "token" in (a.kind, b.kind):
            return lambda fr: fr.regs.__setitem__(out, None)
        if a.kind == "scalar" and b.kind == "memref" and b.space == "tmem":
            # a Warpgroup-level TMEM ref made of its address; its ops read the address
            why = f"cast {a.text} -> {b.text} (a Warpgroup-level TMEM ref)"
            return lambda fr: fr.regs.__setitem__(out, Opaque(why))
        if a.kind == "struct" and b.kind == "memref":
            def to_memref(fr: Frame) -> None:
                alloc, aligned, offset, sizes, strides = (list(fr.regs[src]) + [UNDEF] * 5)[:5]
                sizes = tuple(sizes) if sizes is not UNDEF else ()
                strides = tuple(strides) if strides is not UNDEF else ()
                fr.regs[out] = MemRef(b.space, b.dtype, alloc, aligned, offset, sizes, strides)
            return to_memref
        if a.kind == "memref" and b.kind == "struct":
            def to_struct(fr: Frame) -> None:
                m = fr.regs[src]
                if not isinstance(m, MemRef):
                    raise Unsupported(f"unrealized_conversion_cast {a.text} -> {b.text} of "
                                      f"{getattr(m, 'why', type(m).__name__)}", loc)
                fr.regs[out] = m.as_struct()
            return to_struct
        if a.kind == "memref" and b.kind == "memref":
            if a.shape != b.shape:
                why = f"cast {a.text} -> {b.text} (a Warpgroup-level view)"

                def view(fr: Frame) -> None:
                    v = fr.regs[src]
                    if isinstance(v, Opaque) and v.source_type == b.text:
                        fr.regs[out] = v.source  # the view cast back: the memref itself
                    elif isinstance(v, Opaque):
                        raise Unsupported(f"unrealized_conversion_cast of {v.why} to {b.text}",
                                          loc)
                    else:
                        fr.regs[out] = Opaque(why, v, a.text)
                return view
            return lambda fr: fr.regs.__setitem__(out, fr.regs[src].with_(dtype=b.dtype))
        if a.kind == "ptr" and b.kind == "memref":
            if any(d < 0 for d in b.shape):
                raise o.unsupported(f"cast of a pointer to {b.text}")
            strides = _contiguous_strides(b.shape)
            return lambda fr: fr.regs.__setitem__(
                out, MemRef(b.space, b.dtype, fr.regs[src], fr.regs[src], 0, b.shape, strides))
        if a.kind == "memref" and b.kind == "ptr":
            def to_ptr(fr: Frame) -> None:
                m = fr.regs[src]
                fr.regs[out] = np.asarray(m.aligned + subbyte.byte_offset(m.offset, m.dtype, loc),
                                          np.int64)
            return to_ptr
        if a.kind == "array" and b.kind == "ptr":
            # a by-value kernel parameter block (TMA descriptors): give it an address
            def param(fr: Frame) -> None:
                region = fr.launch.params.get(out)
                if region is None:
                    data = np.asarray(fr.regs[src], np.uint8)
                    region = fr.mem["global"].alloc(data.size, f"kernel parameter at {loc}")
                    region.data[:data.size] = data
                    fr.launch.params[out] = region
                fr.regs[out] = np.asarray(region.base, np.int64)
            return param
        if b.kind == "vector" and o.has("layout") and a.kind in ("scalar", "vector"):
            lay = str(o.attr("layout"))
            return lambda fr: fr.regs.__setitem__(out, Bundle((fr.regs[src],), lay))
    if (len(outs) == 1 and outs[0].kind == "vector"
            and all(t.kind in ("vector", "scalar") for t in ins)):
        (out,) = o.outs
        srcs = o.ins
        lay = str(o.attr_or("layout", ""))
        return lambda fr: fr.regs.__setitem__(out, Bundle(tuple(fr.regs[s] for s in srcs), lay))
    if len(ins) == 1 and ins[0].kind == "vector":
        (src,) = o.ins
        outs_s = o.outs

        def unbundle(fr: Frame) -> None:
            v = fr.regs[src]
            if not isinstance(v, Bundle) or len(v.parts) != len(outs_s):
                raise Unsupported(f"unrealized_conversion_cast {ins[0].text} -> "
                                  f"{len(outs_s)} registers of a value not built from them", loc)
            for s, p in zip(outs_s, v.parts):
                fr.regs[s] = p
        return unbundle
    raise o.unsupported(
        f"unrealized_conversion_cast {[t.text for t in ins]} -> {[t.text for t in outs]}")


def _i64s(fr: Frame, ptr, n: int, where: str) -> tuple[int, ...]:
    raw = fr.mem["global"].read_bytes(int(ptr), 8 * n, where)
    return tuple(int(v) for v in raw.view(np.int64))


@rule("func.call")
def call(o: Op) -> Step:
    callee = str(o.attr("callee")).lstrip("@")
    if callee != "mosaic_gpu_init_tma_desc":
        raise o.unsupported(f"func.call @{callee}")
    loc = o.loc
    desc_p, base_p, dtype_p, rank_p, sizes_p, strides_p, swz_p, window_p = o.ins
    elem_hint = None

    def step(fr: Frame) -> None:
        r = fr.regs
        if fr.block is not None:
            raise Unsupported("mosaic_gpu_init_tma_desc inside the kernel", loc)
        rank = int(r[rank_p])
        code = int(r[dtype_p])
        if code not in TMA_DTYPES:
            raise Unsupported(f"TMA element type code {code}", loc)
        dt = np.dtype(TMA_DTYPES[code])
        sizes, strides = _i64s(fr, r[sizes_p], rank, loc), _i64s(fr, r[strides_p], rank, loc)
        window, per_byte = _i64s(fr, r[window_p], rank, loc), 1
        if code in TMA_SUBBYTE_BITS:
            bits = TMA_SUBBYTE_BITS[code]
            sizes, strides, window = _packed_map(sizes, strides, window, bits, loc)
            per_byte = 8 // bits
        desc = TmaDescriptor(base=int(r[base_p]), dtype=dt, sizes=sizes, strides=strides,
                             swizzle=int(r[swz_p]), window=window, per_byte=per_byte,
                             code=code)
        key = len(fr.launch.tma) + 1
        fr.launch.tma[key] = desc
        tag = np.zeros(128, np.uint8)
        tag[:16] = np.array([TMA_MAGIC, key], np.int64).view(np.uint8)
        fr.mem["global"].write_bytes(int(r[desc_p]), tag, loc)
    del elem_hint
    return step
