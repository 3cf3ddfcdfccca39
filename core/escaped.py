"""jax errors escaping Pallas' Warpgroup lowering rules, as smalti errors.

While smalti is installed, every rule Pallas takes from its Warpgroup rule
table (jax's own and the plugins') runs inside :func:`guarded`:

- an exception that is not already a smalti error (an ``AssertionError`` of
  Mosaic GPU's code generators, a ``ValueError`` or ``NotImplementedError``
  of a Pallas rule, a ``TypeError`` of the MLIR bindings) becomes ``SM207``
  with the primitive, its operand types, the kernel's line (Pallas makes the
  equation's location current while its rule runs), jax's message and what
  to do. The error is still an instance of the built-in class jax raised,
  so ``except ValueError`` and the like keep working;
- the rule's results are checked the way Pallas checks them after the rule
  returns (a vector of the result's shape and element type for an array, a
  non-vector value of its type for a 0-D one): a mismatch Pallas would
  report as a bare ``AssertionError`` ("Scalars must be represented by
  non-vector types") outside the rule, with no line, is ``SM207`` (an
  ``AssertionError`` still) naming the rule that produced it.

A rule that calls other rules (``jit``, ``cond``, ``_lower_fun``
decompositions) sees their smalti errors pass through: the innermost
primitive is the one named, and an error without a line (Pallas' locations
inside jnp's own ``jit``s name only the primitive) gets the line of the
enclosing equation, the kernel's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from jax._src import core as jax_core
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.diagnostics import (
    SmaltiError,
    SmaltiNotImplementedError,
    SmaltiValueError,
    format_location,
)

#: smalti's error class for each built-in class jax's rules raise (others:
#: a class made on first use, a subclass of SmaltiError and of jax's class).
_CLASSES: dict[type, type] = {
    ValueError: SmaltiValueError,
    NotImplementedError: SmaltiNotImplementedError,
}


def _smalti_class(kind: type) -> type:
    """A smalti error class that is also an instance of ``kind`` where
    Python allows it (plain exception layouts), else SmaltiNotImplementedError."""
    if kind not in _CLASSES:
        try:
            _CLASSES[kind] = type(f"Smalti{kind.__name__}", (SmaltiError, kind), {})
        except TypeError:  # an incompatible layout (OSError, ...)
            _CLASSES[kind] = SmaltiNotImplementedError
    return _CLASSES[kind]


def _where() -> str | None:
    try:
        return format_location(ir.Location.current)
    except ValueError:
        return None


def _operands(ctx: Any) -> str:
    return ", ".join(a.str_short() for a in getattr(ctx, "avals_in", ()))


def _rule_name(rule: Callable) -> str:
    inner = getattr(rule, "__wrapped__", rule)
    inner = getattr(inner, "func", inner)  # functools.partial
    module = getattr(inner, "__module__", None) or "?"
    return f"{module}.{getattr(inner, '__qualname__', repr(inner))}"


FIXES = [
    "write the computation with functions that lower (docs/vocabulary.md lists what "
    "smalti.vocabulary adds)",
    "or lower the primitive in a plugin: registry.pallas_lowering(primitive) in "
    "smalti_register_pallas_lowerings (docs/writing-plugins.md)",
]


def escaped(primitive: Any, ctx: Any, rule: Callable, error: Exception) -> SmaltiError:
    """The smalti error for ``error``, raised by ``rule`` lowering ``primitive``."""
    name = getattr(primitive, "name", str(primitive))
    text = str(error).strip().splitlines()
    return _smalti_class(type(error))(
        "SM207", f"{type(error).__name__} in Pallas' lowering of {name}: "
        f"{text[0] if text else type(error).__name__}", location=_where(),
        values={"primitive": name, "operands": _operands(ctx), "rule": _rule_name(rule)},
        fix=FIXES)


def _problem(value: Any, aval: Any) -> str | None:
    """What Pallas' check of a lowered value would assert, or None."""
    if not isinstance(aval, jax_core.ShapedArray):
        return None
    if not isinstance(value, ir.Value):
        return f"a {type(value).__name__} instead of an MLIR value"
    element = mgpu_utils.dtype_to_ir_type(aval.dtype)
    if aval.shape:
        if not isinstance(value.type, ir.VectorType):
            return f"a {value.type} where an array needs a vector"
        vector = ir.VectorType(value.type)
        if vector.element_type != element or tuple(vector.shape) != tuple(aval.shape):
            return f"a {value.type} for a {aval.str_short()} array"
        return None
    if isinstance(value.type, ir.VectorType):
        return f"a {value.type} where a scalar needs a non-vector type"
    if value.type != element:
        return f"a {value.type} for a {aval.str_short()} scalar"
    return None


def _check(primitive: Any, ctx: Any, rule: Callable, results: Any) -> None:
    avals = list(getattr(ctx, "avals_out", ()))
    values = list(results) if getattr(primitive, "multiple_results", False) else [results]
    if len(values) != len(avals):
        return  # Pallas' own error about the count is clear enough (and rare)
    for k, (value, aval) in enumerate(zip(values, avals)):
        problem = _problem(value, aval)
        if problem is not None:
            name = getattr(primitive, "name", str(primitive))
            raise _smalti_class(AssertionError)(
                "SM207", f"Pallas' lowering of {name} returned {problem} (result {k}): "
                "Pallas would refuse it with a bare AssertionError", location=_where(),
                values={"primitive": name, "operands": _operands(ctx),
                        "result": aval.str_short(), "rule": _rule_name(rule)},
                fix=["compute it on arrays rather than 0-D values (jnp.full(x.shape, c) "
                     "instead of c), or on 0-D values the rule handles", *FIXES[1:],
                     "if the rule is a plugin's: return an MLIR vector of the result's shape "
                     "for an array, a scalar MLIR value for a 0-D result"])


def _locate(error: SmaltiError) -> None:
    """Gives an error from a nested rule without a line (inside jnp's own
    ``jit``s, Pallas' locations name only the primitive) the line of the
    enclosing equation: the kernel's."""
    if error.location is None and (where := _where()) is not None:
        error.location = where
        error.args = (error.render(),)


def guarded(primitive: Any, rule: Callable) -> Callable:
    """``rule``, with escaping jax errors and malformed results as SM207."""

    @functools.wraps(rule)
    def guarded_rule(ctx: Any, *args: Any, **params: Any) -> Any:
        try:
            results = rule(ctx, *args, **params)
        except SmaltiError as e:
            _locate(e)
            raise
        except Exception as e:  # noqa: BLE001 -- any jax error becomes a smalti one
            raise escaped(primitive, ctx, rule, e) from e
        _check(primitive, ctx, rule, results)
        return results

    guarded_rule.smalti_guarded = True  # type: ignore[attr-defined]
    return guarded_rule
