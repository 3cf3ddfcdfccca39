"""The TMEM layouts tcgen05 needs, by the shape of the ref.

An MMA accumulator (and a TMEM ``a`` operand) of 128 rows uses the default
layout: row ``i`` in TMEM lane ``i``. One of 64 rows uses half the lanes of
each warp's bank for a single-CTA MMA, or splits its columns over the two
CTAs' banks for a collective one.
"""

from __future__ import annotations

from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import tcgen05

from smalti.diagnostics import SmaltiValueError
from smalti.layouts import TmemLayout, tmem_layout_fits


def mma_tmem_layout(shape: tuple[int, ...], collective: bool,
                    packing: int) -> tcgen05.TMEMLayout:
    """The layout of an MMA operand in TMEM; ``ValueError`` for shapes tcgen05
    cannot hold."""
    if len(shape) != 2:
        raise ValueError(f"TMEM can only represent 2D shapes, got {shape}")
    if packing > 8 or packing.bit_count() != 1:
        raise ValueError(f"Packing must be <= 8 and a power of 2, got: {packing}")
    rows, columns = shape
    if columns % packing:
        raise ValueError(f"Minor dimension of shape must be divisible by packing, got: {shape}")
    if rows == tcgen05.TMEM_ROWS:
        return tcgen05.tmem_default_layout(packing)
    if rows == tcgen05.TMEM_ROWS // 2:
        if collective:
            return tcgen05.tmem_m64_collective_layout(columns, packing)
        return tcgen05.tmem_half_lane_layout(columns, packing)
    raise ValueError(
        f"Unsupported shape: {shape}. TMEM references must have either "
        f"{tcgen05.TMEM_ROWS} or {tcgen05.TMEM_ROWS // 2} rows, but got {rows}.")


def fitting(op: ir.OpView, what: str, shape: tuple[int, ...],
            layout: tcgen05.TMEMLayout, *, cast: bool = False) -> TmemLayout:
    """``layout`` as a constant, checked to fit the ``what`` of ``op``
    (``cast``: the layout a ``tmem_layout_cast`` asks for; jax words it so)."""
    if not tmem_layout_fits(shape, layout):
        if cast:
            message = (f"Cannot cast to TMEM layout {layout} in {op.operation.name}: the layout "
                       f"is not compatible with the operand shape {shape}.")
        else:
            message = (f"Cannot assign TMEM layout {layout} to the {what} of "
                       f"{op.operation.name}: the layout is not compatible with the shape "
                       f"{shape}.")
        raise SmaltiValueError(
            "SM143",
            message,
            op=op, values={what: shape, "tile": tuple(layout.base_tile_shape)},
            fix=f"give the {what} a shape whose dims are multiples of "
                f"{tuple(layout.base_tile_shape)}")
    return TmemLayout(layout)


def required_mma_layout(op: ir.OpView, what: str, value: ir.Value, collective: bool,
                        packing: int) -> TmemLayout:
    """The TMEM layout an MMA operand of ``value``'s shape must have."""
    shape = tuple(ir.ShapedType(value.type).shape)
    try:
        layout = mma_tmem_layout(shape, collective, packing)
    except ValueError as e:
        raise SmaltiValueError(
            "SM143", f"The {what} of {op.operation.name} cannot live in TMEM: {e}",
            op=op, values={what: str(value.type)},
            fix="allocate TMEM of 128 rows (64 rows for an M=64 MMA), with a column count "
                "that is a multiple of 16") from None
    return fitting(op, what, shape, layout)
