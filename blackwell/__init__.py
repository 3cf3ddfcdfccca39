"""smalti's Blackwell (sm_100a) plugin: tcgen05 MMA and tensor memory.

Registered through the ``smalti`` entry-point group like any other plugin.
tcgen05 and TMEM exist on the data-center Blackwell family (sm_100 to
sm_110), not on sm_120; cluster launch control exists from sm_100 on.
"""

from __future__ import annotations

from smalti.blackwell import cluster_launch_control, mma, smem_to_tmem, tmem
from smalti.hookspec import hookimpl
from smalti.plugins.versions import BEFORE_0_12, SINCE_0_12
from smalti.registry import (
    BLACKWELL_AND_LATER,
    Architectures,
    ConstraintRegistry,
    LoweringOptions,
    LoweringRegistry,
)

SMALTI_HOOK_VERSION = 1
#: Where tcgen05 and tensor memory exist.
TCGEN05 = Architectures(minimum=(10, 0), maximum=(11, 0))


@hookimpl
def smalti_register_constraint_rules(registry: ConstraintRegistry) -> None:
    rule = registry.constraint_rule
    rule("mosaic_gpu.tmem_alloc", archs=TCGEN05)(tmem.tmem_alloc)
    rule("mosaic_gpu.tmem_dealloc", archs=TCGEN05)(tmem.tmem_dealloc)
    rule("mosaic_gpu.tmem_layout_cast", archs=TCGEN05)(tmem.tmem_layout_cast)
    rule("mosaic_gpu.slice_tmem", archs=TCGEN05)(tmem.slice_tmem)
    rule("mosaic_gpu.async_load_tmem", archs=TCGEN05)(tmem.async_load_tmem)
    rule("mosaic_gpu.async_store_tmem", archs=TCGEN05)(tmem.async_store_tmem)
    rule("mosaic_gpu.async_store_smem_to_tmem", archs=TCGEN05)(
        smem_to_tmem.async_store_smem_to_tmem)
    rule("mosaic_gpu.async_store_scales_smem_to_tmem", archs=TCGEN05)(
        smem_to_tmem.async_store_scales_smem_to_tmem)
    rule("mosaic_gpu.async_store_sparse_metadata_smem_to_tmem", archs=TCGEN05)(
        smem_to_tmem.async_store_sparse_metadata_smem_to_tmem)
    rule("mosaic_gpu.tcgen05_mma", archs=TCGEN05)(mma.tcgen05_mma)
    rule("mosaic_gpu.try_cluster_cancel", "mosaic_gpu.query_cluster_cancel",
         archs=BLACKWELL_AND_LATER)(cluster_launch_control.cancellation_result)


@hookimpl
def smalti_register_lowering_rules(registry: LoweringRegistry) -> None:
    rule = registry.lowering_rule
    # Like jax: views, SMEM-to-TMEM copies, MMAs and commits may also be
    # issued by a single warp (inside mosaic_gpu.warp_map).
    warp: LoweringOptions = {"archs": TCGEN05, "warp_semantics": True}
    warp_since_0_12: LoweringOptions = {**warp, "jax": SINCE_0_12}
    warp_before_0_12: LoweringOptions = {**warp, "jax": BEFORE_0_12}
    rule("mosaic_gpu.tmem_alloc", archs=TCGEN05)(tmem.lower_tmem_alloc)
    rule("mosaic_gpu.tmem_dealloc", archs=TCGEN05, check=tmem.check_tmem_dealloc)(
        tmem.lower_tmem_dealloc)
    rule("mosaic_gpu.tmem_relinquish_alloc_permit", archs=TCGEN05)(
        tmem.lower_tmem_relinquish_alloc_permit)
    rule("mosaic_gpu.tmem_layout_cast", **warp)(tmem.lower_tmem_layout_cast)
    rule("mosaic_gpu.slice_tmem", **warp)(tmem.lower_slice_tmem)
    rule("mosaic_gpu.async_load_tmem", archs=TCGEN05)(tmem.lower_async_load_tmem)
    rule("mosaic_gpu.async_store_tmem", archs=TCGEN05)(tmem.lower_async_store_tmem)
    rule("mosaic_gpu.async_store_smem_to_tmem", **warp)(
        smem_to_tmem.lower_async_store_smem_to_tmem)
    rule("mosaic_gpu.async_store_scales_smem_to_tmem", **warp)(
        smem_to_tmem.lower_async_store_scales_smem_to_tmem)
    rule("mosaic_gpu.async_store_sparse_metadata_smem_to_tmem", **warp)(
        smem_to_tmem.lower_async_store_sparse_metadata_smem_to_tmem)
    rule("mosaic_gpu.tcgen05_mma", **warp)(mma.lower_tcgen05_mma)
    rule("mosaic_gpu.tcgen05_commit_arrive", **warp_since_0_12)(
        mma.lower_tcgen05_commit_arrive)
    rule("mosaic_gpu.tcgen05_commit_arrive", **warp_before_0_12)(
        mma.lower_tcgen05_commit_arrive_jax_0_11)
    rule("mosaic_gpu.try_cluster_cancel", archs=BLACKWELL_AND_LATER)(
        cluster_launch_control.lower_try_cluster_cancel)
    rule("mosaic_gpu.query_cluster_cancel", archs=BLACKWELL_AND_LATER)(
        cluster_launch_control.lower_query_cluster_cancel)
