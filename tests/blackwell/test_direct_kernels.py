"""TMEM ops in hand-built Mosaic GPU kernels: smalti's attributes and IR equal jax's."""

from __future__ import annotations

import pytest
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import tcgen05

import smalti
from tests.blackwell.kit import BLACKWELL, alloc, build, tmem_type
from tests.differential import jax_infer, jax_lower, normalized


def same_as_jax(body, **kw) -> str:
    reference, candidate = build(body, **kw), build(body, **kw)
    jax_infer(reference, BLACKWELL)
    smalti.infer_layouts(candidate.module, arch=BLACKWELL)
    assert normalized(candidate.module) == normalized(reference.module), "inferred layouts differ"
    inferred = normalized(candidate.module)
    jax_lower(reference)
    smalti.lower(candidate.module, candidate.launch_context, arch=BLACKWELL)
    assert normalized(candidate.module) == normalized(reference.module), "lowered IR differs"
    return inferred


@pytest.mark.parametrize("collective", [False, True])
def test_alloc_store_load_dealloc(collective):
    def body(x_ref, o_ref, address):
        tmem = alloc(address, collective=collective)
        mgpu.TmemRelinquishAllocPermitOp(collective=collective)
        mgpu.AsyncStoreTmemOp(mgpu.vector_load(x_ref), tmem)
        mgpu.vector_store(mgpu.AsyncLoadTmemOp(tmem).results[0], o_ref)
        mgpu.TmemDeallocOp(tmem)

    cluster = (2, 1, 1) if collective else (1, 1, 1)
    inferred = same_as_jax(body, grid=cluster, cluster=cluster)
    assert "TiledLayout<[[128, 1], [32, 1]]" in inferred  # the default TMEM layout


@pytest.mark.parametrize("layout", ["default", "half-lane", "m64-collective"])
def test_layout_cast_then_slice(layout):
    """A 64-row ref: its layout comes from the cast, and the slices share it by alias."""
    layouts = {"default": tcgen05.tmem_default_layout(1),
               "half-lane": tcgen05.tmem_half_lane_layout(128),
               "m64-collective": tcgen05.tmem_m64_collective_layout(128)}
    rows = 128 if layout == "default" else 64

    def body(x_ref, o_ref, address):
        tmem = alloc(address, (128, 256))
        attr = mgpu_layouts.to_layout_attr(layouts[layout])
        views = [mgpu.tmem_layout_cast(
            mgpu.SliceTmemOp(tmem_type((rows, 128)), tmem, offset, alias_id=1).result, attr)
            for offset in (0, 128)]
        del x_ref, o_ref
        for view in views:
            mgpu.AsyncLoadTmemOp(view)
        mgpu.TmemDeallocOp(tmem)

    same_as_jax(body)
