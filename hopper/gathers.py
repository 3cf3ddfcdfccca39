"""TMA gathers and scatters on GMEM refs of more than two dimensions.

The ``gather4`` / ``scatter4`` TMA instructions move whole rows of a 2-D
tensor. jax accepts only 2-D GMEM refs; smalti also takes an N-D ref whose
gathered dimension is the leading one when the rest of each gathered row is
one contiguous run of memory — e.g. ``x_gmem.at[idx]`` on a ``(B, R, C)``
ref, or ``x_gmem.at[idx, r]``. It collapses the trailing dimensions into one
row and issues the 2-D gather on ``(B, R * C)``: the GMEM side through a
collapsed view of the kernel argument (which the TMA descriptor describes),
the SMEM side by folding the (untiled, or ``(T, 1, ..., 1, t)``-tiled) SMEM
ref the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith
from jax.experimental.mosaic.gpu import launch_context as lc
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.constraints import Constraint, Expression, SearchContext, Variable, describe
from smalti.diagnostics import SmaltiNotImplementedError
from smalti.layouts import Constant, SmemTransforms
from smalti.records import Record

# The widest row a gather moves without an SMEM tiling (jax's limit, in elements).
MAX_UNTILED_ROW = 256
_SWIZZLES = (128, 64, 32)


class Collapse(Record):
    """How an N-D gather/scatter becomes a 2-D one."""

    __slots__ = ("gmem_shape", "rows", "row_length", "smem_shape")
    gmem_shape: tuple[int, ...]  # the N-D GMEM ref
    rows: int  # gathered rows (length of the index vector)
    row_length: int  # elements of one gathered row, after collapsing
    smem_shape: tuple[int, ...]  # the (logical) SMEM ref: rows, then the kept dims

    def __init__(self, gmem_shape: tuple[int, ...], rows: int, row_length: int,
                 smem_shape: tuple[int, ...]) -> None:
        self._set(gmem_shape, rows, row_length, smem_shape)

    @property
    def collapsed_gmem_shape(self) -> tuple[int, int]:
        return self.gmem_shape[0], math.prod(self.gmem_shape[1:])


def _constant(value: ir.Value) -> int | None:
    owner = value.owner
    if not isinstance(owner, ir.Block) and isinstance(owner.opview, arith.ConstantOp):
        return int(owner.opview.literal_value)
    return None


def plan(op: Any, gmem_type: ir.MemRefType) -> Collapse | None:
    """The collapse of a gather/scatter on an N-D GMEM ref (``None`` for 2-D).

    Raises SM120 where the selected part of a row is not contiguous.
    """
    shape = tuple(gmem_type.shape)
    if len(shape) <= 2:
        return None
    lengths = list(op.slice_lengths)
    indices = list(op.indices)
    # From the minor end: full dims, then at most one partial dim, then only
    # single elements — what remains is one contiguous run per gathered row.
    partial_seen = False
    for dim in range(len(shape) - 1, 0, -1):
        size = 1 if lengths[dim] == -1 else lengths[dim]
        full = size == shape[dim] and _constant(indices[dim]) == 0
        if partial_seen and size != 1:
            raise SmaltiNotImplementedError(
                "SM120",
                f"Only 2D gathers/scatters for async load/store are supported, and this "
                f"{len(shape)}-D GMEM ref cannot be collapsed to 2-D: dimension {dim} "
                f"(slice length {size} of {shape[dim]}) is sliced while a later dimension "
                "is only partly copied, so a gathered row is not contiguous in GMEM",
                op=op, values={"GMEM shape": list(shape), "slice_lengths": lengths},
                fix="copy the full extent of every dimension after the first partly "
                    "copied one, or reshape the GMEM ref to 2-D yourself")
        if not full:
            partial_seen = True
    if _strides(gmem_type) != mgpu_utils.get_contiguous_strides(shape):
        raise SmaltiNotImplementedError(
            "SM120", "Only 2D gathers/scatters for async load/store are supported, and this "
            f"{len(shape)}-D GMEM ref is not contiguous, so it cannot be collapsed to 2-D",
            op=op, values={"GMEM shape": list(shape)},
            fix="gather from a contiguous GMEM ref (a kernel argument)")
    kept = tuple(s for s in lengths[1:] if s != -1)
    row_length = math.prod(1 if s == -1 else s for s in lengths[1:])
    return Collapse(shape, lengths[0], row_length, (lengths[0], *kept))


def _strides(ty: ir.MemRefType) -> list[int]:
    strides, _ = ty.get_strides_and_offset()
    return list(strides)


def tiling_allowed(collapse: Collapse, transforms: SmemTransforms, divisor: int) -> bool:
    """Whether the SMEM ref's transforms survive the collapse unchanged.

    Untiled (unswizzled) refs fold freely, up to the widest untiled row; a
    tiling ``(T, 1, ..., 1, t)`` of full rank is physically the 2-D tiling
    ``(T, t)`` of the collapsed ref.
    """
    tiling = transforms.tiling
    if tiling is None:
        return transforms.swizzle in (None, 16) and collapse.row_length <= MAX_UNTILED_ROW
    rank = len(collapse.smem_shape)
    if len(tiling) != rank or any(t != 1 for t in tiling[1:-1]):
        return False
    rows, minor = tiling[0], tiling[-1]
    return (collapse.rows % rows == 0 and collapse.smem_shape[-1] % minor == 0
            and minor % divisor == 0)


class CollapsibleGatherTiling(Record, Constraint):
    """The SMEM side of an N-D gather/scatter folds to a 2-D ref (see :func:`tiling_allowed`)."""

    __slots__ = ("expr", "collapse", "divisor", "bitwidth")
    expr: Expression
    collapse: Collapse
    divisor: int  # elements per 256 bits: gathered rows are 256-bit aligned
    bitwidth: int

    def __init__(self, expr: Expression, collapse: Collapse, divisor: int,
                 bitwidth: int) -> None:
        self._set(expr, collapse, divisor, bitwidth)

    def expressions(self) -> tuple[Expression, ...]:
        return (self.expr,)

    def check(self, values: tuple[Constant, ...]) -> bool:
        (value,) = values
        return isinstance(value, SmemTransforms) and tiling_allowed(
            self.collapse, value, self.divisor)

    def candidates(self, ctx: SearchContext) -> Iterator[tuple[Variable, SmemTransforms]]:
        if not isinstance(self.expr, Variable):
            return
        options = [SmemTransforms(None, None)]
        rank = len(self.collapse.smem_shape)
        for swizzle in _SWIZZLES:
            minor = swizzle * 8 // self.bitwidth
            options.append(SmemTransforms((8, *[1] * (rank - 2), minor), swizzle))
        for value in options:
            if tiling_allowed(self.collapse, value, self.divisor):
                yield self.expr, value

    def __str__(self) -> str:
        return (f"{describe(self.expr)} is untiled or tiled (T, 1, ..., 1, t) so that "
                f"the SMEM ref {list(self.collapse.smem_shape)} folds to "
                f"({self.collapse.rows}, {self.collapse.row_length})")


# --- lowering -------------------------------------------------------------------------


def _kernel_argument(ref: ir.Value) -> ir.Value | None:
    # Refs captured by nested regions are block arguments: follow them up.
    while isinstance(ref, ir.BlockArgument):
        ref = ref.owner.owner.operands[ref.arg_number]
    if isinstance(ref.owner, ir.Block):
        return None
    if lc.ORIGINAL_KERNEL_ARG_ATTR not in ref.owner.attributes:
        return None
    return ref


def collapsed_gmem(argument_ref: ir.Value, collapse: Collapse) -> ir.Value | None:
    """A 2-D view of the GMEM kernel argument, made next to the argument so
    that the host code building the TMA descriptor can use it; ``None`` when
    the ref is not a kernel argument."""
    argument = _kernel_argument(argument_ref)
    if argument is None:
        return None
    ty = ir.MemRefType(argument.type)
    target = ir.MemRefType.get(collapse.collapsed_gmem_shape, ty.element_type,
                               memory_space=ty.memory_space)
    for use in argument.uses:  # one view per argument and shape: one descriptor
        user = use.owner
        if (user.name == "memref.collapse_shape" and user.results[0].type == target
                and lc.ORIGINAL_KERNEL_ARG_ATTR in user.attributes):
            return user.results[0]
    with ir.InsertionPoint.after(argument.owner), argument.owner.location:
        view = mgpu_utils.memref_fold(argument, 1, len(ty.shape) - 1)
    # jax finds TMA descriptors' GMEM refs by this mark (set on kernel arguments).
    view.owner.attributes[lc.ORIGINAL_KERNEL_ARG_ATTR] = ir.UnitAttr.get()
    if lc.KERNEL_ARG_ID_ATTR in argument.owner.attributes:
        view.owner.attributes[lc.KERNEL_ARG_ID_ATTR] = argument.owner.attributes[
            lc.KERNEL_ARG_ID_ATTR]
    return view


def _as_index_value(v: int | ir.Value, index: ir.Type) -> ir.Value:
    return mgpu_utils.c(v, index) if isinstance(v, int) else v


def collapsed_slice(op: Any, collapse: Collapse, rows: Any) -> tuple:
    """The 2-D GMEM slice: the gathered rows, then one run of the row."""
    index = ir.IndexType.get()
    start: ir.Value | int = 0
    stride = 1
    for dim in range(len(collapse.gmem_shape) - 1, 0, -1):
        value = op.indices[dim]
        constant = _constant(value)
        if constant != 0:
            term = (constant * stride if constant is not None else arith.muli(
                arith.index_cast(index, value), mgpu_utils.c(stride, index)))
            if isinstance(start, int) and isinstance(term, int):
                start += term
            else:
                start = arith.addi(_as_index_value(start, index), _as_index_value(term, index))
        stride *= collapse.gmem_shape[dim]
    return rows, mgpu_utils.DynamicSlice(start, collapse.row_length)


def collapsed_smem(physical: ir.Value, collapse: Collapse,
                   transforms: SmemTransforms) -> tuple[ir.Value, tuple]:
    """The physical SMEM ref folded like the GMEM one, and the 2-D GMEM transforms."""
    rows, row = collapse.rows, collapse.row_length
    if transforms.tiling is None:
        return mgpu_utils.memref_reshape(physical, (rows, row)), ()
    tile_rows, tile_minor = transforms.tiling[0], transforms.tiling[-1]
    shape = (rows // tile_rows, row // tile_minor, tile_rows, tile_minor)
    return (mgpu_utils.memref_reshape(physical, shape),
            (lc.TileTransform((tile_rows, tile_minor)),))
