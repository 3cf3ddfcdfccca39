"""Differential testing against jax's own Mosaic GPU middle-end (the reference).

Only tests may import jax's ``layout_inference`` / ``dialect_lowering``: they
are what smalti must agree with.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence

import jax
from jax._src.lib.mlir import ir
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa

import smalti
from smalti import kernels
from smalti.registry import installed_jax

_DUMP_NAME = re.compile(r', mosaic_gpu.dump_basename = "[^"]*"')


def normalized(module: ir.Module) -> str:
    """Module text without the per-process dump counter jax stamps on modules."""
    return _DUMP_NAME.sub("", str(module))


def jax_infer(kernel: kernels.Kernel, arch=(9, 0)) -> None:
    with kernel.context, ir.Location.unknown(kernel.context):
        mgpu.infer_layout(kernel.module, arch=arch)


def jax_lower(kernel: kernels.Kernel) -> None:
    with kernel.context, ir.Location.unknown(kernel.context):
        mgpu.lower_mgpu_dialect(kernel.module, kernel.launch_context)


def smalti_infer(kernel: kernels.Kernel, arch=(9, 0)) -> None:
    smalti.infer_layouts(kernel.module, arch=arch)


def smalti_lower(kernel: kernels.Kernel) -> None:
    smalti.lower(kernel.module, kernel.launch_context)


#: The code generators' own exceptions: jax lets them escape as they are;
#: smalti reports them as SM203, a NotImplementedError with their message.
CODEGEN_EXCEPTIONS = (fa.TransferPlanDerivationError, fa.UnsupportedTransferError,
                      fa.TxMatrixIneligible)


def assert_same_refusal(theirs: BaseException, ours: BaseException | None) -> None:
    """smalti refused what jax refused, the same way: a SmaltiError of jax's
    built-in class (ValueError, NotImplementedError) keeping jax's message —
    or, where a code generator refused, SM203 with the generator's message."""
    assert ours is not None, f"jax refuses with {type(theirs).__name__}: {theirs}; smalti does not"
    assert isinstance(ours, smalti.SmaltiError), ours
    phrase = str(theirs).splitlines()[0]
    if isinstance(theirs, CODEGEN_EXCEPTIONS):
        assert ours.code == "SM203" and isinstance(ours, NotImplementedError), ours
    else:
        builtin = next(c for c in (NotImplementedError, ValueError) if isinstance(theirs, c))
        assert isinstance(ours, builtin), ours
    assert phrase in str(ours), (phrase, str(ours))


#: jax 0.11.2, smalti's first target, lowers every kernel of the
#: differential suite: a refusal there is a broken test, not a result.
REFUSALS_COMPARED = installed_jax() >= (0, 12)


def refusal(call: Callable[[], object]) -> BaseException | None:
    """What ``call`` raises, or None. Under jax 0.11 nothing is compared:
    what it raises propagates."""
    try:
        call()
    except Exception as error:  # noqa: BLE001 - any refusal is compared
        if not REFUSALS_COMPARED:
            raise
        return error
    return None


def build_twice(body: Callable[..., None], in_shapes: Sequence[jax.ShapeDtypeStruct],
                out_shapes: Sequence[jax.ShapeDtypeStruct], smem_scratch=()
                ) -> tuple[kernels.Kernel, kernels.Kernel]:
    """The same kernel twice: one for jax, one for smalti."""
    reference = kernels.build_kernel(body, in_shapes, out_shapes, smem_scratch=smem_scratch)
    candidate = kernels.build_kernel(body, in_shapes, out_shapes, smem_scratch=smem_scratch)
    assert normalized(reference.module) == normalized(candidate.module)
    return reference, candidate


def walk_ops(module: ir.Module) -> Iterator[ir.Operation]:
    """Every op of ``module``, in pre-order."""
    def visit(op: ir.Operation) -> Iterator[ir.Operation]:
        yield op
        for region in op.regions:
            for block in region.blocks:
                for child in block.operations:
                    yield from visit(child.operation)

    for op in module.body.operations:
        yield from visit(op.operation)


def ops_named(module: ir.Module, name: str) -> list[ir.Operation]:
    return [op for op in walk_ops(module) if op.name == name]


def assert_same_as_jax(
    body: Callable[..., None],
    in_shapes: Sequence[jax.ShapeDtypeStruct],
    out_shapes: Sequence[jax.ShapeDtypeStruct],
    *,
    lower: bool = True,
    arch=(9, 0),
    smem_scratch=(),
) -> tuple[kernels.Kernel, kernels.Kernel]:
    """Builds the kernel twice; checks smalti's inferred attributes and lowered
    module equal jax's. Returns (jax's kernel, smalti's kernel)."""
    reference, candidate = build_twice(body, in_shapes, out_shapes, smem_scratch)
    jax_infer(reference, arch)
    smalti_infer(candidate, arch)
    assert normalized(candidate.module) == normalized(reference.module), "inferred layouts differ"
    if lower:
        # What the installed jax's own lowering refuses (jax 0.12 requires
        # optimized transfers where 0.11 fell back), smalti must refuse alike.
        theirs = refusal(lambda: jax_lower(reference))
        if theirs is not None:
            assert_same_refusal(theirs, refusal(lambda: smalti_lower(candidate)))
            return reference, candidate
        smalti_lower(candidate)
        assert normalized(candidate.module) == normalized(reference.module), "lowered IR differs"
    return reference, candidate
