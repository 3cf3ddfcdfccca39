"""What an integer index is known to be, read from the MLIR ops that
computed it: the facts that let a gather leave out its bounds checks.

Two questions, asked of the value a rule is handed (an ``ir.Value`` of a
scalar or vector of integers):

- :func:`bounds`: the signed range ``(lo, hi)`` (inclusive) every element
  is known to lie in, or None. It is inferred backwards through the ops
  index arithmetic uses, as MLIR's integer range analysis
  (``InferIntRangeInterface``) infers it forwards: constants, ``andi`` with
  a non-negative operand (``idx & (n - 1)``), ``remui``/``remsi`` by a
  constant (``idx % n``), ``minsi``/``maxsi`` (``jnp.clip``), ``select``,
  ``addi``/``subi`` that cannot overflow, ``shrui``/``shrsi`` by a
  constant, ``extui``/``extsi`` and the moves that keep elements
  (broadcasts, shape casts, layout casts). Anything else is unknown. The
  walk is bounded (:data:`DEPTH` ops deep), so it costs nothing on long
  chains.
- :func:`unwrapped`: ``c`` where the value is jnp's normalization of a
  negative index, ``select(c < 0, c + n, c)`` (what ``take_along_axis``,
  ``x[idx]`` and ``.at[idx]`` emit before their gather or scatter), so the
  gather can fold the wrap into its own bounds check instead of paying
  both; the normalization's ops, no longer read, are dead and left out (as
  LLVM removes them).

Both only read the IR; they never create or change an op.
"""

from __future__ import annotations

from jax._src.lib.mlir import ir

__all__ = ["bounds", "constant", "defining_op", "unwrapped", "DEPTH"]

#: How many ops deep :func:`bounds` looks before it calls a value unknown.
DEPTH = 12

Range = tuple[int, int]

#: Ops whose result has the elements of their first operand, moved or cast
#: to another shape or layout.
_MOVES = frozenset({"vector.broadcast", "vector.splat", "vector.shape_cast",
                    "mosaic_gpu.layout_cast"})


def defining_op(value: ir.Value) -> ir.Operation | None:
    """The op that defines ``value``; None for a block argument or a Python value."""
    owner = getattr(value, "owner", None)
    op = getattr(owner, "operation", owner)
    return op if isinstance(op, ir.Operation) else None


def _bits(value: ir.Value) -> int | None:
    t = value.type
    if isinstance(t, ir.VectorType):
        t = ir.VectorType(t).element_type
    if isinstance(t, ir.IntegerType):
        return ir.IntegerType(t).width
    return None


def _full(bits: int) -> Range:
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def constant(value: ir.Value) -> int | None:
    """The integer every element of ``value`` is, where an ``arith.constant``
    (a scalar or a splat), possibly broadcast, defines it; None otherwise."""
    op = defining_op(value)
    while op is not None and op.name in _MOVES:
        value = op.operands[0]
        op = defining_op(value)
    if op is None or op.name != "arith.constant":
        return None
    attr = op.attributes["value"]
    if isinstance(attr, ir.IntegerAttr):
        return ir.IntegerAttr(attr).value
    if isinstance(attr, ir.DenseElementsAttr):
        dense = ir.DenseElementsAttr(attr)
        splat = dense.get_splat_value() if dense.is_splat else None
        if isinstance(splat, ir.IntegerAttr):
            return ir.IntegerAttr(splat).value
    return None


def bounds(value: ir.Value, depth: int = DEPTH) -> Range | None:
    """The inclusive signed range every element of ``value`` lies in, or
    None where the ops that computed it say nothing narrower than its type."""
    bits = _bits(value)
    if bits is None:
        return None
    found = _bounds(value, depth)
    return None if found is None or found == _full(bits) else found


def _bounds(value: ir.Value, depth: int) -> Range | None:
    bits = _bits(value)
    if bits is None:
        return None
    lo_t, hi_t = _full(bits)
    c = constant(value)
    if c is not None:
        c = c - (1 << bits) if c > hi_t else c  # an i32 constant may read as unsigned
        return c, c
    op = defining_op(value)
    if op is None or depth <= 0:
        return lo_t, hi_t
    name, operands = op.name, list(op.operands)

    def of(k: int) -> Range:
        found = _bounds(operands[k], depth - 1)
        return found if found is not None else (lo_t, hi_t)

    if name in _MOVES:
        return of(0)
    if name == "arith.andi":
        a, b = of(0), of(1)
        his = [r[1] for r in (a, b) if r[0] >= 0]  # x & m, m >= 0, is in [0, m]
        return (0, min(his)) if his else (lo_t, hi_t)
    if name in ("arith.remui", "arith.remsi"):
        d = constant(operands[1])
        if d is None or d <= 0:
            return lo_t, hi_t
        a = of(0)
        if name == "arith.remui" or a[0] >= 0:
            return (0, min(d - 1, a[1])) if a[0] >= 0 else (0, d - 1)
        return -(d - 1), d - 1
    if name in ("arith.minsi", "arith.maxsi"):
        (a0, a1), (b0, b1) = of(0), of(1)
        pick = min if name == "arith.minsi" else max
        return pick(a0, b0), pick(a1, b1)
    if name == "arith.select":
        (a0, a1), (b0, b1) = of(1), of(2)
        return min(a0, b0), max(a1, b1)
    if name in ("arith.addi", "arith.subi"):
        (a0, a1), (b0, b1) = of(0), of(1)
        lo, hi = (a0 + b0, a1 + b1) if name == "arith.addi" else (a0 - b1, a1 - b0)
        return (lo, hi) if lo_t <= lo and hi <= hi_t else (lo_t, hi_t)  # no wrap-around
    if name in ("arith.shrui", "arith.shrsi"):
        k = constant(operands[1])
        if k is None or not 0 <= k < bits:
            return lo_t, hi_t
        a0, a1 = of(0)
        if name == "arith.shrsi" or a0 >= 0:
            return a0 >> k, a1 >> k
        return (0, (1 << (bits - k)) - 1) if k else (lo_t, hi_t)
    if name in ("arith.extui", "arith.extsi"):
        narrow = _bits(operands[0])
        if narrow is None:
            return lo_t, hi_t
        if name == "arith.extui":
            a0, a1 = of(0)
            return (a0, a1) if a0 >= 0 else (0, (1 << narrow) - 1)
        return of(0)
    return lo_t, hi_t


def unwrapped(value: ir.Value, n: int) -> ir.Value | None:
    """``c`` where ``value`` is ``select(c < 0, c + n, c)`` (jnp's wrap of
    negative indices into an axis of ``n``, with either operand order of
    the add; ``c`` has ``value``'s type); None otherwise."""
    op = defining_op(value)
    if op is None or op.name != "arith.select":
        return None
    test, added, kept = op.operands
    test_op, add_op = defining_op(test), defining_op(added)
    if test_op is None or add_op is None or test_op.name != "arith.cmpi" \
            or add_op.name != "arith.addi":
        return None
    if ir.IntegerAttr(test_op.attributes["predicate"]).value != _SLT \
            or test_op.operands[0] != kept or constant(test_op.operands[1]) != 0:
        return None
    a, b = add_op.operands
    if not ((a == kept and constant(b) == n) or (b == kept and constant(a) == n)):
        return None
    return kept


#: ``arith.cmpi``'s predicate number for signed less-than.
_SLT = 2
