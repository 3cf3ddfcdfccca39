"""smalti's Hopper (sm_90a) plugin: TMA copies, expect-tx barriers,
``async_store_smem`` and WGMMA.

Registered through the ``smalti`` entry-point group like any other plugin.
TMA rules hold from sm_90 on (Blackwell has TMA too); WGMMA exists on sm_90a
only.
"""

from __future__ import annotations

from typing import Any

from smalti.hookspec import hookimpl
from smalti.hopper import smem_stores, tma, wgmma
from smalti.plugins.versions import BEFORE_0_12, SINCE_0_12
from smalti.registry import (
    HOPPER_AND_LATER,
    Architectures,
    ConstraintRegistry,
    LoweringOptions,
    LoweringRegistry,
    PallasRegistry,
)

SMALTI_HOOK_VERSION = 1
SM90_ONLY = Architectures(minimum=(9, 0), maximum=(9, 0))


@hookimpl
def smalti_register_constraint_rules(registry: ConstraintRegistry) -> None:
    tma_rule = registry.constraint_rule
    tma_rule("mosaic_gpu.async_load", "mosaic_gpu.async_store", archs=HOPPER_AND_LATER)(
        tma.async_copy)
    tma_rule("mosaic_gpu.async_prefetch", archs=HOPPER_AND_LATER)(tma.prefetch)
    tma_rule("mosaic_gpu.async_store_smem", archs=HOPPER_AND_LATER, jax=SINCE_0_12)(
        smem_stores.async_store_smem)
    tma_rule("mosaic_gpu.async_store_smem", archs=HOPPER_AND_LATER, jax=BEFORE_0_12)(
        smem_stores.async_store_smem_jax_0_11)
    tma_rule("mosaic_gpu.wgmma", archs=SM90_ONLY)(wgmma.wgmma)


@hookimpl
def smalti_register_lowering_rules(registry: LoweringRegistry) -> None:
    rule = registry.lowering_rule
    # TMA copies and expect-tx arrivals may also be issued by a single warp.
    warp: LoweringOptions = {"archs": HOPPER_AND_LATER, "warp_semantics": True}
    warp_since_0_12: LoweringOptions = {**warp, "jax": SINCE_0_12}
    warp_before_0_12: LoweringOptions = {**warp, "jax": BEFORE_0_12}
    rule("mosaic_gpu.async_load", **warp)(tma.lower_async_load)
    rule("mosaic_gpu.async_store", **warp)(tma.lower_async_store)
    rule("mosaic_gpu.async_prefetch", **warp)(tma.lower_async_prefetch)
    rule("mosaic_gpu.arrive_expect_tx", **warp_since_0_12)(tma.lower_arrive_expect_tx)
    rule("mosaic_gpu.arrive_expect_tx", **warp_before_0_12)(
        tma.lower_arrive_expect_tx_jax_0_11)
    rule("mosaic_gpu.async_store_smem", archs=HOPPER_AND_LATER, jax=SINCE_0_12)(
        smem_stores.lower_async_store_smem)
    rule("mosaic_gpu.async_store_smem", archs=HOPPER_AND_LATER, jax=BEFORE_0_12)(
        smem_stores.lower_async_store_smem_jax_0_11)
    rule("mosaic_gpu.wgmma", archs=SM90_ONLY)(wgmma.lower_wgmma)


@hookimpl
def smalti_register_pallas_lowerings(registry: PallasRegistry) -> None:
    # Scalars (which jax refuses) by st.async; everything else by jax's rule.
    # Referenced by name: Pallas is only imported once smalti is installed.
    registry.pallas_lowering("jax._src.pallas.mosaic_gpu.primitives:async_store_smem_p")(
        _lower_async_store_smem)


def _lower_async_store_smem(ctx: Any, *args: Any, **params: Any) -> Any:
    from smalti.hopper import pallas_stores  # imports Pallas

    return pallas_stores.lower_async_store_smem(ctx, *args, **params)
