"""What a fuzz case must satisfy, shared by the suite and scripts/fuzz_campaign.py.

Each ``check_*`` function runs one case, raises ``AssertionError`` when smalti
misbehaves, and otherwise returns an outcome label to count (e.g.
``"agree"`` or ``"jax ValueError / smalti SM101"``).
"""

from __future__ import annotations

import math
import random

from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts

import smalti
from smalti import codes, kernels
from tests.differential import jax_infer, jax_lower, normalized
from tests.fuzz.kernels import Recipe, well_formed

LAYOUT_ATTRIBUTES = ("in_layouts", "out_layouts", "in_transforms", "out_transforms")
#: Raised by a rule or code generator mid-rewrite: lowering cannot check them
#: up front, so the module may be partly lowered.
REWRITE_TIME_CODES = frozenset({"SM005", "SM006", "SM203"})


def check_error(error: smalti.SmaltiError) -> None:
    """A smalti error carries a known code, a message, a fix, and names the op."""
    assert error.code in codes.CATALOGUE, error.code
    assert error.message and error.fixes, f"{error.code} without message or fix: {error}"
    if error.code[2] in "12" and error.code != "SM202":
        assert error.op, f"{error.code} names no op: {error}"
    assert f"[{error.code}]" in str(error)


def _run(step, *args) -> tuple[bool, BaseException | None]:
    try:
        step(*args)
        return True, None
    except Exception as e:  # noqa: BLE001 - classified by the caller
        return False, e


def _smalti(step, kernel: kernels.Kernel, what: str) -> smalti.SmaltiError | None:
    """Runs a smalti ``step``; only smalti errors may come out, and a failed
    step leaves the module as it was."""
    before = str(kernel.module)
    ok, error = _run(step, kernel)
    if ok:
        return None
    if not isinstance(error, smalti.SmaltiError):
        raise AssertionError(f"{what} raised a bare {type(error).__name__}: {error}") from error
    check_error(error)
    if what == "infer_layouts" or error.code not in REWRITE_TIME_CODES:
        assert str(kernel.module) == before, f"a failed {what} changed the module ({error.code})"
    return error


def _infer(kernel: kernels.Kernel) -> None:
    smalti.infer_layouts(kernel.module)


def _lower(kernel: kernels.Kernel) -> None:
    smalti.lower(kernel.module, kernel.launch_context)


def _label(reference: BaseException | None, ours: smalti.SmaltiError | None) -> str:
    theirs = "ok" if reference is None else type(reference).__name__
    label = f"jax {theirs} / smalti {'ok' if ours is None else ours.code}"
    if reference is not None and ours is not None:
        builtin = next((c for c in (NotImplementedError, ValueError) if isinstance(reference, c)),
                       None)
        if builtin is not None and not isinstance(ours, builtin):
            label += f" (CLASS DIFFERS: smalti's is not a {builtin.__name__})"
    return label


def check_well_formed(recipe: Recipe) -> str:
    """smalti agrees with jax: the same attributes and IR where jax succeeds;
    a smalti error (or success) where jax fails."""
    reference, candidate = recipe.build(), recipe.build()
    jax_ok, jax_error = _run(jax_infer, reference)
    error = _smalti(_infer, candidate, "infer_layouts")
    if jax_ok:
        assert error is None, f"jax infers the kernel, smalti fails: {error}"
        assert normalized(candidate.module) == normalized(reference.module), \
            "inferred layouts differ"
    if jax_ok != (error is None):
        return "infer: " + _label(jax_error, error)
    if not jax_ok:
        return "infer: " + _label(jax_error, error)
    jax_ok, jax_error = _run(jax_lower, reference)
    error = _smalti(_lower, candidate, "lower")
    if jax_ok and error is None:
        assert normalized(candidate.module) == normalized(reference.module), "lowered IR differs"
        return "agree"
    if jax_ok:
        raise AssertionError(f"jax lowers the kernel, smalti fails: {error}")
    return "lower: " + _label(jax_error, error)


# --- ill-formed inputs -------------------------------------------------------------------


def _layout_ops(module: ir.Module) -> list[ir.Operation]:
    from tests.differential import walk_ops

    return [op for op in walk_ops(module)
            if any(name in op.attributes for name in LAYOUT_ATTRIBUTES)]


def _vector_values(module: ir.Module) -> list[tuple[ir.Operation, ir.Value]]:
    from tests.differential import walk_ops

    return [(op, r) for op in walk_ops(module) for r in op.results
            if isinstance(r.type, ir.VectorType)]


def _unknown_op(kernel: kernels.Kernel, rnd: random.Random) -> None:
    """Feeds a vector through an op no plugin knows (an unregistered dialect)."""
    kernel.context.allow_unregistered_dialects = True
    candidates = [(op, v) for op, v in _vector_values(kernel.module)
                  if op.name != "arith.constant" and len(list(v.uses))]
    if not candidates:
        return
    op, value = rnd.choice(candidates)
    with kernel.context, ir.Location.file("kernel.py", 999, 1), ir.InsertionPoint.after(op):
        unknown = ir.Operation.create("mydialect.mystery", results=[value.type],
                                      operands=[value])
    value.replace_all_uses_except(unknown.result, unknown)


MUTATIONS = ("lower_without_infer", "deleted_attribute", "extra_entry", "unknown_op_infer",
             "unknown_op_lower", "shape_mismatch_attribute")


def check_ill_formed(seed: int) -> str:
    """A random well-formed kernel, broken on purpose: only smalti errors come
    out, and a failed step leaves the module unchanged."""
    rnd = random.Random(seed)
    mutation = rnd.choice(MUTATIONS)
    recipe = well_formed(rnd.randrange(2**32))
    kernel = recipe.build()
    if mutation == "lower_without_infer":
        error = _smalti(_lower, kernel, "lower")
        return f"{mutation}: {'ok' if error is None else error.code}"
    if mutation.startswith("unknown_op"):
        _unknown_op(kernel, rnd)
        step, what = (_infer, "infer_layouts") if mutation.endswith("infer") else (_lower, "lower")
        error = _smalti(step, kernel, what)
        return f"{mutation}: {'ok' if error is None else error.code}"
    if _smalti(_infer, kernel, "infer_layouts") is not None:
        return f"{mutation}: not inferable"
    ops = _layout_ops(kernel.module)
    op = rnd.choice(ops)
    name = rnd.choice([n for n in LAYOUT_ATTRIBUTES if n in op.attributes])
    with kernel.context:
        entries = list(ir.ArrayAttr(op.attributes[name]))
        if mutation == "deleted_attribute":
            del op.attributes[name]
        elif mutation == "extra_entry":
            op.attributes[name] = ir.ArrayAttr.get(entries + entries[:1])
        else:  # a layout made for another shape
            if not name.endswith("layouts"):
                return f"{mutation}: nothing to swap"
            shape = rnd.choice([(64,), (256,), (64, 64), (256, 128)])
            # A strided layout needs at least one element per thread.
            kinds = [fa.WGSplatFragLayout(shape)]
            if math.prod(shape) % fa.WARPGROUP_SIZE == 0:
                kinds.append(fa.WGStridedFragLayout(shape, 1))
            wrong = rnd.choice(kinds)
            index = rnd.randrange(len(entries))
            entries[index] = mgpu_layouts.to_layout_attr(wrong)
            op.attributes[name] = ir.ArrayAttr.get(entries)
    error = _smalti(_lower, kernel, "lower")
    return f"{mutation}: {'ok' if error is None else error.code}"
