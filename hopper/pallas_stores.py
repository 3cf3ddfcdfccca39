"""Pallas' ``plgpu.async_store_smem`` of a scalar, which jax refuses.

``st.async ... mbarrier::complete_tx::bytes`` stores one 32- or 64-bit value
into a cluster peer's SMEM and completes that many bytes on the peer's
barrier, so a single element needs no vector layout at all. smalti's Pallas
lowering of ``async_store_smem_p`` emits, for a scalar, a
``mosaic_gpu.custom_primitive`` whose (Lane-level) body has every thread of
the warpgroup arrive on the peer's barrier — one of them expecting the
element's bytes — and that one thread issue the ``st.async``. Every other
case goes to jax's own lowering, so those modules stay exactly jax's.
"""

from __future__ import annotations

from typing import Any

from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, gpu, llvm
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering
from jax._src.pallas.mosaic_gpu import primitives as pallas_primitives
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.diagnostics import SmaltiNotImplementedError, format_location

# The original Pallas rule (both semantics), for every non-scalar store.
_jax_lowering = pallas_primitives._async_store_smem_lowering

# st.async moves .b32 and .b64 values (PTX ISA, "st.async").
_PTX_TYPES = {32: ("b32", "r"), 64: ("b64", "l")}


def lower_async_store_smem(ctx: Any, src: Any, ref: Any, barrier: Any, cluster_idx: Any,
                           *flat_transforms: Any, ref_transforms_treedef: Any,
                           barrier_transforms_treedef: Any, cluster_dim: Any, optimized: Any,
                           atomic: Any) -> Any:
    """Pallas lowering of ``async_store_smem_p``: scalars here, the rest by jax."""
    params = dict(ref_transforms_treedef=ref_transforms_treedef,
                  barrier_transforms_treedef=barrier_transforms_treedef,
                  cluster_dim=cluster_dim, optimized=optimized, atomic=atomic)
    aval = ctx.avals_in[0]
    if aval.shape or ctx.module_ctx.lowering_semantics != mgpu.LoweringSemantics.Warpgroup:
        return _jax_lowering(ctx, src, ref, barrier, cluster_idx, *flat_transforms, **params)
    element_type = mgpu_utils.dtype_to_ir_type(aval.dtype)
    bitwidth = mgpu_utils.bitwidth(element_type)
    if bitwidth not in _PTX_TYPES or atomic is not None:
        what = (f"an atomic ({atomic}) store" if atomic is not None
                else f"a {bitwidth}-bit element ({aval.dtype})")
        raise SmaltiNotImplementedError(
            "SM122",
            f"Scalars are not supported in async_store_smem (plgpu.async_store_smem) for "
            f"{what}: st.async stores single 32- or 64-bit values only, without a "
            "reduction", location=_location(),
            values={"dtype": str(aval.dtype), "atomic": atomic},
            fix=["store the scalar with a plain SMEM store (`ref[...] = x`) and "
                 "synchronize with a barrier",
                 "or store a 1-D value (e.g. `x[None]` into `ref.at[pl.ds(i, 1)]`)"])
    ref_smem, barrier_memref, cluster_index = _operands(
        ctx, ref, barrier, cluster_idx, flat_transforms, ref_transforms_treedef,
        barrier_transforms_treedef)
    dimension = pallas_lowering._resolve_cluster_axis(ctx.module_ctx.axis_names, cluster_dim)
    value = pallas_lowering._ensure_ir_value(src, aval.dtype)
    _emit(value, ref_smem, barrier_memref, cluster_index, dimension, bitwidth)
    return ()


def _location() -> str | None:
    """The user's line being lowered (Pallas sets it as the current location)."""
    try:
        return format_location(ir.Location.current)
    except ValueError:  # no location in scope
        return None


def _operands(ctx: Any, ref: Any, barrier: Any, cluster_idx: Any, flat_transforms: Any,
              ref_treedef: Any, barrier_treedef: Any) -> tuple[ir.Value, ir.Value, ir.Value]:
    """The 0-D SMEM ref stored to, the barrier memref and the peer's index,
    with the Pallas transforms applied the way jax's rule applies them."""
    ref_transforms, barrier_transforms = (
        flat_transforms[:ref_treedef.num_leaves], flat_transforms[ref_treedef.num_leaves:])
    ref_transform_avals = ref_treedef.unflatten(ctx.avals_in[4:4 + ref_treedef.num_leaves])
    ref_smem, _, remaining = pallas_lowering._handle_transforms(
        ctx, ctx.avals_in[1], ref, ref_transform_avals,
        ref_treedef.unflatten(ref_transforms), handle_transposes=True)
    if remaining:
        raise ValueError(f"Unexpected unhandled transforms: {remaining}")
    base_index = pallas_primitives._get_barrier_base_index(
        ctx.avals_in[2], barrier_treedef.unflatten(barrier_transforms))
    if base_index is not None:
        barrier = barrier[base_index]
    return ref_smem, barrier.as_barrier_memref(), pallas_lowering._as_index(cluster_idx)


def _emit(value: ir.Value, ref: ir.Value, barrier: ir.Value, cluster_index: ir.Value,
          dimension: gpu.Dimension, bitwidth: int) -> None:
    """A custom primitive storing ``value`` to ``ref`` in cluster block
    ``cluster_index`` along ``dimension``."""
    operands = [value, ref, barrier, cluster_index]
    op = mgpu.dialect.CustomPrimitiveOp(
        result=[], operands_=operands, in_layouts=[],
        # The 0-D ref and the barrier are never tiled (the dialect wants an
        # entry for each SMEM memref, barriers included).
        in_transforms=[ir.ArrayAttr.get([]), ir.ArrayAttr.get([])],
        out_layouts=[])
    block = op.body.blocks.append(*[v.type for v in operands])
    with ir.InsertionPoint(block):
        _store_body(*block.arguments, dimension=dimension, bitwidth=bitwidth)
        mgpu.dialect.ReturnOp(operands_=[])


def _store_body(value: ir.Value, ref: ir.Value, barrier: ir.Value, cluster_index: ir.Value, *,
                dimension: gpu.Dimension, bitwidth: int) -> None:
    """Lane-level: all threads arrive on the peer's barrier (it counts the
    warpgroup's arrivals), one expecting the bytes, and that one stores."""
    i32 = ir.IntegerType.get_signless(32)
    ptx_type, constraint = _PTX_TYPES[bitwidth]
    leader = mgpu_utils.single_thread_predicate(mgpu_utils.ThreadSubset.WARPGROUP)
    local_barrier = mgpu_utils.DialectBarrierRef.from_barrier_memref(barrier).barrier_ref
    peer_barrier = local_barrier.remap_to_cluster(dimension, cluster_index)
    expected = arith.select(leader, mgpu_utils.c(bitwidth // 8, i32), mgpu_utils.c(0, i32))
    peer_barrier.arrive_expect_tx(expected)
    blocks = [gpu.cluster_block_id(d) for d in gpu.Dimension]
    blocks[dimension] = cluster_index
    peer = arith.index_cast(i32, mgpu_utils.cluster_idx(tuple(gpu.Dimension), blocks))
    address = mgpu_utils.get_cluster_ptr(mgpu_utils.memref_ptr(ref), peer, generic=False)
    bits = ir.IntegerType.get_signless(bitwidth)
    if value.type != bits:
        value = arith.bitcast(bits, value)
    llvm.inline_asm(
        ir.Type.parse("!llvm.void"),
        [leader, address, value, peer_barrier.get_ptr()],
        f"@$0 st.async.cluster.shared::cluster.mbarrier::complete_tx::bytes.{ptx_type} "
        "[$1], $2, [$3];",
        f"b,l,{constraint},l",
        has_side_effects=True,
    )
