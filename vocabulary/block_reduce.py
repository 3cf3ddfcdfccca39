"""A block in WGMMA's registers reduced to a scalar that every thread of the
warpgroup holds, through a scratch slice of its own warpgroup.

The vocabulary's sorts choose their paths at run time from block-wide
scalars (the screen's smallest magnitude, the quantized keys' scale, the
test of neighbours). Pallas' reduction to a scalar reserves one scratch
for the whole kernel, which warpgroups reducing at once share (a race),
and spends about a further instruction per element of a (64, 128) block
on the warps' partial results; :func:`block_reduce` is the same reduction
on the warpgroup's own scratch slice
(:func:`smalti.vocabulary.rows.scratch_for`), so the sorts screen in
kernels of several Pallas warpgroups too.

How (a ``plgpu.inline_mgpu`` body): each thread combines its registers
(one operation per element), then the two halves of its last register;
five butterfly shuffles combine the warp's 32 lanes; one elected lane per
warp stores the warp's value in the scratch; after a warpgroup barrier
every thread loads the four values (one 16-byte load, the same address
in every lane: one wavefront) and combines them; a second barrier keeps
the scratch until every thread has read it. The result leaves the body as
a one-element splat, which ``vector.extract`` makes the scalar.

Operations: ``max`` and ``min`` of float32, bfloat16 and float16 (IEEE
754-2019 maximum and minimum: a NaN anywhere is the result, as
``jnp.max``'s; 16-bit registers two elements to an instruction), of int32
and of uint32, and the ``sum`` of int32 (wrapping, as jnp's; float sums would
not be jnp's in another order, so there are none). Where it does not apply
-- another type, a value not in WGMMA's layout, no free scratch slice --
it is jnp's reduction (jax's rule), also its CPU implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core as jax_core
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, memref, vector
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

from smalti.vocabulary import lanes, smem_transpose
from smalti.vocabulary.annotations import Aval, EstimatorContext, Lowered, Operand, PallasContext
from smalti.vocabulary.lane_scan import combiner
from smalti.vocabulary.rows import Scratch, scratch_for

__all__ = ["block_reduce", "block_reduce_p", "reduce", "takes", "OPERATIONS", "JNP", "lower",
           "estimate", "SCRATCH_BYTES"]

#: The operations and the types each takes.
_EXTREMA = tuple(np.dtype(d) for d in (np.float32, jnp.bfloat16, np.float16, np.int32, np.uint32))
OPERATIONS: dict[str, tuple[np.dtype, ...]] = {
    "max": _EXTREMA, "min": _EXTREMA, "sum": (np.dtype(np.int32),),
}
WARPS = mgpu_utils.WARPGROUP_SIZE // mgpu_utils.WARP_SIZE
SCRATCH_BYTES = 4 * WARPS  # a 4-byte partial result per warp

block_reduce_p = jax_core.Primitive("smalti_block_reduce")


def block_reduce(x: jax.Array, op: str) -> jax.Array:
    """``jnp.max``, ``jnp.min`` or ``jnp.sum`` (``op``) of a whole block, a
    scalar (see the module docstring for the types)."""
    x = jnp.asarray(x)
    if op not in OPERATIONS or np.dtype(x.dtype) not in OPERATIONS[op]:
        raise ValueError(f"block_reduce: {op!r} of {x.dtype} is not one of "
                         + ", ".join(f"{o} of {'/'.join(d.name for d in ds)}"
                                     for o, ds in OPERATIONS.items()))
    return block_reduce_p.bind(x, op=op)


@block_reduce_p.def_abstract_eval
def _abstract_eval(x: Aval, *, op: str) -> Aval:
    del op
    return jax_core.ShapedArray((), x.dtype)


#: jnp's reduction of each operation: the CPU implementation and the fallback.
JNP: dict[str, Callable[[jax.Array], jax.Array]] = {"max": jnp.max, "min": jnp.min,
                                                     "sum": jnp.sum}


def _reduce_f(x: jax.Array, *, op: str) -> jax.Array:
    return JNP[op](x)


def takes(op: str, dtype: Any) -> bool:
    """Whether :func:`block_reduce` does ``op`` of ``dtype``."""
    return np.dtype(dtype) in OPERATIONS[op]


def reduce(x: jax.Array, op: str) -> jax.Array:
    """``op`` of a whole block: :func:`block_reduce` where it :func:`takes`
    the type, jnp's reduction (Pallas' rule: one scratch for the kernel's
    warpgroups) otherwise."""
    return block_reduce(x, op) if takes(op, x.dtype) else JNP[op](x)


block_reduce_p.def_impl(_reduce_f)
mlir.register_lowering(block_reduce_p, mlir.lower_fun(_reduce_f, multiple_results=False))


def lower(ctx: PallasContext, x: Operand, *, op: str) -> Lowered:
    """The register path where the block is 2-D in WGMMA's layout and the
    warpgroup's scratch slice is free; jnp's reduction otherwise."""
    [aval] = ctx.avals_in
    scratch = None
    if aval.ndim == 2 and lanes.fits(aval, x):
        scratch = scratch_for(ctx, aval.update(shape=(SCRATCH_BYTES,), dtype=np.dtype(np.uint8)))
    if scratch is None:
        return pallas_lowering._lower_fun(partial(_reduce_f, op=op))(ctx, x)
    splat = lanes.on_registers(ctx, x, (1,), lambda value: _reduce_registers(value, op, scratch),
                               out_layout=plgpu.Layout.WG_SPLAT(shape=(1,)))
    return vector.extract(splat, dynamic_position=[], static_position=[0])


def estimate(ctx: EstimatorContext, aval: Aval, **params: Any) -> pallas_lowering.Resources:
    """A word per warp, once per Pallas warpgroup."""
    del aval, params
    count = smem_transpose.warpgroups(getattr(ctx, "axis_names", None))
    return pallas_lowering.Resources(smem_scratch_bytes=count * SCRATCH_BYTES)


def _reduce_registers(x: fa.FragmentedArray, op: str, scratch: Scratch) -> fa.FragmentedArray:
    """The module docstring's steps on a WGMMA-layout array."""
    registers = list(x.registers.flat)
    element = ir.VectorType(registers[0].type).element_type
    combine = combiner("add" if op == "sum" else op, element, x.is_signed)
    index = ir.IndexType.get()
    # this thread's registers, then the two halves of the last
    mine = registers[0]
    for register in registers[1:]:
        mine = combine(mine, register)
    value = combine(lanes.extract(mine, 0), lanes.extract(mine, 1))
    # the warp's lanes
    for distance in (1, 2, 4, 8, 16):
        value = combine(value, mgpu_utils.shfl_bfly(value, distance))
    # the warpgroup's warps, through its scratch slice
    view = scratch.view((WARPS,), element)
    i32 = ir.IntegerType.get_signless(32)
    warp = arith.index_cast(index, arith.remui(mgpu_utils.warp_idx(sync=False),
                                               mgpu_utils.c(WARPS, i32)))
    mgpu_utils.warpgroup_barrier()  # earlier reads of the scratch are done
    with mgpu_utils.single_thread(mgpu_utils.ThreadSubset.WARP):
        memref.store(value, view, [warp])
    mgpu_utils.warpgroup_barrier()  # every warp's value is visible
    partials = vector.load(ir.VectorType.get([WARPS], element), view, [mgpu_utils.c(0, index)])
    value = lanes.extract(partials, 0)
    for k in range(1, WARPS):
        value = combine(value, lanes.extract(partials, k))
    mgpu_utils.warpgroup_barrier()  # every read is done before the scratch is reused
    return fa.FragmentedArray.splat(value, (1,), is_signed=x.is_signed)
