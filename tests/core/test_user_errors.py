"""User errors: smalti errors with code, location and fix; the module is left unchanged."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts

import smalti
from smalti import kernels
from tests.differential import jax_infer

SHAPE = jax.ShapeDtypeStruct((128, 128), jnp.float32)


def cast_to(layout):
    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        y = mgpu.layout_cast(x, mgpu_layouts.to_layout_attr(layout))
        mgpu.vector_store(arith.addf(y, y), out_ref)

    return body


def conflicting_casts(ctx, x_ref, out_ref, smem):
    with ir.Location.file("kernel.py", 7, 5):
        x = mgpu.vector_load(x_ref)
    with ir.Location.file("kernel.py", 9, 5):
        y = mgpu.layout_cast(x, mgpu_layouts.to_layout_attr(fa.WGMMA_LAYOUT))
    with ir.Location.file("kernel.py", 12, 5):
        # Mosaic GPU converts UPCAST_2X registers to WGMMA, not the other way.
        z = mgpu.layout_cast(arith.negf(y), mgpu_layouts.to_layout_attr(fa.WGMMA_LAYOUT_UPCAST_2X))
    mgpu.vector_store(z, out_ref)


def test_impossible_layout_cast_is_explained_and_changes_nothing():
    kernel = kernels.build_kernel(conflicting_casts, [SHAPE], [SHAPE])
    before = str(kernel.module)
    with pytest.raises(smalti.UnsatisfiableLayoutsError) as error:
        smalti.infer_layouts(kernel.module)
    assert str(kernel.module) == before
    e = error.value
    assert isinstance(e, ValueError)  # the class jax raises
    assert e.code == "SM101"
    assert "Failed to infer a possible set of layouts" in str(e)  # jax's key phrase
    assert e.location and e.location.startswith("kernel.py:")
    assert e.fixes and "layout_cast" in e.fixes[0]
    conflict = "\n".join(e.conflict)
    assert "kernel.py:12" in conflict and "kernel.py:9" in conflict
    assert "WGMMA_UPCAST_2X" in conflict and "WGMMA" in conflict
    # jax rejects the same kernel, tersely.
    reference = kernels.build_kernel(conflicting_casts, [SHAPE], [SHAPE])
    with pytest.raises(ValueError, match="Failed to infer a possible set of layouts"):
        jax_infer(reference)


def test_cast_to_a_layout_that_does_not_fit_the_shape():
    kernel = kernels.build_kernel(cast_to(fa.WGStridedFragLayout((64, 128), 2)), [SHAPE], [SHAPE])
    before = str(kernel.module)
    with pytest.raises(smalti.SmaltiValueError) as error:
        smalti.infer_layouts(kernel.module)
    assert error.value.code == "SM102"
    assert "Cannot cast to layout" in str(error.value)
    assert "(128, 128)" in str(error.value)
    assert str(kernel.module) == before


def test_lowering_without_layouts_is_refused_before_rewriting():
    kernel = kernels.build_kernel(cast_to(fa.WGMMA_LAYOUT), [SHAPE], [SHAPE])
    before = str(kernel.module)
    with pytest.raises(smalti.SmaltiValueError) as error:
        smalti.lower(kernel.module, kernel.launch_context)
    assert error.value.code == "SM201"
    assert "infer_layouts" in str(error.value)
    assert str(kernel.module) == before


def test_lowering_with_a_missing_rule_is_refused_before_rewriting():
    kernel = kernels.build_kernel(cast_to(fa.WGMMA_LAYOUT), [SHAPE], [SHAPE])
    smalti.infer_layouts(kernel.module)
    before = str(kernel.module)
    pipeline = smalti.build_pipeline(autoload=False, plugins={"empty": object()})
    with pytest.raises(smalti.SmaltiNotImplementedError) as error:
        smalti.lower(kernel.module, kernel.launch_context, pipeline=pipeline)
    assert error.value.code == "SM004"
    assert str(kernel.module) == before


def test_every_error_code_has_an_explanation_with_examples_where_it_matters():
    from smalti import codes

    for code, entry in codes.CATALOGUE.items():
        assert code.startswith("SM") and entry.title and len(entry.explanation) > 80
        assert code in entry.long_form()
    assert codes.CATALOGUE["SM101"].before and codes.CATALOGUE["SM101"].after


def test_conflict_is_summed_up_in_one_sentence():
    """'X asks for A; Y asks for B; they are connected through Z'."""
    def body(ctx, x_ref, y_ref, out_ref, smem):
        with ir.Location.file("kernel.py", 7, 5):
            x = mgpu.vector_load(x_ref)
        with ir.Location.file("kernel.py", 8, 5):
            strided = mgpu_layouts.to_layout_attr(fa.WGStridedFragLayout((128, 128), 2))
            y = mgpu.layout_cast(mgpu.vector_load(y_ref), strided)
        with ir.Location.file("kernel.py", 9, 5):
            z = arith.addf(x, y)
        with ir.Location.file("kernel.py", 12, 5):
            w = mgpu.layout_cast(z, mgpu_layouts.to_layout_attr(fa.WGMMA_LAYOUT))
        mgpu.vector_store(w, out_ref)

    kernel = kernels.build_kernel(body, [SHAPE, SHAPE], [SHAPE])
    with pytest.raises(smalti.UnsatisfiableLayoutsError) as error:
        smalti.infer_layouts(kernel.module)
    headline = str(error.value).splitlines()[0]
    assert "mosaic_gpu.layout_cast at kernel.py:8:5 asks for strided[128, 128]x2" in headline
    assert "mosaic_gpu.layout_cast at kernel.py:12:5 asks for WGMMA" in headline
    assert "they are connected through mosaic_gpu.vector_load at kernel.py:7:5" in headline
    assert "arith.addf at kernel.py:9:5" in headline
