"""Where jax's lowering refuses an annotated op, smalti refuses it with jax's
exception class and key phrase (and its own code, op and fix).

Each kernel carries its layouts by hand, as jax's own dialect tests write
them, so that lowering — not inference — meets the condition.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts
from jax.experimental.mosaic.gpu import utils as mgpu_utils

import smalti
from smalti import kernels
from tests.differential import jax_lower, normalized

BF16_128x128 = jax.ShapeDtypeStruct((128, 128), jnp.bfloat16)


def strided_load_from_swizzled_smem(ctx, x_ref, out_ref, smem_ref):
    ty = ir.MemRefType.get((128, 128), ir.BF16Type.get(), memory_space=mgpu_utils.smem())
    smem = mgpu.slice_smem(ty, 0)
    transforms = ir.ArrayAttr.get([ir.ArrayAttr.get([
        mgpu.TileTransformAttr.get((64, 64)), mgpu.SwizzleTransformAttr.get(128)])])
    smem.owner.attributes["out_transforms"] = transforms
    loaded = mgpu.vector_load(smem)
    strided = ir.ArrayAttr.get(
        [layouts.to_layout_attr(fa.WGStridedFragLayout.from_shaped_type(loaded.type))])
    loaded.owner.attributes["in_transforms"] = transforms
    loaded.owner.attributes["out_layouts"] = strided
    mgpu.vector_store(loaded, out_ref)
    store = list(ir.InsertionPoint.current.block.operations)[-1]
    store.attributes["in_layouts"] = strided


CASES = {
    "vector_load": (strided_load_from_swizzled_smem, NotImplementedError,
                    "Transformed or swizzled strided loads are not supported"),
}


def build(body) -> kernels.Kernel:
    return kernels.build_kernel(body, [BF16_128x128], [BF16_128x128],
                                smem_scratch=jax.ShapeDtypeStruct((128 * 128,), jnp.bfloat16))


@pytest.mark.parametrize("op", sorted(CASES))
def test_lowering_refuses_like_jax(op):
    body, error, phrase = CASES[op]
    with pytest.raises(error, match=phrase):
        jax_lower(build(body))
    kernel = build(body)
    before = normalized(kernel.module)
    with pytest.raises(smalti.SmaltiError) as raised:
        smalti.lower(kernel.module, kernel.launch_context)
    assert isinstance(raised.value, error), str(raised.value)
    assert phrase in raised.value.message
    assert raised.value.code == "SM203" and f"mosaic_gpu.{op}" in raised.value.op
    assert normalized(kernel.module) == before  # refused before the first rewrite
