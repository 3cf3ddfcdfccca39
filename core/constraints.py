"""The constraint language in which plugins state what layouts an op needs.

A constraint rule (see :mod:`smalti.hookspec`) describes one op with:

- **variables** (:class:`Variable`), one per group of the op's operands,
  results and block arguments that must share a layout. Core connects each
  operand's variable to its producer's: a register value may be *relaid out*
  on the way (only splat values can change layout implicitly), a ref keeps
  its transforms / TMEM layout;
- **constants** (:mod:`smalti.layouts`): register layouts, SMEM transforms,
  TMEM layouts;
- **expressions** deriving a layout from another: :class:`Reduced`,
  :class:`Reshaped`, :class:`Transposed`, :class:`Collapsed`;
- **constraints** between them: :class:`Equal`, :class:`Relayout`,
  :class:`Excludes`, :class:`OneOf`, :class:`Divides`,
  :class:`MinorDimDivisibleBy`, :class:`TransferableSmem`,
  :class:`TransferableTmem`, :class:`SupportedBroadcast`.

The language is open: a plugin may define its own constraint by subclassing
:class:`Constraint` and implementing :meth:`Constraint.check` (and, to guide
the search, :meth:`Constraint.candidates`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final

from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import tcgen05

from smalti import layouts
from smalti.layouts import Constant, MemorySpace, RegisterLayout, SmemTransforms, TmemLayout
from smalti.records import Fields

if TYPE_CHECKING:
    from smalti.sites import Row, ValueSite


class Variable:
    """An unknown layout shared by one or more value sites of one op.

    Variables are created by :meth:`smalti.rules.ConstraintBuilder.variable`;
    they compare by identity.
    """

    __slots__ = ("id", "site", "memory_space", "type", "shape", "fit_key", "_row",
                 "__weakref__")

    id: int
    #: The site it is named after (in errors and explanations). Made when
    #: first asked for if the variable was made from a row (see
    #: row_variable): most never are.
    site: ValueSite
    memory_space: MemorySpace
    type: ir.Type
    #: The shape of the values of the variable's sites. A plain attribute
    #: (rules read it often); an SMEM ref's is read only when first asked
    #: for (see __getattr__): kernels have many refs, and few rules ask.
    shape: tuple[int, ...]
    #: What decides which layouts fit: the shape of a register or TMEM
    #: value, the whole type of an SMEM ref. Made when first asked for (see
    #: __getattr__): only classes that mix kinds need it.
    fit_key: tuple[object, ...]
    _row: Row

    def __init__(self, id: int, site: ValueSite, memory_space: MemorySpace,
                 shape: tuple[int, ...] | None = None) -> None:
        """``shape``, if given, is the shape of the site's type (known to the
        caller: reading it again through the bindings is slow)."""
        make_variable(id, site, memory_space, shape, self)

    def __getattr__(self, name: str) -> Any:
        # Only for slots never set: an SMEM ref's shape, the fit key and a
        # site, on first use.
        if name == "site":
            from smalti.sites import site_of  # smalti.sites imports this module

            self.site = site_of(self._row)
            return self.site
        if name == "shape":
            self.shape = _shape_of(self.type)
            return self.shape
        if name == "fit_key":
            space = self.memory_space
            self.fit_key = (space, self.type if space is MemorySpace.SMEM else self.shape)
            return self.fit_key
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"V{self.id}({self.site})"

    __str__ = __repr__


def make_variable(id: int, site: ValueSite, memory_space: MemorySpace,
                  shape: tuple[int, ...] | None, var: Variable | None = None) -> Variable:
    """``Variable(id, site, memory_space, shape)`` without the constructor's
    call (inference makes one per op); the constructor fills ``var`` here."""
    if var is None:
        var = object.__new__(Variable)
    var.id = id
    var.site = site
    var.memory_space = memory_space
    var.type = ty = site.type
    if memory_space is not MemorySpace.SMEM:
        var.shape = _shape_of(ty) if shape is None else shape
    elif shape is not None:
        var.shape = shape
    return var


def row_variable(id: int, row: Row, memory_space: MemorySpace,
                 shape: tuple[int, ...]) -> Variable:
    """A variable of values of ``shape``, named after the site of ``row``
    (see :meth:`smalti.sites.SiteTable.read`), made only if asked for."""
    var = object.__new__(Variable)
    var.id = id
    var._row = row
    var.memory_space = memory_space
    var.type = row[4]
    var.shape = shape
    return var


def _shape_of(ty: ir.Type) -> tuple[int, ...]:
    # Types read from values are concrete (VectorType, MemRefType): no cast needed.
    shape = getattr(ty, "shape", None)
    return tuple(ir.ShapedType(ty).shape if shape is None else shape)


class Unsupported:
    """The value of a derived expression that has no layout (e.g. a reduction
    of a layout Mosaic GPU cannot reduce). A constraint over it cannot hold."""

    _instance: ClassVar[Unsupported | None] = None

    def __new__(cls) -> Unsupported:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSUPPORTED"


UNSUPPORTED: Final = Unsupported()
ValueOf = Callable[[Variable], Constant | None]


class _Statement(Fields):
    """The built-in expressions and constraints: value objects whose fields
    are their ``__slots__`` (see :mod:`smalti.records`). Nothing changes a
    statement once made, nor hashes one.

    Plain classes rather than dataclasses, as :class:`Variable` is: rules
    state them by the thousand per kernel (a constructor that only stores
    its fields, no ``__dict__``), and every process that builds a pipeline
    imports them. A plugin's own constraints may well be dataclasses.
    """

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]  # compared by value: unhashable


class Derived:
    """Base of expressions that derive a layout from another expression."""

    __slots__ = ()  # subclasses may have none: then theirs have a __dict__

    expression: Any
    #: The derived layout is splat exactly when the operand's is (or it is
    #: unsupported). The solver then sees through an ``Equal`` between a
    #: variable and this expression when it works out which values can never
    #: be splat, and merges their uses instead of searching their layouts.
    keeps_splat: ClassVar[bool] = False

    def apply(self, value: Constant) -> Constant | Unsupported:
        raise NotImplementedError

    def preimages(self, result: Constant, variable: Variable) -> Iterator[Constant]:
        """Candidate values for ``variable`` (this expression's operand) that
        would make the expression evaluate to ``result``. Used by the search."""
        return iter(())

    def congruence_key(self) -> Hashable | None:
        """What, besides its operand, decides the derived layout: a hashable
        key such that two derivations with equal keys of one layout give one
        layout. The solver then merges the variables that are ``Equal`` to
        such derivations of one class (a row sum broadcast back at every step
        of a kernel is one class, solved once). ``None`` (the default) opts out."""
        return None


Expression = Any  # Variable | Constant | Derived


def evaluate(expr: Expression, value_of: ValueOf) -> Constant | Unsupported | None:
    """The value of ``expr`` under the current assignment, ``None`` if unknown."""
    if isinstance(expr, Variable):
        return value_of(expr)
    if isinstance(expr, layouts.CONSTANT_TYPES):
        return expr
    inner = evaluate(expr.expression, value_of)
    if inner is None or inner is UNSUPPORTED:
        return inner
    return expr.apply(inner)


def variables_of(expr: Expression) -> tuple[Variable, ...]:
    """The variable an expression depends on (at most one), as a tuple."""
    while isinstance(expr, Derived):
        expr = expr.expression
    return (expr,) if isinstance(expr, Variable) else ()


def describe(expr: Expression) -> str:
    if isinstance(expr, Variable):
        return expr.site.describe()
    return str(expr)


def _reduce_shape(shape: Sequence[int], axes: Sequence[int], keep_dims: bool) -> tuple[int, ...]:
    if keep_dims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _ascending_axes(axes: Sequence[int]) -> tuple[int, ...]:
    """``axes`` as a tuple, if they are sorted, distinct and non-negative."""
    return _checked_axes(axes if type(axes) is tuple else tuple(axes))


@functools.lru_cache(maxsize=256)  # a kernel reduces along a few sets of axes
def _checked_axes(axes: tuple[int, ...]) -> tuple[int, ...]:
    if not (axes and list(axes) == sorted(set(axes)) and axes[0] >= 0):
        raise ValueError(f"axes must be sorted, distinct and non-negative, got {axes}")
    return axes


#: The tiled layouts tried for the source of a reduction, in this order
#: (the order decides which solution the search finds first).
_REDUCIBLE_TILED_LAYOUTS: Final = (
    fa.WGMMA_LAYOUT, fa.WGMMA_TRANSPOSED_LAYOUT, fa.TCGEN05_LAYOUT,
    fa.TCGEN05_TRANSPOSED_LAYOUT, tcgen05.TMEM_NATIVE_LAYOUT,
)


def _reduction_sources(small: fa.TiledLayout, shape: tuple[int, ...]
                       ) -> tuple[fa.TiledLayout, ...]:
    """Candidate layouts of a ``shape`` value that reduces to ``small``: the
    common tiled layouts, the collective M=64 one where its columns fit, and
    ``small`` itself last (reducing only untiled dims keeps the layout:
    always valid then, and tried first it would lengthen backtracking)."""
    columns = shape[-1]
    m64 = (tcgen05.fa_m64_collective_layout(columns),) if columns % 16 == 0 else ()
    return (*_REDUCIBLE_TILED_LAYOUTS, *m64, small)


class Reduced(_Statement, Derived):
    """The layout of ``expression`` after reducing ``axes`` of a rank-``rank`` value."""

    __slots__ = ("expression", "axes", "rank", "keep_dims")
    keeps_splat: ClassVar[bool] = True

    expression: Expression
    axes: tuple[int, ...]
    rank: int
    keep_dims: bool

    def __init__(self, expression: Expression, axes: Sequence[int], rank: int,
                 keep_dims: bool = False) -> None:
        self.expression = expression
        self.axes = _ascending_axes(axes)
        self.rank = rank
        self.keep_dims = keep_dims

    def _tiled_axes(self, layout: fa.TiledLayout) -> tuple[int, ...]:
        return _tiled_axes(self.axes, self.rank, layout)

    def apply(self, value: Constant) -> Constant | Unsupported:
        return _reduced(value, self.axes, self.rank, self.keep_dims)

    def congruence_key(self) -> Hashable:
        return (Reduced, self.axes, self.rank, self.keep_dims)

    def preimages(self, result: Constant, variable: Variable) -> Iterator[Constant]:
        if not isinstance(result, RegisterLayout) or self.expression is not variable:
            return
        shape = variable.shape
        small = result.layout
        if isinstance(small, (fa.WGSplatFragLayout, fa.WGStridedFragLayout)):
            # Splat and strided layouts reduce to themselves, at the smaller shape.
            yield RegisterLayout(dataclasses.replace(small, shape=shape))
            return
        candidates = _reduction_sources(small, shape)
        if self.keep_dims:
            # Beyond jax (which cannot reduce tiled layouts with keep_dims).
            for large in candidates:
                if len(large.base_tile_shape) <= len(shape):
                    if self.apply(RegisterLayout(large)) == result:
                        yield RegisterLayout(large)
            return
        for large in candidates:
            if len(large.base_tile_shape) > len(shape):
                continue
            if reduce_tiled(large, self._tiled_axes(large)) == small:
                yield RegisterLayout(large)
        # Beyond jax: dropping size-1 dims from the tiling (e.g. (128, 1) -> (128,)).
        expanded = self._with_unit_dims(small, shape)
        if expanded is not None:
            yield RegisterLayout(expanded)

    def _with_unit_dims(self, small: fa.TiledLayout,
                        shape: tuple[int, ...]) -> fa.TiledLayout | None:
        """``small`` with the reduced dims put back into its tiling as size-1
        dims, when they all have size 1 in ``shape`` and fall in the tiled part."""
        if any(shape[a] != 1 for a in self.axes):
            return None
        kept = [i for i in range(len(shape)) if i not in self.axes]
        tile_rank = len(small.base_tile_shape)
        if tile_rank > len(kept):
            return None
        tiled = kept[len(kept) - tile_rank:]
        inserted = tuple(a - tiled[0] for a in self.axes if a > tiled[0])
        if not inserted:
            return None  # only untiled dims are dropped: `small` itself fits
        try:
            return layouts.insert_unit_dims(small, inserted)
        except ValueError:
            return None

    def __str__(self) -> str:
        return f"reduce({describe(self.expression)}, axes={self.axes})"


def _tiled_axes(axes: tuple[int, ...], rank: int, layout: fa.TiledLayout) -> tuple[int, ...]:
    untiled = rank - len(layout.base_tile_shape)
    return tuple(a - untiled for a in axes if a >= untiled)


# Memoized: the solver reduces the same few layouts over and over.
@functools.lru_cache(maxsize=1024)
def _reduced(value: Constant, axes: tuple[int, ...], rank: int,
             keep_dims: bool) -> Constant | Unsupported:
    """The layout of a rank-``rank`` value in layout ``value`` after reducing ``axes``."""
    if not isinstance(value, RegisterLayout):
        return UNSUPPORTED
    layout = value.layout
    match layout:
        case fa.WGSplatFragLayout():
            return RegisterLayout(
                fa.WGSplatFragLayout(_reduce_shape(layout.shape, axes, keep_dims)))
        case fa.WGStridedFragLayout():
            trailing = math.prod(layout.shape[axes[-1] + 1 :])
            if trailing % (layout.vec_size * fa.WARPGROUP_SIZE):
                return UNSUPPORTED  # would need cross-lane traffic
            shape = _reduce_shape(layout.shape, axes, keep_dims)
            return RegisterLayout(fa.WGStridedFragLayout(shape, layout.vec_size))
        case fa.TiledLayout():
            tiled_axes = _tiled_axes(axes, rank, layout)
            if not tiled_axes:
                return value
            if keep_dims:
                return _keep_reduced(layout, tiled_axes)
            return RegisterLayout(reduce_tiled(layout, tiled_axes))
    return UNSUPPORTED


@functools.lru_cache(maxsize=1024)
def reduce_tiled(layout: fa.TiledLayout, axes: tuple[int, ...]) -> fa.TiledLayout:
    """``layout.reduce(axes)``, memoized: it is costly and kernels reduce the
    same few layouts along the same axes over and over."""
    return layout.reduce(axes)


def _keep_reduced(layout: fa.TiledLayout, axes: tuple[int, ...]) -> Constant | Unsupported:
    """A tiled layout reduced along tiled ``axes`` with the dims kept as size 1
    (beyond jax, which leaves such reductions unsolved)."""
    if len(axes) == len(layout.base_tile_shape):
        return UNSUPPORTED  # nothing tiled would remain
    try:
        return RegisterLayout(layouts.insert_unit_dims(reduce_tiled(layout, axes), axes))
    except ValueError:
        return UNSUPPORTED


class Reshaped(_Statement, Derived):
    """The layout of ``expression`` after reshaping ``source_shape`` to ``target_shape``."""

    __slots__ = ("expression", "source_shape", "target_shape")
    keeps_splat: ClassVar[bool] = True

    expression: Expression
    source_shape: tuple[int, ...]
    target_shape: tuple[int, ...]

    def __init__(self, expression: Expression, source_shape: Sequence[int],
                 target_shape: Sequence[int]) -> None:
        self.expression = expression
        self.source_shape = tuple(source_shape)
        self.target_shape = tuple(target_shape)

    def congruence_key(self) -> Hashable:
        return (Reshaped, self.source_shape, self.target_shape)

    def apply(self, value: Constant) -> Constant | Unsupported:
        if not isinstance(value, RegisterLayout):
            return UNSUPPORTED
        layout = value.layout
        match layout:
            case fa.WGSplatFragLayout():
                return RegisterLayout(fa.WGSplatFragLayout(self.target_shape))
            case fa.WGStridedFragLayout():
                return RegisterLayout(fa.WGStridedFragLayout(self.target_shape, layout.vec_size))
            case fa.TiledLayout():
                if self._keeps_tiles(layout):
                    return RegisterLayout(layout)
                return self._unit_dims_changed(layout)
        return UNSUPPORTED

    def _unit_dims_changed(self, layout: fa.TiledLayout) -> Constant | Unsupported:
        """Beyond jax: a reshape that only adds or drops size-1 dims. Those in
        the tiled part of either shape go in or out of the tiling; leading
        ones stay untiled."""
        src, dst = self.source_shape, self.target_shape
        if [d for d in src if d != 1] != [d for d in dst if d != 1]:
            return UNSUPPORTED
        tile_rank = len(layout.base_tile_shape)
        if len(src) < tile_rank:
            return UNSUPPORTED
        lead = len(src) - tile_rank
        drop = tuple(i - lead for i in range(lead, len(src)) if src[i] == 1)
        if len(drop) == tile_rank:
            return UNSUPPORTED  # no tiled dim would remain
        try:
            squeezed = layouts.remove_unit_dims(layout, drop)
        except ValueError:
            return UNSUPPORTED
        # The tiled part of the target starts at its first non-unit dim
        # that comes from the tiled part of the source.
        first = next(i for i in range(lead, len(src)) if src[i] != 1)
        rank_in_target = sum(1 for d in src[:first] if d != 1)
        nonunit_dst = [i for i, d in enumerate(dst) if d != 1]
        start = nonunit_dst[rank_in_target]
        insert = tuple(i - start for i in range(start, len(dst)) if dst[i] == 1)
        try:
            expanded = layouts.insert_unit_dims(squeezed, insert)
        except ValueError:
            return UNSUPPORTED
        if not layouts.register_layout_fits(dst, expanded):
            return UNSUPPORTED
        return RegisterLayout(expanded)

    def _keeps_tiles(self, layout: fa.TiledLayout) -> bool:
        # A reshape is free when it only touches untiled dims and the major
        # tiled dim, and the major tiled dim stays a multiple of its tile.
        tile = layout.base_tile_shape
        src, dst = self.source_shape, self.target_shape
        if len(dst) < len(tile) or len(src) < len(tile):
            return False
        if any(s % t for s, t in zip(src[-len(tile) :], tile)):
            return False
        minor = len(tile) - 1
        # With a 1-D tile, only the identity is known to keep the layout.
        if (src[-minor:] != dst[-minor:]) if minor else (src != dst):
            return False
        return dst[-len(tile)] % tile[0] == 0

    def __str__(self) -> str:
        return f"reshape({describe(self.expression)}, {self.source_shape}->{self.target_shape})"


class Transposed(_Statement, Derived):
    """The SMEM transforms of ``expression`` seen through a dim ``permutation``."""

    __slots__ = ("expression", "permutation")

    expression: Expression
    permutation: tuple[int, ...]

    def __init__(self, expression: Expression, permutation: Sequence[int]) -> None:
        self.expression = expression
        self.permutation = permutation = tuple(permutation)
        if sorted(permutation) != list(range(len(permutation))):
            raise ValueError(f"not a permutation: {permutation}")

    def congruence_key(self) -> Hashable:
        return (Transposed, self.permutation)

    def apply(self, value: Constant) -> Constant | Unsupported:
        if not isinstance(value, SmemTransforms):
            return UNSUPPORTED
        if value.tiling is None:
            return value
        tiling, perm = value.tiling, self.permutation
        offset = len(perm) - len(tiling)
        moved = perm[-len(tiling) :]
        if any(d < offset for d in moved):
            return UNSUPPORTED  # tiled and untiled dims would be swapped
        return SmemTransforms(tuple(tiling[d - offset] for d in moved), value.swizzle)

    def __str__(self) -> str:
        return f"transpose({describe(self.expression)}, {self.permutation})"


class Collapsed(_Statement, Derived):
    """The SMEM transforms of ``expression`` after collapsing groups of dims.

    ``reassociation[i]`` is the number of consecutive source dims that form
    target dim ``i``.
    """

    __slots__ = ("expression", "source_shape", "reassociation")

    expression: Expression
    source_shape: tuple[int, ...]
    reassociation: tuple[int, ...]

    def __init__(self, expression: Expression, source_shape: Sequence[int],
                 reassociation: Sequence[int]) -> None:
        self.expression = expression
        self.source_shape = source_shape = tuple(source_shape)
        self.reassociation = reassociation = tuple(reassociation)
        if any(n <= 0 for n in reassociation) or sum(reassociation) != len(source_shape):
            raise ValueError(f"reassociation {reassociation} does not partition {source_shape}")

    def congruence_key(self) -> Hashable:
        return (Collapsed, self.source_shape, self.reassociation)

    def apply(self, value: Constant) -> Constant | Unsupported:
        if not isinstance(value, SmemTransforms):
            return UNSUPPORTED
        if value.tiling is None:
            return value
        tiling = list(value.tiling)
        shape = list(self.source_shape[-len(tiling) :])
        if any(s % t for s, t in zip(shape, tiling)):
            return UNSUPPORTED
        new_tiling: list[int] = []
        # Walk the groups from the minor end; every tiled dim must fall in a
        # group made only of tiled dims, tiled as (1*, any?, full*).
        for size in reversed(self.reassociation):
            if not tiling:
                break
            if len(tiling) < size:
                return UNSUPPORTED
            group_tiles, group_dims = tiling[-size:], shape[-size:]
            del tiling[-size:], shape[-size:]
            full = 0
            for t, s in zip(reversed(group_tiles), reversed(group_dims)):
                if t != s:
                    break
                full += 1
            rest = group_tiles[: size - full]
            if rest and any(t != 1 for t in rest[:-1]):
                return UNSUPPORTED
            new_tiling.append(math.prod(group_tiles))
        return SmemTransforms(tuple(reversed(new_tiling)), value.swizzle)

    def __str__(self) -> str:
        return f"collapse({describe(self.expression)}, {self.reassociation})"


# --- constraints -------------------------------------------------------------------


class SearchContext:
    """What :meth:`Constraint.candidates` may consult."""

    def __init__(
        self,
        arch: tuple[int, int],
        value_of: ValueOf,
        divides_for: Callable[[Variable], tuple[int, ...] | None],
    ) -> None:
        self.arch = arch
        self.value_of = value_of
        self.divides_for = divides_for


class Constraint:
    """Base class of constraints. Subclass it to add a new kind of constraint.

    A subclass lists its operand expressions in :meth:`expressions`, decides
    whether it holds once they are all known in :meth:`check`, and may offer
    the solver values to try in :meth:`candidates` and values that must hold
    in :meth:`implied`.
    """

    __slots__ = ()  # subclasses may have none: then theirs have a __dict__

    #: Constraints with a lower priority offer their candidates first.
    search_priority: ClassVar[int] = 1
    #: Whether the constraint holds once the solver made the assignments
    #: :meth:`implied` returned (then it is not examined again for them).
    holds_once_implied: ClassVar[bool] = False

    def expressions(self) -> tuple[Expression, ...]:
        raise NotImplementedError

    def restatement_key(self) -> tuple[tuple[Variable, ...], Hashable] | None:
        """The variables the constraint is between and a key such that it is
        equal to any other constraint with an equal key between variables of
        the same classes: the solver keeps one of them (a pipeline of MMAs on
        a few refs states one ``OneOf`` per MMA about one class). The key
        should compare cheaply (by identity, or small tuples of ints).
        ``None`` (the default) keeps every statement."""
        return None

    def check(self, values: tuple[Constant, ...]) -> bool:
        """Whether the constraint holds for these values of :meth:`expressions`."""
        raise NotImplementedError

    def implied(self, value_of: ValueOf) -> Iterator[tuple[Variable, Constant]]:
        """Assignments that must hold given what is known. Defaults to none."""
        return iter(())

    def candidates(self, ctx: SearchContext) -> Iterator[tuple[Variable, Constant]]:
        """Assignments worth trying, best first. Defaults to none."""
        return iter(())

    def describe(self) -> str:
        return str(self)


def _one_variable_one_constant(
    a: Expression, b: Expression, value_of: ValueOf
) -> tuple[Variable, Constant] | None:
    """If one side is an unknown variable and the other known, returns them."""
    for var_side, other in ((a, b), (b, a)):
        if isinstance(var_side, Variable) and value_of(var_side) is None:
            value = evaluate(other, value_of)
            if value is not None and not isinstance(value, Unsupported):
                return var_side, value
    return None


class Equal(_Statement, Constraint):
    """``lhs`` and ``rhs`` have the same layout."""

    __slots__ = ("lhs", "rhs")
    holds_once_implied: ClassVar[bool] = True  # one side was given the other's value

    lhs: Expression
    rhs: Expression

    def __init__(self, lhs: Expression, rhs: Expression) -> None:
        self.lhs = lhs
        self.rhs = rhs

    def expressions(self) -> tuple[Expression, ...]:
        return (self.lhs, self.rhs)

    def check(self, values: tuple[Constant, ...]) -> bool:
        return values[0] == values[1]

    def implied(self, value_of: ValueOf) -> Iterator[tuple[Variable, Constant]]:
        found = _one_variable_one_constant(self.lhs, self.rhs, value_of)
        if found is not None:
            yield found

    def candidates(self, ctx: SearchContext) -> Iterator[tuple[Variable, Constant]]:
        # `result == derived(var)`: try the values of var that produce result.
        for derived, other in ((self.lhs, self.rhs), (self.rhs, self.lhs)):
            if isinstance(derived, Derived) and isinstance(derived.expression, Variable):
                known = evaluate(other, ctx.value_of)
                if known is not None and not isinstance(known, Unsupported):
                    for value in derived.preimages(known, derived.expression):
                        yield derived.expression, value

    def __str__(self) -> str:
        return f"{describe(self.lhs)} == {describe(self.rhs)}"


class Relayout(_Statement, Constraint):
    """Registers in layout ``source`` can be converted to layout ``target``.

    A ``strict`` relayout is the implicit one between a producer and its
    consumers: only splat values may change layout there. A non-strict one
    (an explicit layout cast) also allows the tiled conversions Mosaic GPU
    implements for values of ``bitwidth``-bit elements.
    """

    __slots__ = ("source", "target", "bitwidth", "strict")
    search_priority: ClassVar[int] = 0

    source: Expression
    target: Expression
    bitwidth: int
    strict: bool

    def __init__(self, source: Expression, target: Expression, bitwidth: int,
                 strict: bool = False) -> None:
        self.source = source
        self.target = target
        self.bitwidth = bitwidth
        self.strict = strict

    def expressions(self) -> tuple[Expression, ...]:
        return (self.source, self.target)

    def check(self, values: tuple[Constant, ...]) -> bool:
        src, dst = values
        if not isinstance(src, RegisterLayout) or not isinstance(dst, RegisterLayout):
            return src == dst
        return _can_relayout(src, dst, self.bitwidth, self.strict)

    def implied(self, value_of: ValueOf) -> Iterator[tuple[Variable, Constant]]:
        # A strict relayout out of a non-splat layout is the identity.
        if self.strict and isinstance(self.target, Variable) and value_of(self.target) is None:
            src = evaluate(self.source, value_of)
            if isinstance(src, RegisterLayout) and not src.is_splat:
                yield self.target, src

    def candidates(self, ctx: SearchContext) -> Iterator[tuple[Variable, Constant]]:
        found = _one_variable_one_constant(self.source, self.target, ctx.value_of)
        if found is not None:
            yield found

    def __str__(self) -> str:
        arrow = "->" if self.strict else "=>"
        return f"{describe(self.source)} {arrow} {describe(self.target)}"


@functools.lru_cache(maxsize=1024)  # keyed by constants, which hash once
def _can_relayout(src: RegisterLayout, dst: RegisterLayout, bitwidth: int, strict: bool) -> bool:
    return layouts.can_relayout(src.layout, dst.layout, bitwidth=bitwidth, strict=strict)


class Excludes(_Statement, Constraint):
    """``expr`` is not a register layout of class ``kind`` (e.g. not splat)."""

    __slots__ = ("expr", "kind")

    expr: Expression
    kind: type

    def __init__(self, expr: Expression, kind: type) -> None:
        self.expr = expr
        self.kind = kind

    def expressions(self) -> tuple[Expression, ...]:
        return (self.expr,)

    def check(self, values: tuple[Constant, ...]) -> bool:
        (value,) = values
        return not (isinstance(value, RegisterLayout) and isinstance(value.layout, self.kind))

    def restatement_key(self) -> tuple[tuple[Variable, ...], Hashable] | None:
        return ((self.expr,), (Excludes, self.kind)) if type(self.expr) is Variable else None

    def __str__(self) -> str:
        return f"{describe(self.expr)} is not {self.kind.__name__}"


class OneOf(_Statement, Constraint):
    """``expr`` is one of ``allowed`` (tried in order, repeats dropped)."""

    __slots__ = ("expr", "allowed")

    expr: Expression
    allowed: tuple[Constant, ...]

    def __init__(self, expr: Expression, allowed: Sequence[Constant]) -> None:
        self.expr = expr
        self.allowed = _distinct(allowed)
        if not self.allowed:
            raise ValueError("OneOf needs at least one allowed value")

    def expressions(self) -> tuple[Expression, ...]:
        return (self.expr,)

    def check(self, values: tuple[Constant, ...]) -> bool:
        return values[0] in self.allowed

    def restatement_key(self) -> tuple[tuple[Variable, ...], Hashable] | None:
        # Rules hand out cached tuples (OneOf keeps one distinct tuple per tuple).
        return ((self.expr,), (OneOf, id(self.allowed))) if type(self.expr) is Variable else None

    def implied(self, value_of: ValueOf) -> Iterator[tuple[Variable, Constant]]:
        if len(self.allowed) == 1 and isinstance(self.expr, Variable):
            if value_of(self.expr) is None:
                yield self.expr, self.allowed[0]

    def candidates(self, ctx: SearchContext) -> Iterator[tuple[Variable, Constant]]:
        if isinstance(self.expr, Variable):
            for value in self.allowed:
                yield self.expr, value

    def __str__(self) -> str:
        return f"{describe(self.expr)} in {{{', '.join(map(str, self.allowed))}}}"


#: id(tuple) -> (the tuple, its distinct values): rules hand the same cached
#: tuple of allowed values to many ops, and hashing its constants again for
#: each costs more than the rest of the constraint. Holding the tuple keeps
#: its id from being reused.
_distinct_tuples: dict[int, tuple[tuple[Constant, ...], tuple[Constant, ...]]] = {}


def _distinct(values: Sequence[Constant]) -> tuple[Constant, ...]:
    """``values`` without repeats, in order."""
    if type(values) is tuple:
        known = _distinct_tuples.get(id(values))
        if known is not None and known[0] is values:
            return known[1]
        if len(_distinct_tuples) >= 256:
            _distinct_tuples.clear()
        distinct = tuple(dict.fromkeys(values))
        _distinct_tuples[id(values)] = (values, distinct)
        return distinct
    return tuple(dict.fromkeys(values))


def _tiling_of(value: Constant) -> tuple[int, ...] | None:
    match value:
        case SmemTransforms(tiling=tiling):
            return tiling
        case RegisterLayout(layout=fa.TiledLayout() as layout):
            return tuple(layout.base_tile_shape)
        case TmemLayout(layout=layout):
            return tuple(layout.base_tile_shape)
    return None


class Divides(_Statement, Constraint):
    """Each tiled dim of ``expr`` divides the matching trailing entry of ``multiple``.

    A tiling of higher rank than ``multiple`` does not hold; untiled values
    (no SMEM tiling, splat or strided registers) always do.
    """

    __slots__ = ("expr", "multiple")

    expr: Expression
    multiple: tuple[int, ...]

    def __init__(self, expr: Expression, multiple: Sequence[int]) -> None:
        self.expr = expr
        self.multiple = tuple(multiple)

    def expressions(self) -> tuple[Expression, ...]:
        return (self.expr,)

    def check(self, values: tuple[Constant, ...]) -> bool:
        tiling = _tiling_of(values[0])
        if tiling is None:
            return True
        if len(tiling) > len(self.multiple):
            return False
        return all(m % t == 0 for t, m in zip(reversed(tiling), reversed(self.multiple)))

    def __str__(self) -> str:
        return f"tiling of {describe(self.expr)} divides {self.multiple}"


def merge_multiples(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The multiple equivalent to two :class:`Divides` on the same expression."""
    n = min(len(a), len(b))
    if n == 0:
        return ()
    return tuple(math.gcd(x, y) for x, y in zip(a[-n:], b[-n:]))


class MinorDimDivisibleBy(_Statement, Constraint):
    """The minor tile dim of SMEM transforms ``expr`` is a multiple of ``divisor``."""

    __slots__ = ("expr", "divisor")

    expr: Expression
    divisor: int

    def __init__(self, expr: Expression, divisor: int) -> None:
        self.expr = expr
        self.divisor = divisor

    def expressions(self) -> tuple[Expression, ...]:
        return (self.expr,)

    def check(self, values: tuple[Constant, ...]) -> bool:
        (value,) = values
        if not isinstance(value, SmemTransforms):
            return False
        return value.tiling is None or value.tiling[-1] % self.divisor == 0

    def __str__(self) -> str:
        return f"minor tile dim of {describe(self.expr)} divisible by {self.divisor}"


class SupportedBroadcast(_Statement, Constraint):
    """Registers in ``source`` can be broadcast along ``dims`` into ``target``.

    Pair it with ``Equal(source, Reduced(target, ...))`` to pin tiled layouts:
    this constraint only checks the layouts are of the same kind.
    """

    __slots__ = ("source", "target", "dims")

    source: Expression
    target: Expression
    dims: tuple[int, ...]

    def __init__(self, source: Expression, target: Expression, dims: Sequence[int]) -> None:
        self.source = source
        self.target = target
        self.dims = tuple(dims)

    def expressions(self) -> tuple[Expression, ...]:
        return (self.source, self.target)

    def check(self, values: tuple[Constant, ...]) -> bool:
        src, dst = values
        if not isinstance(src, RegisterLayout) or not isinstance(dst, RegisterLayout):
            return False
        if isinstance(src.layout, fa.WGStridedFragLayout) and isinstance(
            dst.layout, fa.WGStridedFragLayout
        ):
            return fa.is_supported_strided_layout_broadcast(src.layout, dst.layout, self.dims)
        return type(src.layout) is type(dst.layout)

    def restatement_key(self) -> tuple[tuple[Variable, ...], Hashable] | None:
        if type(self.source) is Variable and type(self.target) is Variable:
            return (self.source, self.target), (SupportedBroadcast, self.dims)
        return None

    def candidates(self, ctx: SearchContext) -> Iterator[tuple[Variable, Constant]]:
        src = evaluate(self.source, ctx.value_of)
        if not isinstance(src, RegisterLayout) or not isinstance(self.target, Variable):
            return
        shape = self.target.shape
        match src.layout:
            case fa.WGSplatFragLayout():
                yield self.target, RegisterLayout(fa.WGSplatFragLayout(shape))
            case fa.WGStridedFragLayout(vec_size=vec):
                dst = fa.WGStridedFragLayout(shape, vec)
                if fa.is_supported_strided_layout_broadcast(src.layout, dst, self.dims):
                    yield self.target, RegisterLayout(dst)

    def __str__(self) -> str:
        return f"{describe(self.source)} broadcasts along {self.dims} into {describe(self.target)}"


class TransferableTmem(_Statement, Constraint):
    """A TMEM ref in ``tmem`` and registers in ``registers`` can be copied
    between each other (``tcgen05.ld`` / ``tcgen05.st``) for a ``shape`` value
    of ``bitwidth``-bit elements."""

    __slots__ = ("registers", "tmem", "shape", "bitwidth")

    registers: Expression
    tmem: Expression
    shape: tuple[int, ...]
    bitwidth: int

    def __init__(self, registers: Expression, tmem: Expression, shape: Sequence[int],
                 bitwidth: int) -> None:
        self.registers = registers
        self.tmem = tmem
        self.shape = tuple(shape)
        self.bitwidth = bitwidth

    def expressions(self) -> tuple[Expression, ...]:
        return (self.registers, self.tmem)

    def valid(self, tmem: tcgen05.TMEMLayout, reg: fa.FragmentedLayout) -> bool:
        if not isinstance(reg, fa.TiledLayout):
            return False
        packing, columns = tmem.vector_length, self.shape[1]
        default = tcgen05.tmem_default_layout(packing)
        if reg == fa.TCGEN05_LAYOUT and tmem == default:
            return True
        if reg == tmem.as_tiled_layout() and packing * self.bitwidth == 32:
            return True
        if reg == fa.TMEM_NATIVE_LAYOUT and tmem == default:
            if self.bitwidth == 32 or (self.bitwidth == 16 and packing == 1):
                return True
        if columns % 16 == 0:
            if packing <= columns // 2 and reg == fa.WGMMA_LAYOUT:
                if tmem == tcgen05.tmem_half_lane_layout(columns, packing):
                    return True
            if packing <= 8 and reg == tcgen05.fa_m64_collective_layout(columns):
                if tmem == tcgen05.tmem_m64_collective_layout(columns, packing):
                    return True
        return False

    def check(self, values: tuple[Constant, ...]) -> bool:
        reg, tmem = values
        if not isinstance(reg, RegisterLayout) or not isinstance(tmem, TmemLayout):
            return False
        return self.valid(tmem.layout, reg.layout)

    def candidates(self, ctx: SearchContext) -> Iterator[tuple[Variable, Constant]]:
        found = _one_variable_one_constant(self.registers, self.tmem, ctx.value_of)
        if found is None:
            return
        variable, known = found
        columns = self.shape[1]
        if isinstance(known, TmemLayout):
            regs = [fa.TCGEN05_LAYOUT, known.layout.as_tiled_layout(), fa.TMEM_NATIVE_LAYOUT]
            regs.append(fa.WGMMA_LAYOUT)
            if columns % 16 == 0:
                regs.append(tcgen05.fa_m64_collective_layout(columns))
            for reg in regs:
                if self.valid(known.layout, reg):
                    yield variable, RegisterLayout(reg)
            return
        if not isinstance(known, RegisterLayout) or not known.is_tiled:
            return
        # The densest packing for the element type first, then unpacked.
        for packing in dict.fromkeys([32 // self.bitwidth, 1]):
            for tmem in _tmem_layouts_of(columns, packing):
                if self.valid(tmem, known.layout):
                    yield variable, TmemLayout(tmem)

    def __str__(self) -> str:
        return f"{describe(self.registers)} <-> TMEM {describe(self.tmem)}"


def _tmem_layouts_of(columns: int, packing: int) -> Iterator[tcgen05.TMEMLayout]:
    """The TMEM layouts a ref of ``columns`` columns may have at ``packing``:
    the default one, then (for whole 16-column groups) the half-lane and the
    collective M=64 ones where the packing allows them."""
    yield tcgen05.tmem_default_layout(packing)
    if columns % 16:
        return
    if packing <= columns // 2:
        yield tcgen05.tmem_half_lane_layout(columns, packing)
    if packing <= 8:
        yield tcgen05.tmem_m64_collective_layout(columns, packing)


class TransferKind:
    """How an SMEM <-> registers transfer must perform."""

    OPTIMIZED: Final = "optimized"  # free of bank conflicts
    UNOPTIMIZED: Final = "unoptimized"
    # Optimized where possible; an untiled ref may fall back to unoptimized
    # (what Pallas does for stores it did not ask to optimize).
    DOWNGRADABLE: Final = "downgradable"


class TransferableSmem(_Statement, Constraint):
    """Registers in ``registers`` and an SMEM ref with transforms ``smem`` can
    be copied between each other for a ref of ``shape``/``strides`` holding
    ``bitwidth``-bit elements, with a transfer of kind ``kind``.

    ``tiled_candidates`` are the register layouts the search tries for the
    registers once the ref is known to be tiled, best first (which ones are
    best depends on the architecture: the rule stating the constraint knows).
    """

    __slots__ = ("registers", "smem", "shape", "strides", "bitwidth", "kind",
                 "tiled_candidates")

    registers: Expression
    smem: Expression
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    bitwidth: int
    kind: str
    tiled_candidates: tuple[fa.FragmentedLayout, ...]

    def __init__(self, registers: Expression, smem: Expression, shape: Sequence[int],
                 strides: Sequence[int], bitwidth: int, kind: str = TransferKind.OPTIMIZED,
                 tiled_candidates: Sequence[fa.FragmentedLayout] = ()) -> None:
        self.registers = registers
        self.smem = smem
        self.shape = tuple(shape)
        self.strides = tuple(strides)
        self.bitwidth = bitwidth
        self.kind = kind
        self.tiled_candidates = tuple(tiled_candidates)

    def expressions(self) -> tuple[Expression, ...]:
        return (self.registers, self.smem)

    def check(self, values: tuple[Constant, ...]) -> bool:
        reg, smem = values
        if not isinstance(reg, RegisterLayout) or not isinstance(smem, SmemTransforms):
            return False
        from smalti import transferable_smem  # a heavy probe: import lazily

        return transferable_smem.smem_transfer_supported(
            reg.layout,
            smem,
            shape=self.shape,
            strides=self.strides,
            bitwidth=self.bitwidth,
            kind=self.kind,
        )

    def candidates(self, ctx: SearchContext) -> Iterator[tuple[Variable, Constant]]:
        found = _one_variable_one_constant(self.registers, self.smem, ctx.value_of)
        if found is None:
            return
        variable, known = found
        from smalti import transferable_smem

        if isinstance(known, RegisterLayout):
            if known.is_tiled and len(variable.shape) >= 2:
                for transforms in transferable_smem.smem_transforms_candidates(
                    variable, ctx.divides_for(variable)
                ):
                    yield variable, transforms
            return
        if isinstance(known, SmemTransforms):
            if known.tiling is not None:
                for layout in self.tiled_candidates:
                    yield variable, RegisterLayout(layout)
                return
            # An untiled ref takes a strided value, if the shape has one.
            strided = fa.WGStridedFragLayout.from_shaped_type(variable.type)
            if strided is not None:
                yield variable, RegisterLayout(strided)

    def __str__(self) -> str:
        return f"{describe(self.registers)} <-> SMEM {describe(self.smem)} ({self.kind})"
