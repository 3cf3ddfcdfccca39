"""GPU dot algorithms on the CPU: ``lax.dot`` with a tensor-core ``precision``,
computed as the emulated GPU's tensor cores compute it.

On a GPU, ``jnp.dot(a, b, precision=lax.DotAlgorithmPreset.F16_F16_F32)``
runs on the tensor cores: f16 operands, products added into an f32
accumulator with the tensor core's rounding. XLA's CPU backend has no such
arithmetic: jax refuses ``F16_F16_F32`` on the CPU ("The precision ... is
not supported by dot_general on CPU") and computes ``BF16_BF16_F32`` and
``F16_F16_F16`` with XLA:CPU's own float32 sums. So a test that checks a
matmul kernel against such a reference bit for bit -- jax's
``mgpu_matmul_test.py`` (``rtol=1e-7`` on f16 outputs, ``strict=True`` for the
mixed-type kernels) and ``mgpu_examples_test.py`` -- cannot pass on the CPU,
whatever the kernel computes.

Inside :func:`smalti.emulate.on_cpu` (hence under the pytest switch) the
presets below compute as the emulated architecture's tensor core:

* the operands converted to the algorithm's input type as jax's lowering and
  XLA convert them (round to nearest even);
* the contraction issued as one tensor-core instruction per 16 values of k
  (an f16/bf16 instruction's K), in ascending k, into one accumulator of the
  algorithm's accumulation type -- each instruction the emulator's own:
  WGMMA's adder (:mod:`.tensorcore`, bit for bit an H200's) at sm_90, and
  ``tcgen05.mma``'s exact sum rounded to nearest (:mod:`.ops.tcgen05`) at
  sm_100;
* the accumulator converted to the output type (round to nearest even), as
  jax's lowering does.

A long dot looks at the emulator's deadline (:mod:`.deadline`) between its
pieces of rows, as a kernel does between clusters, so a test runner's
timeout stops a test's reference too.

That order is a kernel's that walks K in one pass without splitting it: the
order under which jax's own tests expect the GPU's reference to equal their
kernels' output bit for bit. A library that splits K (cuBLAS does for some
shapes with small M and N and large K) adds in another order on the GPU, and
its result may differ from this one in the last place.

Modelled: ``F16_F16_F16``, ``F16_F16_F32``, ``BF16_BF16_F32``. The other
presets jax refuses on the CPU (tf32 -- whose f32-to-tf32 conversion by XLA
is not known here --, fp8, a bf16 accumulator, the multi-pass ``_X9`` and
``TF32_..._X3``) raise :class:`~smalti.emulate.Unsupported` inside the mode;
the presets XLA:CPU computes in f32 or f64 (``F32_F32_F32``,
``F64_F64_F64``, ``BF16_BF16_F32_X3``/``_X6``) and the ``lax.Precision``
values other than ``DEFAULT`` stay XLA:CPU's; ``DEFAULT`` is the default
precision below.

**Default precision.** A matrix product with no precision (``x @ y``,
``precision=None`` or ``Precision.DEFAULT``, and
``jax_default_matmul_precision`` unset) promises no arithmetic; on a recent
NVIDIA GPU jax computes it on the tensor cores -- float32 in TF32 ("TF32 on
recent GPUs", jax's matmul-precision guide), f16 and bf16 as their own
instructions into float32 --, not in float32 sums. So a test whose kernel
adds on the tensor cores and whose reference is such a product -- jax's
``WGMMATest``: f16 operands, K = 128, ``atol=5e-6`` against ``x32 @ y32``;
``test_narrow_n``: ``lax.dot`` of f16 with an f32 result, ``rtol=1e-3`` on
a sum that cancels terms up to 8191 -- sees errors of one kind on both
sides on the GPU, and passes there; against XLA:CPU's float32 sums (up to
8.5e-6 from the exact product in ``WGMMATest``, twice the kernel's own
error) it fails. Inside the mode such a product -- operands of one
floating dtype (f32, f16, bf16), the result in it or in f32, more than one
row, column and k: the shape XLA:GPU hands to a GEMM rather than rewriting
as a reduction -- computes as the emulated GPU's GEMM: f16/bf16 as
``F16_F16_F32``/``BF16_BF16_F32`` above (then rounded to a 16-bit result);
f32 in TF32, each operand's low 13 bits dropped (what the tensor core reads
of f32 bits handed to it unconverted, as Triton's GEMMs hand them, and as
the emulator's own ``.tf32`` WGMMA reads them), instructions of K = 8. A
library that rounds the operands to tf32 first (cuBLAS may) differs from
this by at most a tf32 unit per operand, well inside TF32's own error, which
a test written for the GPU allows. A subnormal f32 operand is refused
(:class:`Unsupported`, as in WGMMA: the ISA leaves subnormal inputs
unspecified). Precisions that ask for float32 (``HIGHEST``,
``F32_F32_F32``, a ``jax_default_matmul_precision`` of ``"float32"``) stay
XLA:CPU's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from . import deadline, tensorcore, tensorcore_compiled
from .errors import Unsupported

#: k values per tensor-core instruction, by operand format (WGMMA and tcgen05)
INSTRUCTION_K = {"f16": 16, "bf16": 16, "tf32": 8}
#: what the tensor core keeps of an f32 element read as tf32
TF32_MASK = np.uint32(0xFFFFE000)
#: output rows per piece of work: the accumulator of a piece stays in cache,
#: and pieces run on threads (numba's adder releases the GIL)
ROWS_PER_PIECE = 256
#: multiply-adds from which a dot loads the compiled adder at once
COMPILED_FROM = 1 << 24


@dataclass(frozen=True, slots=True)
class Algorithm:
    """A modelled preset: the operands' type and the accumulator's."""

    operands: str  # "f16", "bf16" or "tf32" (tensorcore's format names)
    accumulator: str  # "f32" or "f16"

    @property
    def operand_dtype(self) -> np.dtype:
        return np.dtype({"f16": np.float16, "bf16": ml_dtypes.bfloat16,
                         "tf32": np.float32}[self.operands])

    def convert(self, x: np.ndarray) -> np.ndarray:
        """An operand in the algorithm's input type: f16/bf16 rounded to
        nearest even (as jax's lowering converts); tf32 as the tensor core
        reads f32 bits (low 13 bits dropped), a subnormal refused."""
        if self.operands != "tf32":
            return x.astype(self.operand_dtype)
        bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
        t = (bits & TF32_MASK).view(np.float32)
        subnormal = (t != 0) & (np.abs(t) < np.finfo(np.float32).tiny)
        if subnormal.any():
            raise Unsupported(
                f"a subnormal f32 operand ({t[subnormal][0]!r}) of a default-precision dot "
                "inside smalti.emulate.on_cpu: the emulated GPU computes it in TF32 on the "
                "tensor cores, whose handling of subnormal inputs the PTX ISA leaves "
                "unspecified; fix: precision=lax.Precision.HIGHEST for a float32 product")
        return t

    @property
    def accumulator_dtype(self) -> np.dtype:
        return np.dtype(np.float32 if self.accumulator == "f32" else np.float16)


#: the presets modelled, by ``lax.DotAlgorithmPreset`` member name
MODELLED = {
    "F16_F16_F16": Algorithm("f16", "f16"),
    "F16_F16_F32": Algorithm("f16", "f32"),
    "BF16_BF16_F32": Algorithm("bf16", "f32"),
}
#: a default-precision GEMM on the emulated GPU, by its operands' dtype: float32
#: in TF32, 16-bit floats as their tensor-core instructions, all into float32
DEFAULT_GEMMS = {"float32": Algorithm("tf32", "f32"), "float16": MODELLED["F16_F16_F32"],
                 "bfloat16": MODELLED["BF16_BF16_F32"]}
#: the presets XLA:CPU computes itself (jax's CPU lowering accepts them and
#: they name no tensor-core arithmetic): left to it inside the mode too
#: (DEFAULT: see default_precision_algorithm)
LEFT_TO_XLA = ("DEFAULT", "F32_F32_F32", "F64_F64_F64", "BF16_BF16_F32_X3", "BF16_BF16_F32_X6")


def algorithm(precision: object) -> Algorithm | None:
    """The modelled algorithm ``precision`` (``dot_general``'s parameter) names,
    ``None`` where XLA:CPU computes the dot; :class:`Unsupported` for a preset
    that names GPU arithmetic the emulator does not model."""
    from jax import lax

    if not isinstance(precision, lax.DotAlgorithmPreset):
        if isinstance(precision, lax.DotAlgorithm):
            raise Unsupported(
                f"lax.dot_general with precision={precision!r} inside smalti.emulate.on_cpu: "
                "a custom DotAlgorithm is not modelled; fix: use one of the presets "
                f"{', '.join(MODELLED)}, or call the dot outside the mode")
        return None  # None, or lax.Precision values: XLA:CPU's
    name = precision.name
    if name in MODELLED:
        return MODELLED[name]
    if name in LEFT_TO_XLA:
        return None
    raise Unsupported(
        f"lax.dot_general with precision=DotAlgorithmPreset.{name} inside "
        "smalti.emulate.on_cpu: the emulated GPU models the tensor-core presets "
        f"{', '.join(MODELLED)} only ({name}'s arithmetic on the GPU -- its operand "
        "conversion or accumulation -- is not modelled); fix: use one of those presets, "
        "or compute the reference outside the mode")


def default_precision_algorithm(precision: object, lhs: Any, rhs: Any, out: Any,
                                dimension_numbers: Any) -> Algorithm | None:
    """The algorithm of :data:`DEFAULT_GEMMS` for a product at default
    precision that XLA:GPU would hand to a GEMM (see the module's
    docstring): operands of one floating dtype, the result in it or float32
    -- ``lhs``, ``rhs`` and ``out`` are the avals --; ``None`` for any other
    dot."""
    import jax
    from jax import lax

    default = precision is None or precision == lax.DotAlgorithmPreset.DEFAULT or (
        isinstance(precision, tuple)
        and all(p in (None, lax.Precision.DEFAULT) for p in precision))
    if not default or (precision is None and jax.config.jax_default_matmul_precision
                       not in (None, "tensorfloat32")):
        return None
    operands, result = np.dtype(lhs.dtype), np.dtype(out.dtype)
    algo = DEFAULT_GEMMS.get(operands.name)
    if algo is None or np.dtype(rhs.dtype) != operands or result not in (operands, np.float32):
        return None
    (lhs_k, rhs_k), (lhs_b, rhs_b) = dimension_numbers
    rows = _size(lhs.shape, _free(len(lhs.shape), lhs_k, lhs_b))
    cols = _size(rhs.shape, _free(len(rhs.shape), rhs_k, rhs_b))
    k = _size(lhs.shape, lhs_k)
    # a matrix-vector product, an outer product or a sum of one term is a
    # reduction or a multiply on XLA:GPU, in float32
    return algo if rows > 1 and cols > 1 and k > 1 else None


def _free(ndim: int, contracting: Sequence[int], batch: Sequence[int]) -> list[int]:
    """An operand's free dimensions: neither contracting nor batch."""
    return [d for d in range(ndim) if d not in (*contracting, *batch)]


def _size(shape: Sequence[int], dims: Sequence[int]) -> int:
    """The number of elements over ``dims`` of ``shape``."""
    return int(np.prod([shape[d] for d in dims], dtype=np.int64))


def dot_general(lhs: np.ndarray, rhs: np.ndarray,
                dimension_numbers: tuple[tuple[Sequence[int], Sequence[int]],
                                         tuple[Sequence[int], Sequence[int]]],
                algo: Algorithm, arch: tuple[int, int], out_dtype: np.dtype) -> np.ndarray:
    """``lax.dot_general(lhs, rhs, dimension_numbers)`` with ``algo`` as the
    tensor core of ``arch`` computes it (see the module's docstring); the
    result in ``out_dtype``, dimensions ordered as ``dot_general`` orders them
    (batch, then lhs's free, then rhs's free)."""
    (lhs_k, rhs_k), (lhs_b, rhs_b) = dimension_numbers
    lhs_free = _free(lhs.ndim, lhs_k, lhs_b)
    rhs_free = _free(rhs.ndim, rhs_k, rhs_b)
    batch_shape = [lhs.shape[d] for d in lhs_b]
    out_shape = (*batch_shape, *(lhs.shape[d] for d in lhs_free),
                 *(rhs.shape[d] for d in rhs_free))

    def grouped(x: np.ndarray, batch: Sequence[int], free: list[int],
                contracting: Sequence[int]) -> np.ndarray:
        """x as (batch, rows, k): its dimensions moved, flattened by kind."""
        size = [_size(x.shape, dims) for dims in (batch, free, contracting)]
        moved = np.transpose(x, (*batch, *free, *contracting))
        return algo.convert(moved).reshape(size)

    a = grouped(lhs, lhs_b, lhs_free, lhs_k)  # (B, M, K)
    b = grouped(rhs, rhs_b, rhs_free, rhs_k)  # (B, N, K)
    out = np.zeros((0, a.shape[1], b.shape[1]), algo.accumulator_dtype)
    if a.shape[0]:
        out = np.stack([contract(a[i], b[i], algo, arch) for i in range(a.shape[0])])
    with np.errstate(over="ignore"):  # as XLA's convert: out of range is inf
        return out.astype(out_dtype).reshape(out_shape)


def contract(a: np.ndarray, b: np.ndarray, algo: Algorithm,
             arch: tuple[int, int]) -> np.ndarray:
    """``a @ b.T`` ((M, K) and (N, K) operands of ``algo``'s type) in its
    accumulator's type, one instruction (K = 16, or 8 for tf32) at a time in
    ascending k, as the tensor core of ``arch`` adds; (M, N) rows in pieces
    on threads."""
    instruction = instruction_of(arch)
    step = INSTRUCTION_K[algo.operands]
    m, k = a.shape
    if m == 0:
        return np.zeros((0, b.shape[0]), algo.accumulator_dtype)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    # a large product pays for loading the compiled adder at once (its first
    # sums would otherwise be numpy's: tensorcore_compiled.LOAD_AFTER)
    compiled = (True if m * b.shape[0] * k >= COMPILED_FROM and tensorcore_compiled.available()
                else None)

    def piece(start: int) -> np.ndarray:
        # a test runner's timeout stops a reference dot as it stops a kernel
        deadline.check(f"a tensor-core dot_general, rows {start}..")
        rows = a64[start:start + ROWS_PER_PIECE]
        acc: np.ndarray | None = None  # the first instruction adds no D
        for k0 in range(0, k, step):
            acc = instruction(rows[:, k0:k0 + step], b64[:, k0:k0 + step], acc, algo, compiled)
        if acc is None:  # K = 0: an empty sum
            return np.zeros((rows.shape[0], b.shape[0]), algo.accumulator_dtype)
        return acc

    starts = range(0, m, ROWS_PER_PIECE)
    if len(starts) == 1:
        return piece(0)
    with ThreadPoolExecutor(min(len(starts), os.cpu_count() or 1)) as pool:
        return np.concatenate(list(pool.map(piece, starts)))


def instruction_of(arch: tuple[int, int]) -> Callable[..., np.ndarray]:
    """The tensor-core instruction of ``arch`` (sm_9x: WGMMA, sm_10x:
    ``tcgen05.mma``); :class:`Unsupported` for another."""
    if arch[0] == 9:
        return _hopper
    if arch[0] == 10:
        return _blackwell
    raise Unsupported(f"a tensor-core dot algorithm on the emulated sm_{arch[0]}{arch[1]}: "
                      "the emulator's tensor cores are sm_90's (WGMMA) and sm_100's "
                      "(tcgen05); fix: on_cpu(arch=(9, 0)) or on_cpu(arch=(10, 0))")


def _hopper(a: np.ndarray, b: np.ndarray, acc: np.ndarray | None,
            algo: Algorithm, compiled: bool | None = None) -> np.ndarray:
    """One WGMMA instruction: the H200's adder (:func:`.tensorcore.mma`)."""
    return tensorcore.mma(a, b, acc, operands=algo.operands, accumulator=algo.accumulator,
                          compiled=compiled)


def _blackwell(a: np.ndarray, b: np.ndarray, acc: np.ndarray | None,
               algo: Algorithm, compiled: bool | None = None) -> np.ndarray:
    """One ``tcgen05.mma``, as :mod:`.ops.tcgen05` computes it: the K products
    summed in float64, D added, rounded once to D's type (nearest even)."""
    total = a @ b.T
    if acc is not None:
        total = total + acc.astype(np.float64)
    with np.errstate(over="ignore"):
        return total.astype(algo.accumulator_dtype)
