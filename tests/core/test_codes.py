"""The error-code catalogue: every code is explained, and raised by some test.

That each code is *raised* by at least one test is checked suite-wide by
``tests/conftest.py``; the tests at the end of this file raise the codes no
other test reaches.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti
import smalti.jax
from smalti import cli, codes, kernels, solver
from tests.differential import normalized
from tests.official import capture_modules, gpu_facts

F16 = jnp.float16
F32 = jnp.float32


def sds(shape, dtype=F16):
    return jax.ShapeDtypeStruct(shape, dtype)


# --- the catalogue --------------------------------------------------------------------------


@pytest.mark.parametrize("code", sorted(codes.CATALOGUE))
def test_every_code_is_explained(code):
    entry = codes.CATALOGUE[code]
    assert entry.code == code and len(code) == 5 and code[2:].isdigit()
    assert entry.title and len(entry.explanation.split()) >= 20
    if code[2] in "12":  # kernel errors: show a failing kernel and its fix
        assert entry.before.strip() and entry.after.strip(), f"{code} needs before/after"
        assert entry.before.strip() != entry.after.strip()


@pytest.mark.parametrize("code", sorted(codes.CATALOGUE))
def test_smalti_explain_prints_the_long_form(capsys, code):
    assert cli.main(["explain", code]) == 0
    out = capsys.readouterr().out
    entry = codes.CATALOGUE[code]
    assert out.startswith(f"{code}: {entry.title}")
    if entry.before:
        assert "Before (fails):" in out and "After (works):" in out
        assert entry.before.strip().splitlines()[0].strip() in out


def test_codes_are_unique_and_grouped():
    assert len(codes._CODES) == len(codes.CATALOGUE)
    assert all(c[2] in "0123" for c in codes.CATALOGUE)


# --- codes no other test raises -------------------------------------------------------------


def parse(text: str) -> ir.Module:
    context = kernels.make_context()
    with context, ir.Location.unknown():
        return ir.Module.parse(text)


@pytest.mark.parametrize("text, consumer", [
    ("""
      func.func @f(%ref: memref<128xf32, #gpu.address_space<workgroup>>) {
        %x = "mosaic_gpu.vector_load"(%ref) : (memref<128xf32, #gpu.address_space<workgroup>>) -> vector<128xf32>
        return
      }""", "mosaic_gpu.vector_load"),  # noqa: E501 -- MLIR text, one op a line
    # An elementwise op, described without a builder (smalti.rules.same_layout).
    ("""
      func.func @f(%x: vector<128xf32>) {
        %y = arith.addf %x, %x : vector<128xf32>
        return
      }""", "arith.addf"),
], ids=["ref", "vector"])
def test_sm103_value_without_a_producer_rule_names_the_op(text, consumer):
    module = parse(text)
    before = str(module)
    with pytest.raises(smalti.SmaltiValueError) as info:
        smalti.infer_layouts(module)
    error = info.value
    assert error.code == "SM103"
    assert f"{consumer} operand #0" in error.message and "arg #0" in error.message
    assert error.op.startswith(consumer) and error.fixes
    assert str(module) == before


def elementwise(ctx, x_ref, out_ref, smem):
    x = mgpu.vector_load(x_ref)
    mgpu.vector_store(arith.addf(x, x), out_ref)


def test_sm104_search_budget_exhausted_names_the_ambiguous_values(monkeypatch):
    kernel = kernels.build_kernel(elementwise, [sds((128, 128), F32)], [sds((128, 128), F32)])
    before = str(kernel.module)
    original = solver.Solver.__init__

    def tiny_budget(self, system, arch, budget=solver.DEFAULT_SEARCH_BUDGET, fuel=None):
        original(self, system, arch, 0, fuel)

    monkeypatch.setattr(solver.Solver, "__init__", tiny_budget)
    with pytest.raises(smalti.SmaltiValueError) as info:
        smalti.infer_layouts(kernel.module)
    error = info.value
    assert error.code == "SM104"
    assert "search budget" in error.message
    assert "mosaic_gpu.vector_load" in error.values["ambiguous values"]
    assert "layout_cast" in error.fixes[0]
    assert str(kernel.module) == before


def test_sm104_fuel_bounds_the_solver_like_jaxs():
    kernel = kernels.build_kernel(elementwise, [sds((128, 128), F32)], [sds((128, 128), F32)])
    before = str(kernel.module)
    with pytest.raises(ValueError, match="Consider adding layout annotations") as info:
        smalti.infer_layouts(kernel.module, fuel=0)  # the search needs one try
    assert info.value.code == "SM104"
    assert "the fuel given (0)" in info.value.message
    assert str(kernel.module) == before
    smalti.infer_layouts(kernel.module, fuel=1)
    reference = kernels.build_kernel(elementwise, [sds((128, 128), F32)], [sds((128, 128), F32)])
    smalti.infer_layouts(reference.module)
    assert normalized(kernel.module) == normalized(reference.module)  # fuel changes no layout


@pytest.mark.parametrize("fuel", [-1, 2.5, True])
def test_fuel_must_be_a_non_negative_int(fuel):
    kernel = kernels.build_kernel(elementwise, [sds((128, 128), F32)], [sds((128, 128), F32)])
    with pytest.raises(smalti.SmaltiValueError, match="fuel must be a non-negative int"):
        smalti.infer_layouts(kernel.module, fuel=fuel)


def gather_kernel(rows: int, width: int):
    def body(x_gmem, idx_gmem, o_gmem, smem, barrier):
        layout = plgpu.Layout.TMA_INDICES_4 if rows % 4 == 0 else None
        idx = plgpu.load(idx_gmem, layout=layout, optimized=False)
        plgpu.copy_gmem_to_smem(x_gmem.at[idx], smem, barrier)
        plgpu.barrier_wait(barrier)
        plgpu.copy_smem_to_gmem(smem, o_gmem.at[pl.ds(0, rows)])
        plgpu.wait_smem_to_gmem(0)

    params = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
    call = plgpu.kernel(body, out_type=sds((128, width)), compiler_params=params,
                        scratch_types=[plgpu.SMEM((rows, width), F16), plgpu.Barrier()])
    return call, (sds((128, width)), sds((rows,), jnp.int32))


@pytest.mark.parametrize("rows, width, phrase", [
    (8, 12, "not divisible by divisor=16"),  # 12 f16 = 192 bits: not 256-bit rows
    (6, 64, "Unsupported TMA index shape (6,)"),
])
def test_sm120_inexpressible_tma_gather(monkeypatch, rows, width, phrase):
    call, args = gather_kernel(rows, width)
    with gpu_facts(monkeypatch), smalti.jax.installed():
        with pytest.raises(smalti.SmaltiValueError) as info:
            capture_modules(call, *args)
    error = info.value
    assert error.code == "SM120" and phrase in error.message
    assert error.op.startswith("mosaic_gpu.async_load") and error.fixes


def test_sm121_wgmma_operand_that_no_tiling_divides():
    def body(ctx, a_ref, out_ref, smem):
        a_smem, b_smem = smem
        acc_type = ir.VectorType.get((64, 24), ir.F32Type.get())
        with ir.Location.file("kernel.py", 3, 1):
            acc = arith.constant(acc_type, ir.DenseElementsAttr.get_splat(
                acc_type, ir.FloatAttr.get(ir.F32Type.get(), 0.0)))
            result = mgpu.wgmma(acc, a_smem, b_smem)
        mgpu.vector_store(result, out_ref)

    kernel = kernels.build_kernel(body, [sds((64, 64))], [sds((64, 24), F32)],
                                  smem_scratch=(sds((64, 64)), sds((64, 24))))
    before = str(kernel.module)
    with pytest.raises(smalti.SmaltiValueError) as info:
        smalti.infer_layouts(kernel.module)
    error = info.value
    assert error.code == "SM121"
    assert "(64, 24)" in error.message and "memref<64x24xf16" in error.values["ref"]
    assert error.location == "kernel.py:3:1"
    assert str(kernel.module) == before


def test_sm202_lowering_a_module_without_a_kernel_launch():
    module = parse("func.func @f() { return }")
    launch_context = kernels.example_kernel().launch_context
    with pytest.raises(smalti.SmaltiValueError) as info:
        smalti.lower(module, launch_context, arch=(9, 0))
    assert info.value.code == "SM202"
    assert "gpu.launch" in info.value.message and info.value.fixes
