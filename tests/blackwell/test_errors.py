"""Blackwell user errors: a code, the op and its location, a fix; jax's class and phrase."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import tcgen05
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti
import smalti.jax
from tests.blackwell.kit import ADDRESS, BLACKWELL, F32_128, alloc, build, tmem_type
from tests.differential import jax_infer, jax_lower, normalized, ops_named
from tests.official import capture_modules, gpu_facts

F16_SMEM = (jax.ShapeDtypeStruct((128, 64), jnp.float16),
            jax.ShapeDtypeStruct((64, 128), jnp.float16))


def _true() -> ir.Value:
    return arith.constant(ir.IntegerType.get_signless(1), 1)


def _mma(accumulator, a, b, **kw):
    mgpu.TcGen05MMAOp(accumulator, a, b, _true(), **kw)


def infer_fails(kernel, error_type=smalti.SmaltiValueError) -> smalti.SmaltiError:
    before = normalized(kernel.module)
    with pytest.raises(error_type) as error:
        smalti.infer_layouts(kernel.module, arch=BLACKWELL)
    assert normalized(kernel.module) == before  # transactional
    return error.value


# --- a TMEM ref that is not a memref ---------------------------------------------------
#
# The dialect's verifier rejects these, but layout inference (jax's as
# smalti's) takes modules that were never verified: a buggy producer's. The
# kernels below are built valid, then an operand is rewired.


def _mma_kernel(x_ref, o_ref, scratch):
    a_smem, b_smem, acc_smem, address = scratch
    x = mgpu.vector_load(x_ref)
    mgpu.vector_store(x, acc_smem)
    mgpu.vector_store(x, o_ref)
    _mma(alloc(address), a_smem, b_smem)
    mgpu.TmemDeallocOp(alloc(address, (96, 128)))  # 96 rows: wrong for an MMA


def _build_mma_kernel():
    kernel = build(_mma_kernel, scratch=(*F16_SMEM, F32_128, ADDRESS))
    [mma] = ops_named(kernel.module, "mosaic_gpu.tcgen05_mma")
    return kernel, mma


def test_a_vector_as_the_accumulator_names_its_producer_and_how_to_allocate():
    kernel, mma = _build_mma_kernel()
    [load] = ops_named(kernel.module, "mosaic_gpu.vector_load")
    mma.operands[0] = load.result  # registers, not TMEM
    error = infer_fails(kernel)
    assert isinstance(error, ValueError) and error.code == "SM140"
    assert "is not a memref." in error.message  # jax's phrase
    assert "accumulator" in error.message and "mosaic_gpu.tcgen05_mma" in error.op
    assert "mosaic_gpu.vector_load" in error.values["produced by"]
    fixes = " ".join(error.fixes)
    assert "tmem_alloc" in fixes and "slice_tmem" in fixes


def test_a_vector_where_a_load_needs_tmem():
    def body(x_ref, o_ref, address):
        x = mgpu.vector_load(x_ref)
        mgpu.vector_store(x, o_ref)
        mgpu.vector_store(mgpu.AsyncLoadTmemOp(alloc(address)).results[0], o_ref)

    kernel = build(body)
    [x] = ops_named(kernel.module, "mosaic_gpu.vector_load")
    [load] = ops_named(kernel.module, "mosaic_gpu.async_load_tmem")
    load.operands[0] = x.result
    error = infer_fails(kernel)
    assert error.code == "SM140" and "mosaic_gpu.async_load_tmem" in error.op
    assert "source" in error.message


# --- a TMEM ref in the wrong memory space, or with the wrong layout --------------------


def test_an_smem_accumulator_is_in_the_wrong_memory_space():
    kernel, mma = _build_mma_kernel()
    to_smem, _ = ops_named(kernel.module, "mosaic_gpu.vector_store")
    mma.operands[0] = to_smem.operands[1]  # the f32 SMEM ref
    error = infer_fails(kernel)
    assert isinstance(error, ValueError) and error.code == "SM141"
    assert "that is not TMEM" in error.message and "workgroup" in error.message
    assert "mosaic_gpu.slice_smem" in error.values["produced by"]
    assert "tmem_alloc" in " ".join(error.fixes)


def _store_then_load(x_ref, o_ref, address):
    tmem = alloc(address)
    mgpu.AsyncStoreTmemOp(mgpu.vector_load(x_ref), tmem)
    mgpu.vector_store(mgpu.AsyncLoadTmemOp(tmem).results[0], o_ref)
    mgpu.TmemDeallocOp(tmem)


def _expect_other_tmem_layout(kernel) -> None:
    """Edits the load's in_tmem_layouts to a layout its producer does not have."""
    [load] = ops_named(kernel.module, "mosaic_gpu.async_load_tmem")
    with kernel.context:
        other = mgpu_layouts.to_layout_attr(tcgen05.tmem_default_layout(2))
        load.attributes["in_tmem_layouts"] = ir.ArrayAttr.get([other])


def test_a_tmem_layout_that_does_not_match_the_producer_is_refused_like_jax():
    reference, candidate = build(_store_then_load), build(_store_then_load)
    jax_infer(reference, BLACKWELL)
    smalti.infer_layouts(candidate.module, arch=BLACKWELL)
    _expect_other_tmem_layout(reference)
    _expect_other_tmem_layout(candidate)
    with pytest.raises(ValueError, match="does not match the expected") as jax_error:
        jax_lower(reference)
    with pytest.raises(smalti.SmaltiValueError) as error:
        smalti.lower(candidate.module, candidate.launch_context, arch=BLACKWELL)
    assert error.value.code == "SM142"
    assert "does not match the expected layout" in str(jax_error.value)
    assert "does not match the expected layout" in error.value.message
    assert "mosaic_gpu.async_load_tmem" in error.value.op


# --- other TMEM misuse --------------------------------------------------------------------


def test_a_cast_to_a_layout_that_does_not_fit():
    def body(x_ref, o_ref, address):
        view = mgpu.SliceTmemOp(tmem_type((64, 128)), alloc(address), 0).result
        layout = mgpu_layouts.to_layout_attr(tcgen05.tmem_default_layout(1))  # 128 rows
        mgpu.AsyncLoadTmemOp(mgpu.tmem_layout_cast(view, layout))
        del x_ref, o_ref

    with pytest.raises(ValueError, match="Cannot cast to TMEM layout") as jax_error:
        jax_infer(build(body), arch=BLACKWELL)
    error = infer_fails(build(body))
    assert error.code == "SM143"
    phrase = "the layout is not compatible with the operand shape (64, 128)"
    assert phrase in str(jax_error.value) and phrase in error.message
    assert error.message.startswith("Cannot cast to TMEM layout")  # jax's words


def test_an_accumulator_of_an_unsupported_row_count():
    kernel, mma = _build_mma_kernel()
    allocs = ops_named(kernel.module, "mosaic_gpu.tmem_alloc")
    mma.operands[0] = allocs[1].result  # 96 rows
    error = infer_fails(kernel)
    assert error.code == "SM143" and "128 or 64 rows" in error.message


def test_one_scale_without_the_other():
    kernel, mma = _build_mma_kernel()
    with kernel.context, mma.location, ir.InsertionPoint(mma):
        acc, a, b, accumulate = mma.operands
        scale = mgpu.SliceTmemOp(tmem_type((128, 4), ir.Float8E8M0FNUType.get()), acc, 0)
        mgpu.TcGen05MMAOp(acc, a, b, accumulate, a_scale=scale.result)
    mma.erase()
    error = infer_fails(kernel)
    assert error.code == "SM145" and "neither or both scales" in error.message


def test_dealloc_of_a_slice_names_the_allocation_to_free():
    def body(x_ref, o_ref, address):
        view = mgpu.SliceTmemOp(tmem_type(), alloc(address), 0).result
        default = mgpu_layouts.to_layout_attr(tcgen05.tmem_default_layout(1))
        mgpu.TmemDeallocOp(mgpu.tmem_layout_cast(view, default))
        del x_ref, o_ref

    kernel = build(body)
    smalti.infer_layouts(kernel.module, arch=BLACKWELL)
    with pytest.raises(smalti.SmaltiValueError) as error:
        smalti.lower(kernel.module, kernel.launch_context, arch=BLACKWELL)
    assert error.value.code == "SM146"
    assert "is not a TMEM allocation" in error.value.message


def test_mixing_collective_and_single_cta_ops():
    def body(x_ref, o_ref, scratch):
        a_smem, b_smem, address = scratch
        _mma(alloc(address, collective=True), a_smem, b_smem, collective=False)
        del x_ref, o_ref

    kernel = build(body, scratch=(*F16_SMEM, ADDRESS), grid=(2, 1, 1), cluster=(2, 1, 1))
    smalti.infer_layouts(kernel.module, arch=BLACKWELL)
    with pytest.raises(smalti.SmaltiValueError) as error:
        smalti.lower(kernel.module, kernel.launch_context, arch=BLACKWELL)
    assert error.value.code == "SM144"
    assert "Collective attributes are inconsistent" in error.value.message


# --- Blackwell ops on Hopper ---------------------------------------------------------------


def _tmem_pallas_kernel():
    def body(o_gmem, o_smem, tmem):
        plgpu.async_store_tmem(tmem, jnp.zeros((128, 128), jnp.float32))
        plgpu.commit_tmem()
        o_smem[...] = plgpu.async_load_tmem(tmem)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((128, 128), jnp.float32),
        scratch_types=[plgpu.SMEM((128, 128), jnp.float32), plgpu.TMEM((128, 128), jnp.float32)],
        compiler_params=plgpu.CompilerParams(
            lowering_semantics=plgpu.LoweringSemantics.Warpgroup))


def test_tmem_ops_on_hopper_name_the_architecture_they_need_when_strict(monkeypatch):
    monkeypatch.setenv("SMALTI_STRICT_ARCH", "1")
    # Pallas only builds TMEM kernels for Blackwell: build for sm_100, and
    # ask smalti to compile for sm_90.
    monkeypatch.setattr(smalti.jax, "infer_layouts",
                        lambda module, **kw: smalti.infer_layouts(module, **{**kw, "arch": (9, 0)}))
    with gpu_facts(monkeypatch, arch=BLACKWELL), smalti.jax.installed():
        with pytest.raises(smalti.SmaltiNotImplementedError) as error:
            capture_modules(_tmem_pallas_kernel())
    assert error.value.code == "SM002"
    message = str(error.value)
    assert "sm_90" in message and "smalti.blackwell" in message and "sm_100" in message
    assert "mosaic_gpu.tmem_alloc" in error.value.op  # Pallas allocates TMEM first


def test_tmem_ops_on_hopper_lower_like_jax_with_a_warning(monkeypatch):
    """jax lowers a Blackwell kernel for the architecture of a GPU-less host,
    sm_90: so does smalti by default, warning for each Blackwell op."""
    monkeypatch.delenv("SMALTI_STRICT_ARCH", raising=False)
    with gpu_facts(monkeypatch, arch=(9, 0)):
        by_jax = capture_modules(_tmem_pallas_kernel())
        with smalti.jax.installed(), pytest.warns(smalti.ArchitectureWarning) as warned:
            by_smalti = capture_modules(_tmem_pallas_kernel())
    assert by_smalti == by_jax
    texts = [str(w.message) for w in warned]
    assert any("mosaic_gpu.tmem_alloc is not supported on sm_90" in t for t in texts)
    assert all("smalti.blackwell" in t and "SMALTI_STRICT_ARCH=1" in t for t in texts)


def build_relinquish():
    def body(x_ref, o_ref, address):
        mgpu.TmemRelinquishAllocPermitOp(collective=False)
        del x_ref, o_ref, address

    return build(body)


def test_ops_without_layouts_are_refused_on_hopper_at_lowering_when_strict():
    """tmem_relinquish_alloc_permit carries no ref: lowering, not inference, refuses it."""
    kernel = build_relinquish()
    smalti.infer_layouts(kernel.module, arch=(9, 0))
    before = str(kernel.module)
    with pytest.raises(smalti.SmaltiNotImplementedError) as error:
        smalti.lower(kernel.module, kernel.launch_context, arch=(9, 0), strict_arch=True)
    assert error.value.code == "SM002" and "tmem_relinquish_alloc_permit" in error.value.op
    assert str(kernel.module) == before  # refused before any rewrite


def test_ops_without_layouts_lower_on_hopper_with_a_warning_in_the_report():
    on_blackwell, on_hopper = build_relinquish(), build_relinquish()
    for kernel in (on_blackwell, on_hopper):
        smalti.infer_layouts(kernel.module, arch=BLACKWELL)
    smalti.lower(on_blackwell.module, on_blackwell.launch_context, arch=BLACKWELL)
    with pytest.warns(smalti.ArchitectureWarning, match="tmem_relinquish_alloc_permit"):
        report = smalti.lower(on_hopper.module, on_hopper.launch_context, arch=(9, 0),
                              strict_arch=False)
    [text] = report.arch_fallbacks
    assert text.startswith("[SM002] mosaic_gpu.tmem_relinquish_alloc_permit is not supported "
                           "on sm_90: using the lowering rule")
    assert normalized(on_hopper.module) == normalized(on_blackwell.module)
