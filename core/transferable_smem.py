"""What can be copied between registers and shared memory, and how to guess
it: the probe behind the :class:`smalti.constraints.TransferableSmem`
constraint. (The rules of the ops that copy, ``vector_load`` and
``vector_store``, are in ``smalti.plugins.transfers``.)

Whether a register layout can be stored to (or loaded from) an SMEM ref with
given transforms is decided by Mosaic GPU's own transfer planner: we ask it to
plan the transfer for a stand-in ref, in a scratch module that is thrown
away. Answers are cached, as the same question recurs for every load and
store of a kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import cast

import numpy as np
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import builtin, func
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti import layouts
from smalti.layouts import SWIZZLES, SmemTransforms, Swizzle

_PLAN_FAILURES = (fa.TxMatrixIneligible, fa.TransferPlanDerivationError,
                  fa.UnsupportedTransferError)


def smem_transfer_supported(
    layout: fa.FragmentedLayout,
    smem: SmemTransforms,
    *,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    bitwidth: int,
    kind: str,
) -> bool:
    if not isinstance(layout, fa.TiledLayout):
        # Splat and strided values are only moved to and from plain refs.
        return smem.tiling is None and smem.swizzle is None
    untiled = smem.tiling is None
    tiling = shape if smem.tiling is None else smem.tiling
    optimized = kind != "unoptimized" and not (untiled and kind == "downgradable")
    return _plan_exists(
        layout, tuple(tiling), smem.swizzle, tuple(shape), tuple(strides), bitwidth, optimized,
    )


# Keyed by plain values only: the probe IR is built in the current context,
# but whether a plan exists does not depend on it (and a cached context
# would stay alive).
@functools.lru_cache(maxsize=4096)
def _plan_exists(
    layout: fa.TiledLayout,
    tiling: tuple[int, ...],
    swizzle: int | None,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    bitwidth: int,
    optimized: bool,
) -> bool:
    try:
        ref_strides = layouts.tiled_strides(strides, tiling)
    except ValueError:
        return False
    ref_shape = mgpu_utils.tile_shape(shape, tiling)
    element = ir.IntegerType.get_signless(bitwidth)
    ref_type = ir.MemRefType.get(
        ref_shape, element, ir.StridedLayoutAttr.get(0, ref_strides), mgpu_utils.smem()
    )
    with ir.Location.unknown():
        scratch = ir.Module.create()
        with ir.InsertionPoint(scratch.body):
            probe = func.FuncOp("smalti_transfer_probe", ir.FunctionType.get([], []))
            with ir.InsertionPoint(probe.add_entry_block()):
                ref = builtin.UnrealizedConversionCastOp([ref_type], []).results[0]
                for use_txmatrix in (True, False):
                    try:
                        next(
                            fa.FragmentedArray.transfer_tiled(
                                ref,
                                swizzle or 16,
                                layout,
                                shape,
                                optimized=optimized,
                                ref_tiling_rank=len(tiling),
                                use_txmatrix=use_txmatrix,
                            )
                        )
                    except _PLAN_FAILURES:
                        continue
                    return True
    return False


def smem_transforms_candidates(
    variable, divides: tuple[int, ...] | None
) -> Iterator[SmemTransforms]:
    """Tilings and swizzles worth trying for an SMEM ref that a tiled register
    value is copied to or from: (8, swizzle-wide) tiles of the two minor dims,
    widest swizzle first, narrowed by any divisibility requirement."""
    ref_type = ir.MemRefType(variable.type)
    shape = tuple(ref_type.shape)
    if len(shape) < 2:
        return
    bitwidth = mgpu_utils.bitwidth(ref_type.element_type)
    strides, _ = ref_type.get_strides_and_offset()
    rank = len(strides)
    order = np.argsort(strides)
    if {int(order[0]), int(order[1])} != {rank - 1, rank - 2}:
        return
    minor, second_minor = shape[order[0]], shape[order[1]]
    if second_minor % 8:
        return
    transposed = order[0] != rank - 1
    seen = set()
    for swizzle in SWIZZLES:
        elems = 8 * swizzle // bitwidth
        if minor % elems:
            continue
        tiling: tuple[int, ...] = (elems, 8) if transposed else (8, elems)
        if divides is not None:
            from smalti.constraints import merge_multiples

            tiling = merge_multiples(divides, tiling)
            elems = tiling[0] if transposed else tiling[-1]
            swizzle = elems * bitwidth // 8
            if swizzle not in SWIZZLES:
                continue
        candidate = SmemTransforms(tiling, cast(Swizzle, swizzle))  # one of SWIZZLES
        if candidate not in seen:
            seen.add(candidate)
            yield candidate
