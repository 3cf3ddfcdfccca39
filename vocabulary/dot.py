"""``dot_general`` of register values (``x @ y``, ``jnp.dot``,
``lax.dot_general`` of arrays loaded from refs) in Warpgroup kernels.

jax 0.11.2's Pallas Mosaic GPU lowering has no rule for ``dot_general`` in
any semantics (Pallas' own matmuls are ``plgpu.wgmma`` / ``tcgen05_mma`` on
refs), so nothing is delegated: every register ``dot_general`` was refused
before this rule. Two lowerings:

**WGMMA** (sm_90, a kernel of one warpgroup, ``precision`` None or
``DEFAULT``): 16-bit float operands (f16 or bf16, one type) into f32, or
int8 into int32; 2-D operands, any contraction, no batch dimensions, M a
multiple of 64, N a multiple of 8 up to 256, K a multiple of 16 (32 for
int8). Each operand is scattered (``vector.scatter``: any register layout,
so it does not matter where the value came from) into SMEM scratch in the
K-major form every WGMMA reads -- A as (M, K), B as (N, K), transposing on
the way where the contraction asks -- each element at its address in the
``(8, swizzle / itemsize)``-tiled form with the widest swizzle (128, 64 or
32 bytes) whose tile width divides K. A second view of the same bytes,
pinned to those transforms by ``mosaic_gpu.with_transforms`` (B's through
``memref.transpose``, as Pallas passes ``b_smem.T``), is the operand of one
``mosaic_gpu.wgmma`` with a zero accumulator, fenced, committed and waited
for as Pallas' ``wgmma`` does. f32 operands never take this path (no tf32).

**The in-order loop** (everything else): written as a jax function and
lowered by Pallas' ``_lower_fun`` (``lax.fori_loop`` becomes ``scf.for``
with the accumulator as a vector carry)::

    acc = 0
    for k in range(K):                       # in order, k = 0 .. K-1
        acc = acc + a[.., k, ..] * b[.., k, ..]   # broadcast over the other side's free dims

Each operand slice, broadcast to the result's shape, is one
:func:`smalti.vocabulary.movement.take` of the operand (flattened) at
``base + k * step``: ``base`` is iota arithmetic over the result's
dimensions (batch, lhs free, rhs free, as ``dot_general`` orders them),
``step`` the stride of the contracted dimension. Any contraction and batch
assignment of 1-D / 2-D operands with a result of rank 1 or 2 is this one
formula (no contraction: an outer product). A ``precision=`` other than
``DEFAULT`` picks this path, whose order of operations is fixed. It is the
general fallback, not a fast one: each step stages both operands through
SMEM again (``take``), ``K * (a.size + b.size)`` scalar SMEM stores in all.

**A 0-D result** (a vector-vector product, or every dimension of 2-D
operands contracted): ``jnp.sum`` of the products in f32 / int32 (the
reduction's rule; its order is a tree across the warpgroup, not k's).

Precision: products and sums in f32 (int32 for integers). The loop rounds
each product and each sum once (16-bit float products are exact in f32), so
``|got - exact| <= K * eps32 * (|a| @ |b|)`` (recursive summation's
``gamma_K <= K eps``); on the emulator it is bit for bit numpy's f32 loop (a
GPU compiler may fuse ``acc + x * y`` into an FMA, within the same bound;
XLA on the CPU computes the same in-order loop with FMAs, so jnp's answer
differs from it in the last bits, within the bound too).
WGMMA's products are exact; the emulator adds the 16 products of each
instruction (K / 16 instructions; int8: 32, exactly) to the accumulator and
rounds once per instruction -- within the same bound. NVIDIA does not
document the tensor core's internal accumulation.
The result is rounded once to ``preferred_element_type`` (default: the
operands' type). Integers wrap modulo 2**32, then are truncated, as jnp.

Refused (SM206, with what to write instead): float64 / int64 / bool /
complex operands or results, operands of rank above 2, a result of rank
above 2, operands too large for the SMEM scratch. (A 1-D result of other
than a multiple of 128 elements, which no register iota holds, is the
products summed along K instead: :func:`row_sums`.)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.lib import mosaic_gpu_dialect as mgpu_dialect
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, llvm, vector
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

from smalti.vocabulary.annotations import (
    Aval,
    DTypeLike,
    EstimatorContext,
    Lowered,
    Operand,
    PallasContext,
    Resources,
    Shape,
)
from smalti.vocabulary.movement import take
from smalti.vocabulary.primitives import refuse

_lower_fun = pallas_lowering._lower_fun

FLOATS = tuple(np.dtype(d) for d in (jnp.float32, jnp.float16, jnp.bfloat16))
INTS = tuple(np.dtype(d) for d in (np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32))
#: The largest operand ``take`` may write into SMEM scratch: 128 KiB of
#: Hopper's 227, leaving the rest to the kernel's own buffers.
MAX_SCRATCH_BYTES = 128 * 1024

WGMMA_FIX = ("for larger or batched products, bring the operands into SMEM and use "
             "plgpu.wgmma(acc_ref, a_smem, b_smem) (16-bit floats, 8-bit ints)")


# --- the formula --------------------------------------------------------------------------


def _plan(a_shape: Shape, b_shape: Shape, dimension_numbers: lax.DotDimensionNumbers
          ) -> tuple[Shape, int, tuple[list[int], int], tuple[list[int], int]]:
    """The output shape, the contracted size K, and per operand the
    flat-index stride of each output dimension (0 where the operand does not
    vary along it) and of the contracted one. At most one dimension is
    contracted: more leave a 0-D result (:func:`full_contraction`)."""
    (ca, cb), (ba, bb) = dimension_numbers
    ca, cb, ba, bb = (tuple(int(d) for d in t) for t in (ca, cb, ba, bb))
    assert len(ca) <= 1, dimension_numbers
    fa = [d for d in range(len(a_shape)) if d not in ca and d not in ba]
    fb = [d for d in range(len(b_shape)) if d not in cb and d not in bb]
    out_shape = tuple(a_shape[d] for d in ba) + tuple(a_shape[d] for d in fa) \
        + tuple(b_shape[d] for d in fb)

    def strides(shape: Shape) -> list[int]:
        s, acc = [0] * len(shape), 1
        for d in reversed(range(len(shape))):
            s[d], acc = acc, acc * shape[d]
        return s

    sa, sb = strides(a_shape), strides(b_shape)
    out_a = [sa[d] for d in ba] + [sa[d] for d in fa] + [0] * len(fb)
    out_b = [sb[d] for d in bb] + [0] * len(fa) + [sb[d] for d in fb]
    k = a_shape[ca[0]] if ca else 1  # no contraction: an outer product, one step
    step_a, step_b = (sa[ca[0]], sb[cb[0]]) if ca else (0, 0)
    return out_shape, k, (out_a, step_a), (out_b, step_b)


def _base(out_shape: Shape, out_strides: Sequence[int]) -> jax.Array:
    """sum over output dims of iota(dim) * stride: an int32 array of out_shape."""
    base = jnp.zeros(out_shape, jnp.int32)
    for dim, stride in enumerate(out_strides):
        if stride:
            base = base + lax.broadcasted_iota(jnp.int32, out_shape, dim) * stride
    return base


def accumulator_dtype(dtype: DTypeLike) -> np.dtype:
    return np.dtype(jnp.float32) if np.dtype(dtype) in FLOATS else np.dtype(jnp.int32)


def dot_loop(a: jax.Array, b: jax.Array, *, dimension_numbers: lax.DotDimensionNumbers,
             out_dtype: DTypeLike) -> jax.Array:
    """The register ``dot_general``: an in-order loop over the contraction
    accumulating rank-1 products in f32 / int32 (see the module docstring).
    A jax function: it runs on the CPU under jit as in a kernel."""
    acc_dtype = accumulator_dtype(a.dtype)
    out_shape, k_size, (out_a, step_a), (out_b, step_b) = _plan(
        a.shape, b.shape, dimension_numbers)
    base_a, base_b = _base(out_shape, out_a), _base(out_shape, out_b)

    def step(k: jax.Array, acc: jax.Array) -> jax.Array:
        # take in the operands' own type (less scratch), then widen: exact
        x = take(a, base_a + k * step_a).astype(acc_dtype)
        y = take(b, base_b + k * step_b).astype(acc_dtype)
        return acc + x * y

    acc = lax.fori_loop(0, k_size, step, jnp.zeros(out_shape, acc_dtype))
    return acc.astype(out_dtype)


def full_contraction(a: jax.Array, b: jax.Array, *, dimension_numbers: lax.DotDimensionNumbers,
                     out_dtype: DTypeLike) -> jax.Array:
    """A 0-D result (vector-vector, or every dimension of 2-D operands
    contracted): the products, in the accumulator type, summed by
    ``jnp.sum`` (a reduction across the warpgroup; its order is a tree)."""
    (ca, cb), _ = dimension_numbers
    acc_dtype = accumulator_dtype(a.dtype)
    # b's dimensions in the order a's are contracted with them
    b = lax.transpose(b, tuple(int(cb[list(ca).index(d)]) for d in range(a.ndim)))
    return jnp.sum(a.astype(acc_dtype) * b.astype(acc_dtype)).astype(out_dtype)


def row_sums(a: jax.Array, b: jax.Array, *, dimension_numbers: lax.DotDimensionNumbers,
             out_dtype: DTypeLike) -> jax.Array:
    """A 1-D result of M elements, M not a multiple of 128 (``x @ v`` for a
    (64, K) block): no register layout holds an (M,) iota, so the loop's
    indices cannot be built; instead the (M, K) products, each operand
    element a ``take``, summed along K by ``jnp.sum(axis=1)``, whose (M,)
    result has the reduction's row layout (a tree sum: within K eps)."""
    acc_dtype = accumulator_dtype(a.dtype)
    (m,), k_size, (out_a, step_a), (out_b, step_b) = _plan(a.shape, b.shape, dimension_numbers)
    shape = (m, k_size)
    x = take(a, _base(shape, [out_a[0], step_a])).astype(acc_dtype)
    y = take(b, _base(shape, [out_b[0], step_b])).astype(acc_dtype)
    products = x * y
    if m % 64 == 0 and k_size % 8 == 0:
        # Nothing else here pins a layout and iotas alone may be given the
        # strided one, which a one-axis reduction does not take.
        products = plgpu.layout_cast(products, plgpu.Layout.WGMMA)
    return jnp.sum(products, axis=1).astype(out_dtype)


def decomposition(out_aval: Aval, dimension_numbers: lax.DotDimensionNumbers
                  ) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """The jax function computing a product WGMMA does not: the in-order
    loop, for a 0-D result the reduction, for a 1-D result of other than a
    multiple of 128 elements the row sums."""
    if out_aval.ndim == 0:
        fn = full_contraction
    elif out_aval.ndim == 1 and out_aval.size % 128:
        fn = row_sums
    else:
        fn = dot_loop
    return partial(fn, dimension_numbers=dimension_numbers, out_dtype=out_aval.dtype)


# --- the Pallas rule ------------------------------------------------------------------------


def problem(a_aval: Aval, b_aval: Aval, out_aval: Aval) -> tuple[str, list[str]] | None:
    """Why the loop cannot compute this ``dot_general`` (a message and
    fixes), or None. Shared by the rule and the estimator."""
    dtypes = {np.dtype(a_aval.dtype), np.dtype(b_aval.dtype)}
    names = " and ".join(sorted(d.name for d in dtypes))
    floats = dtypes <= set(FLOATS)
    if not (floats or dtypes <= set(INTS)):
        return (f"operands of dtype {names} are not supported",
                ["use float32, float16, bfloat16 or integers of at most 32 bits "
                 "(x.astype(jnp.float32))", "do not mix float and integer operands"])
    out_dtype = np.dtype(out_aval.dtype)
    if out_dtype not in (FLOATS if floats else INTS):
        return (f"preferred_element_type={out_dtype.name} for {names} operands is not "
                "supported", ["preferred_element_type=jnp.float32 for float operands, "
                              "jnp.int32 for integer ones"])
    if a_aval.ndim > 2 or b_aval.ndim > 2:
        return (f"operands of rank {a_aval.ndim} and {b_aval.ndim}: at most 2-D operands "
                "are supported",
                ["reshape to 2-D, or loop over the batch with lax.fori_loop", WGMMA_FIX])
    if out_aval.ndim > 2:
        return (f"a result of rank {out_aval.ndim} is not supported",
                ["reshape the operands so that the result is 1-D or 2-D"])
    biggest = max(a_aval.size * np.dtype(a_aval.dtype).itemsize,
                  b_aval.size * np.dtype(b_aval.dtype).itemsize)
    if biggest > MAX_SCRATCH_BYTES:
        return (f"operands {a_aval.str_short()} and {b_aval.str_short()} need {biggest} bytes "
                f"of SMEM scratch (at most {MAX_SCRATCH_BYTES})",
                ["split the contraction into blocks and add the partial products", WGMMA_FIX])
    return None


# --- WGMMA ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WgmmaPlan:
    swizzle: int             # bytes, both operands
    a_transposed: bool       # a is (K, M): staged transposed, as (M, K)
    b_transposed: bool       # b is (K, N): staged transposed, as (N, K)
    scratch_bytes: int       # both operands, each aligned as Pallas aligns scratch


def _aligned(n: int) -> int:
    return -(-n // 1024) * 1024


def wgmma_plan(a_aval: Aval, b_aval: Aval, out_aval: Aval,
               dimension_numbers: lax.DotDimensionNumbers,
               precision: lax.PrecisionLike) -> WgmmaPlan | None:
    """How to compute this product with one WGMMA, or None (the loop)."""
    if precision is not None and any(p not in (None, lax.Precision.DEFAULT)
                                     for p in (precision if isinstance(precision, tuple)
                                               else (precision,))):
        return None  # an explicit precision asks for the in-order f32 loop
    (ca, cb), (ba, bb) = dimension_numbers
    if a_aval.ndim != 2 or b_aval.ndim != 2 or ba or bb or len(ca) != 1:
        return None
    dtype = np.dtype(a_aval.dtype)
    if np.dtype(b_aval.dtype) != dtype:
        return None
    out_dtype = np.dtype(out_aval.dtype)
    if dtype in FLOATS[1:]:
        if out_dtype not in FLOATS:
            return None
    elif dtype == np.dtype(np.int8):
        if out_dtype not in INTS:
            return None
    else:
        return None
    (m, n), k = out_aval.shape, a_aval.shape[ca[0]]
    if m % 64 or n % 8 or n > 256:
        return None
    nbytes = _aligned(a_aval.size * dtype.itemsize) + _aligned(b_aval.size * dtype.itemsize)
    if nbytes > MAX_SCRATCH_BYTES:
        return None
    # Both operands are staged K-major, (M, K) and (N, K) (8-bit WGMMA reads
    # no other form): the swizzle's tile width must divide K. The 32-byte
    # swizzle's width is 16 halves or 32 bytes: K's multiple of 16 (32).
    for swizzle in (128, 64, 32):
        if k % (swizzle // dtype.itemsize) == 0:
            return WgmmaPlan(swizzle, tuple(ca) == (0,), tuple(cb) == (0,), nbytes)
    return None


def _splat(shape: Shape, element: ir.Type, value: int | float) -> ir.Value:
    ty = ir.VectorType.get(shape, element)
    attr = ir.IntegerAttr.get(element, value) if isinstance(element, ir.IntegerType) \
        else ir.FloatAttr.get(element, value)
    return arith.constant(ty, ir.DenseElementsAttr.get_splat(ty, attr))


def _swizzled_index(shape: Shape, itemsize: int, swizzle: int, transposed: bool) -> ir.Value:
    """For each element of a register value of ``shape``, its element index
    in the staged (R, C) operand (the value, or its transpose) in the
    (8, swizzle / itemsize)-tiled, swizzled SMEM form: element (r, c) at its
    byte offset in row-major tiles, the 16-byte chunk index XORed with the
    128-byte row index modulo swizzle / 16 (the PTX ISA's swizzle modes)."""
    i32 = ir.IntegerType.get_signless(32)
    cols = shape[0] if transposed else shape[1]
    width = swizzle // itemsize

    def c(v: int) -> ir.Value:
        return _splat(shape, i32, v)

    r = mgpu_dialect.broadcasted_iota(ir.VectorType.get(shape, i32), 1 if transposed else 0)
    col = mgpu_dialect.broadcasted_iota(ir.VectorType.get(shape, i32), 0 if transposed else 1)
    tile = arith.addi(arith.muli(arith.divui(r, c(8)), c(cols // width)),
                      arith.divui(col, c(width)))
    byte = arith.addi(arith.muli(tile, c(8 * swizzle)),
                      arith.addi(arith.muli(arith.remui(r, c(8)), c(swizzle)),
                                 arith.muli(arith.remui(col, c(width)), c(itemsize))))
    chunk = arith.shli(arith.andi(arith.shrui(byte, c(7)), c(swizzle // 16 - 1)), c(4))
    return arith.divui(arith.xori(byte, chunk), c(itemsize))


def _staged(ctx: PallasContext, stack: contextlib.ExitStack, x: ir.Value, aval: Aval, swizzle: int,
            transposed: bool) -> ir.Value:
    """``x`` (transposed if asked) scattered into SMEM scratch in WGMMA's
    swizzled K-major form; the ref of those bytes with those transforms
    pinned."""
    module_ctx = ctx.module_ctx
    dtype = np.dtype(aval.dtype)
    shape = tuple(aval.shape)
    staged_shape = shape[::-1] if transposed else shape
    flat = stack.enter_context(module_ctx.scratch_view(
        jax.ShapeDtypeStruct((math.prod(shape),), dtype)))
    offset = ir.IntegerAttr(cast(ir.OpView, flat.owner).attributes["offset"]).value
    zero = arith.constant(ir.IndexType.get(), 0)
    vector.scatter(None, flat, [zero],
                   _swizzled_index(shape, dtype.itemsize, swizzle, transposed),
                   _splat(shape, ir.IntegerType.get_signless(1), 1), x)
    ref_type = ir.MemRefType.get(staged_shape, mgpu_utils.dtype_to_ir_type(dtype),
                                 memory_space=mgpu_utils.smem())
    ref = mgpu_dialect.slice_smem(ref_type, offset,
                                  alias_id=module_ctx.next_smem_allocation_id())
    ref = mgpu_dialect.with_transforms(ref, ir.ArrayAttr.get([
        mgpu_dialect.TileTransformAttr.get((8, swizzle // dtype.itemsize)),
        mgpu_dialect.SwizzleTransformAttr.get(swizzle)]))
    return ref


def _ptx(instruction: str) -> None:
    llvm.inline_asm(ir.Type.parse("!llvm.void"), [], instruction, "", has_side_effects=True)


def lower_wgmma(ctx: PallasContext, plan: WgmmaPlan, a: Operand, b: Operand) -> ir.Value:
    a_aval, b_aval = ctx.avals_in
    [out_aval] = ctx.avals_out
    a = pallas_lowering._ensure_ir_value(a, a_aval.dtype)
    b = pallas_lowering._ensure_ir_value(b, b_aval.dtype)
    integer = np.dtype(a_aval.dtype) == np.dtype(np.int8)
    acc_element = ir.IntegerType.get_signless(32) if integer else ir.F32Type.get()
    shape = tuple(out_aval.shape)
    with contextlib.ExitStack() as stack:
        a_ref = _staged(ctx, stack, a, a_aval, plan.swizzle, plan.a_transposed)  # (M, K)
        b_ref = _staged(ctx, stack, b, b_aval, plan.swizzle, plan.b_transposed)  # (N, K)
        b_ref = mgpu_utils.memref_transpose(b_ref, (1, 0))  # the (K, N) view WGMMA takes
        mgpu_utils.commit_shared()  # generic-proxy writes, then WGMMA's async reads
        zero = _splat(shape, acc_element, 0)
        _ptx("wgmma.fence.sync.aligned;")
        acc = mgpu_dialect.wgmma(zero, a_ref, b_ref)
        _ptx("wgmma.commit_group.sync.aligned;")
        _ptx("wgmma.wait_group.sync.aligned 0;")
        mgpu_utils.warpgroup_barrier()  # every read done before the scratch is reused
    out_element = mgpu_utils.dtype_to_ir_type(out_aval.dtype)
    if out_element != acc_element:
        convert = arith.trunci if integer else arith.truncf
        acc = convert(ir.VectorType.get(shape, out_element), acc)
    return acc


# --- the Pallas rule ------------------------------------------------------------------------


def _wgmma_available(ctx: PallasContext) -> bool:
    """WGMMA is sm_90's; its scratch is per warpgroup (one warpgroup only)."""
    axis_names = ctx.module_ctx.axis_names
    if axis_names is not None and axis_names.wg is not None:
        return False
    return mgpu_utils.get_arch().major == 9


def lower_dot_general(ctx: PallasContext, a: Operand, b: Operand, *,
                      dimension_numbers: lax.DotDimensionNumbers,
                      precision: lax.PrecisionLike = None,
                      preferred_element_type: DTypeLike | None = None,
                      **params: Any) -> Lowered:
    """Pallas' rule for ``dot_general`` (Warpgroup): WGMMA where it applies,
    else the in-order loop."""
    del preferred_element_type, params
    a_aval, b_aval = ctx.avals_in
    [out_aval] = ctx.avals_out
    if (why := problem(a_aval, b_aval, out_aval)) is not None:
        raise refuse(ctx, why[0], fix=why[1])
    plan = wgmma_plan(a_aval, b_aval, out_aval, dimension_numbers, precision)
    if plan is not None and _wgmma_available(ctx):
        return lower_wgmma(ctx, plan, a, b)
    return _lower_fun(decomposition(out_aval, dimension_numbers))(ctx, a, b)


def estimate_dot_general(ctx: EstimatorContext, a_aval: Aval, b_aval: Aval, *,
                         dimension_numbers: lax.DotDimensionNumbers,
                         precision: lax.PrecisionLike = None,
                         preferred_element_type: DTypeLike | None = None,
                         **params: Any) -> Resources:
    """What either path needs: Pallas' estimate of the decomposition's jaxpr
    (the loop: ``take``'s SMEM scratch, the larger operand; a 0-D result: the
    reduction's), or both operands' WGMMA
    staging where the shapes allow WGMMA (the architecture is not known
    here: the larger of the two). Nothing for a product the rule refuses (it
    raises, with its reason, when lowered)."""
    del params
    out_aval = jax.eval_shape(
        partial(lax.dot_general, dimension_numbers=dimension_numbers,
                preferred_element_type=preferred_element_type),
        *(jax.ShapeDtypeStruct(v.shape, v.dtype) for v in (a_aval, b_aval)))
    out_aval = jax.core.ShapedArray(out_aval.shape, out_aval.dtype)
    if problem(a_aval, b_aval, out_aval) is not None:
        return pallas_lowering.Resources()
    jaxpr = jax.make_jaxpr(decomposition(out_aval, dimension_numbers))(
        *(jax.ShapeDtypeStruct(v.shape, v.dtype) for v in (a_aval, b_aval))).jaxpr
    loop = pallas_lowering._estimate_resources(ctx, jaxpr)
    plan = wgmma_plan(a_aval, b_aval, out_aval, dimension_numbers, precision)
    if plan is None:
        return loop
    return loop.or_(pallas_lowering.Resources(smem_scratch_bytes=plan.scratch_bytes),
                    ctx.axis_names)
