"""The layout solver: union-find, propagation by worklist, search per component.

Given the variables and constraints the rules produced, the solver

1. merges variables that must be equal (``Equal`` between two variables, and
   strict relayouts out of values that can never be splat) with union-find
   (:mod:`smalti.union_find`; the solver keeps each class's own data);
2. propagates known layouts along constraints with a worklist: each
   constraint is re-examined only when one of its variables gets a value;
3. splits what is still unknown into independent components and searches
   each on its own, trying candidates in the order the constraints suggest
   them (identity relayouts first, tiled layouts before splat and strided
   ones, defaults last), undoing assignments on failure through a trail.

Each step is linear in the size of the kernel except the search, which only
sees the genuinely ambiguous parts and is bounded per part.
"""

from __future__ import annotations

import operator
from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, TypeGuard, cast

from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti import layouts
from smalti.constraints import (
    UNSUPPORTED,
    Constraint,
    Derived,
    Divides,
    Equal,
    Excludes,
    Expression,
    Relayout,
    SearchContext,
    Variable,
    evaluate,
    merge_multiples,
    variables_of,
)
from smalti.diagnostics import format_location
from smalti.layouts import Constant, MemorySpace, RegisterLayout, SmemTransforms
from smalti.records import Fields
from smalti.union_find import UnionFind

_ID = operator.attrgetter("id")

#: Candidates tried per independent part of a kernel before giving up.
DEFAULT_SEARCH_BUDGET = 20_000


class Origin:
    """Where a constraint or assignment came from, for error messages.

    ``what`` may be the op a rule described (read as ``op at file:line``)
    or a function producing the text: origins are made for every rule that
    states something but read only when something fails. Hand-written
    rather than a dataclass for that reason.
    """

    __slots__ = ("what", "plugin", "rule")

    def __init__(self, what: str | ir.Operation | Callable[[], str],
                 plugin: str | None = None, rule: str | None = None) -> None:
        self.what = what  # e.g. "mosaic_gpu.layout_cast at kernel.py:12"
        self.plugin = plugin
        self.rule = rule

    def __str__(self) -> str:
        by = f" (rule {self.rule} of plugin {self.plugin})" if self.plugin else ""
        return f"{_where(self)}{by}"

    def __repr__(self) -> str:
        return f"Origin({str(self)!r})"


class ConstraintSystem(Fields):
    """Everything the rules stated about a kernel."""

    __slots__ = ("variables", "constraints", "origins", "assignments", "fallbacks", "shared",
                 "uses")

    def __init__(self, variables: list[Variable] | None = None,
                 constraints: list[Constraint] | None = None,
                 origins: list[Origin] | None = None,
                 assignments: list[tuple[Variable, Constant, Origin]] | None = None,
                 fallbacks: dict[Variable, list[Constant]] | None = None,
                 shared: dict[Any, Any] | None = None,
                 uses: list[tuple[Variable, Variable, ir.Type]] | None = None) -> None:
        self.variables = [] if variables is None else variables
        self.constraints = [] if constraints is None else constraints
        self.origins = [] if origins is None else origins
        self.assignments = [] if assignments is None else assignments
        self.fallbacks = {} if fallbacks is None else fallbacks
        #: Per-run storage for rules (see ConstraintBuilder.shared).
        self.shared = {} if shared is None else shared
        #: One link per use of a value (of the given type), from its
        #: producer's variable to its consumer's: a register value may be
        #: relaid out on the way (strictly: only splat values change layout),
        #: a ref keeps its layout. Kept apart from ``constraints`` because
        #: the solver merges most of them outright.
        self.uses = [] if uses is None else uses

    def require(self, constraint: Constraint, origin: Origin) -> None:
        self.constraints.append(constraint)
        self.origins.append(origin)

    def use(self, producer: Variable, consumer: Variable, value_type: ir.Type) -> None:
        """``consumer`` uses the value ``producer`` defines (see :attr:`uses`)."""
        self.uses.append((producer, consumer, value_type))


class UseOrigin:
    """The origin of the link between a value's producer and a consumer (a
    cheap stand-in for :class:`Origin`: there may be one per use)."""

    __slots__ = ("producer", "consumer")
    plugin = None
    rule = None

    def __init__(self, producer: Variable, consumer: Variable) -> None:
        self.producer, self.consumer = producer, consumer

    def __str__(self) -> str:
        return (f"the use of {self.producer.site.describe()} by "
                f"{self.consumer.site.describe()}")


class Conflict(Exception):
    """Raised inside the solver when the current assignment breaks a constraint."""

    def __init__(self, reason: str, constraint: int | None, roots: Sequence[int]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.constraint = constraint
        self.roots = list(roots)


class Unsolvable(Exception):
    """No assignment exists. ``lines`` explain the conflicting requirements."""

    def __init__(self, summary: str, lines: list[str], variables: list[Variable]) -> None:
        super().__init__(summary)
        self.summary = summary
        self.lines = lines
        self.variables = variables


class ConstraintFault(Exception):
    """A constraint's own code raised (a bug in the plugin that stated it)."""

    def __init__(self, constraint: Constraint, origin: Origin | UseOrigin,
                 error: Exception) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.constraint = constraint
        self.origin = origin
        self.error = error


class BudgetExhausted(Exception):
    def __init__(self, variables: list[Variable]) -> None:
        super().__init__("search budget exhausted")
        self.variables = variables


_STRUCTURAL = -1  # reason code: merged/forced before propagation


class Solver:
    def __init__(self, system: ConstraintSystem, arch: tuple[int, int],
                 budget: int = DEFAULT_SEARCH_BUDGET, fuel: int | None = None) -> None:
        self.system = system
        self.arch = arch
        #: tries the search may make in each component
        self.budget = budget
        #: layouts the whole solve may assign, jax's ``fuel``: each class given
        #: one by propagation before the search, and each try of the search
        #: (``None``: only ``budget`` bounds the search)
        self.fuel = fuel
        n = len(system.variables)
        self.variables = system.variables
        if list(map(_ID, self.variables)) != list(range(n)):  # map(): no frame per variable
            raise ValueError("variables must be numbered 0..n-1 in order")
        #: The classes of variables that must have one layout (their roots:
        #: the earliest variable of each, see smalti.union_find).
        self.classes = UnionFind(n)
        #: The root of a variable's class (the union-find's own, bound once).
        self.find = self.classes.find
        self.value: list[Constant | None] = [None] * n
        self.reason: list[object] = [None] * n
        #: per class, where it is known never to be splat (the origin proving it)
        self.nonsplat: list[object | None] = [None] * n
        self.trail: list[tuple[str, int]] = []
        self.constraints = list(system.constraints)
        self.origins: list[Origin | UseOrigin] = list(system.origins)
        self.active = [True] * len(self.constraints)
        self.watchers: defaultdict[int, list[int]] = defaultdict(list)
        #: Strict relayouts between two variables, watched at their source
        #: only until it is known to be splat (see _index): ci -> target class.
        self.splat_watched: dict[int, int] = {}
        self.queue: deque[int] = deque()
        self.queued = [False] * len(self.constraints)
        self._valid_cache: dict[tuple[int, Constant], bool] = {}
        #: class -> one variable of each kind it holds, for classes of several
        self.mixed: dict[int, dict[tuple[object, ...], Variable]] = {}

    # --- classes ----------------------------------------------------------------

    @property
    def parent(self) -> list[int]:
        """Each variable's parent in :attr:`classes` (a root is its own)."""
        return self.classes.parent

    def union(self, a: int, b: int) -> None:
        """Merges the classes of variables ``a`` and ``b``, and their data."""
        joined = self.classes.union(a, b)
        if joined is not None:
            self._join(*joined)

    def _join(self, ra: int, rb: int) -> None:
        """Merges the data of class ``rb`` into that of class ``ra``, which
        has just absorbed it."""
        nonsplat = self.nonsplat
        if nonsplat[ra] is None:
            nonsplat[ra] = nonsplat[rb]
        # Classes mixing kinds of values (shapes, SMEM types) remember one
        # variable of each kind, for valid(); most classes hold one kind.
        mixed, a, b = self.mixed, self.variables[ra], self.variables[rb]
        space = a.memory_space
        if space is b.memory_space and (
                a.shape == b.shape if space is not MemorySpace.SMEM else a.type == b.type) and (
                not mixed or (ra not in mixed and rb not in mixed)):
            # Two classes of one kind each, the same (a.fit_key == b.fit_key,
            # without tuples): nothing to remember.
            return
        a_kinds, b_kinds = mixed.get(ra), mixed.pop(rb, None)
        if b_kinds is None:  # b's class holds one kind: b's
            if a_kinds is not None:
                a_kinds.setdefault(b.fit_key, b)
            elif a.fit_key != b.fit_key:
                mixed[ra] = {a.fit_key: a, b.fit_key: b}
            return
        kinds = mixed[ra] = a_kinds or {a.fit_key: a}
        for kind, var in b_kinds.items():
            kinds.setdefault(kind, var)

    def value_of(self, var: Variable) -> Constant | None:
        return self.value[self.find(var.id)]

    # --- preprocessing ----------------------------------------------------------

    def _scan_constraints(self) -> tuple[list[int], dict[int, list[Variable]],
                                         list[tuple[int, Variable, Derived]]]:
        """One pass over the rules' statements: merges the variables an
        ``Equal`` between two variables joins, and marks the classes known
        never to be splat from the start (given a layout that is not splat,
        or excluded from splat). Returns the relayouts out of a variable, the
        register variables one of which is a splat-keeping expression of the
        other (by variable id, both ways), and the ``Equal`` constraints
        between a variable and a derived expression (each with its index,
        the variable and the expression)."""
        find, nonsplat, active = self.find, self.nonsplat, self.active
        for var, value, origin in self.system.assignments:
            if isinstance(value, RegisterLayout) and not value.is_splat:
                root = find(var.id)
                if nonsplat[root] is None:
                    nonsplat[root] = origin
        relayouts: list[int] = []
        splat_alike: dict[int, list[Variable]] = {}
        derived_equals: list[tuple[int, Variable, Derived]] = []
        for ci, c in enumerate(self.constraints):
            if isinstance(c, Equal):
                lhs, rhs = c.lhs, c.rhs
                # Variables are never subclassed: compared by type.
                if type(lhs) is Variable:
                    if type(rhs) is Variable:
                        self.union(lhs.id, rhs.id)
                        active[ci] = False
                        continue
                    var, expr = lhs, rhs
                elif type(rhs) is Variable:
                    var, expr = rhs, lhs
                else:
                    continue
                if not isinstance(expr, Derived):
                    continue
                derived_equals.append((ci, var, expr))
                other = _splat_alike(var, expr)
                if other is not None:
                    splat_alike.setdefault(var.id, []).append(other)
                    splat_alike.setdefault(other.id, []).append(var)
            elif isinstance(c, Excludes) and isinstance(c.expr, Variable) and issubclass(
                fa.WGSplatFragLayout, c.kind
            ):
                root = find(c.expr.id)
                if nonsplat[root] is None:
                    nonsplat[root] = self.origins[ci]
            elif isinstance(c, Relayout) and isinstance(c.source, Variable):
                relayouts.append(ci)
        return relayouts, splat_alike, derived_equals

    def _propagate_nonsplat(self, relayouts: list[int], splat_alike: dict[int, list[Variable]],
                            derived_equals: list[tuple[int, Variable, Derived]]) -> None:
        """Values that are never splat (see :meth:`_scan_constraints`) stay
        non-splat through relayouts, uses and equalities with splat-keeping
        expressions, and a strict relayout of a non-splat value is the
        identity: merge those. Uses of refs are merged outright (a ref keeps
        its layout). Variables equal to one derivation of one class are
        merged (see :meth:`_merge_congruent`). Register uses still open
        afterwards become strict relayouts."""
        find, roots, nonsplat = self.find, self.classes.roots, self.nonsplat
        # Most sources precede their targets: one pass in order settles
        # nearly every edge; a breadth-first walk settles the rest.
        open_relayouts = []
        for ci in relayouts:
            if nonsplat[find(self._relayout(ci).source.id)] is None:
                open_relayouts.append(ci)
            else:
                self._settle_relayout(ci)
        open_uses = []
        union, join, mixed, REG = self.classes.union, self._join, self.mixed, MemorySpace.REG
        for use in self.system.uses:
            producer, consumer, _ = use
            root = find(producer.id)
            if nonsplat[root] is None and consumer.memory_space is REG:
                # The producer may be a reduction of a value found non-splat
                # earlier in this pass.
                for other in splat_alike.get(producer.id, ()):
                    proof = nonsplat[find(other.id)]
                    if proof is not None:
                        nonsplat[root] = proof
                        break
                else:
                    open_uses.append(use)
                    continue
            # A ref keeps its layout; a non-splat value too.
            joined = union(root, consumer.id)
            if joined is None:
                continue
            if mixed:  # some class mixes kinds: _join() keeps the books
                join(*joined)
                continue
            # Otherwise _join()'s first step is all (most variables have a
            # use): both classes hold this value, so they hold one kind.
            kept, absorbed = joined
            if nonsplat[kept] is None:
                nonsplat[kept] = nonsplat[absorbed]
        successors: dict[int, list[Variable]] = {}
        for ci in open_relayouts:
            c = self._relayout(ci)
            if isinstance(c.target, Variable):
                successors.setdefault(find(c.source.id), []).append(c.target)
        # No union until the congruence merge: the roots of a list at once.
        for (_, consumer, _), root in zip(open_uses, roots(
                [producer.id for producer, _, _ in open_uses])):
            successors.setdefault(root, []).append(consumer)
        # A value equal to a splat-keeping expression of another (a reduction
        # of it) is never splat exactly when the other is not: both ways.
        # Only edges to values not known non-splat yet can tell anything.
        edges = [(var_id, other) for var_id, others in splat_alike.items() for other in others]
        for (var_id, other), root in zip(edges, roots([other.id for _, other in edges])):
            if nonsplat[root] is None:
                successors.setdefault(find(var_id), []).append(other)
        work = deque(r for r in successors if nonsplat[r] is not None)
        while work:
            root = work.popleft()
            for target in successors.get(root, ()):
                troot = find(target.id)
                if nonsplat[troot] is None:
                    nonsplat[troot] = nonsplat[root]
                    work.append(troot)
        # Once the uses are merged: a reduction's source is its producer's class.
        self._merge_congruent(derived_equals)
        for ci in open_relayouts:
            if nonsplat[find(self._relayout(ci).source.id)] is not None:
                self._settle_relayout(ci)
        self._link_open_uses(open_uses)

    def _merge_congruent(self, derived_equals: list[tuple[int, Variable, Derived]]) -> None:
        """Merges the variables that are ``Equal`` to one derivation (equal
        :meth:`~smalti.constraints.Derived.congruence_key`) of one class: they
        have one layout. The first such ``Equal`` stays; the others would
        only restate it. A kernel that sums rows and broadcasts them back at
        every step then has one class of row sums, and the uses of one splat
        accumulator by every step are one relayout."""
        find, active = self.find, self.active
        first_of: dict[tuple[Hashable, ...], int] = {}
        for ci, var, derived in derived_equals:
            key = _congruence_key(derived, find)
            if key is None:
                continue
            first = first_of.setdefault(key, var.id)
            if first != var.id:
                self.union(first, var.id)
                active[ci] = False

    def _link_open_uses(self, open_uses: list[tuple[Variable, Variable, ir.Type]]) -> None:
        """Merges the uses out of values found non-splat since; makes the
        others strict relayouts, one per value and consumer class (a
        constant used by every op of a chain needs one, not one per use)."""
        find, nonsplat, active = self.find, self.nonsplat, self.active
        bitwidths: dict[ir.Type, int] = {}  # by element type
        linked: set[tuple[int, int]] = set()
        for producer, consumer, value_type in open_uses:
            producer_root = find(producer.id)
            if nonsplat[producer_root] is not None:
                self.union(producer.id, consumer.id)
                continue
            link = (producer_root, find(consumer.id))
            if link in linked:
                continue
            linked.add(link)
            element = cast(ir.ShapedType, value_type).element_type  # a vector's
            bitwidth = bitwidths.get(element)
            if bitwidth is None:
                bitwidth = bitwidths[element] = mgpu_utils.bitwidth(element)
            self.constraints.append(Relayout(producer, consumer, bitwidth, strict=True))
            self.origins.append(UseOrigin(producer, consumer))
            active.append(True)
            self.queued.append(False)

    def _relayout(self, ci: int) -> Relayout:
        """Constraint ``ci``, known to be a :class:`Relayout`."""
        return cast(Relayout, self.constraints[ci])

    def _settle_relayout(self, ci: int) -> None:
        """Relayout ``ci`` leaves a non-splat value: its target is non-splat
        too, and a strict relayout is the identity."""
        c = self._relayout(ci)
        if not isinstance(c.target, Variable):
            if c.strict:
                self.constraints[ci] = Equal(c.source, c.target)
        elif c.strict:
            self.union(c.source.id, c.target.id)
            self.active[ci] = False
        else:
            root = self.find(c.target.id)
            if self.nonsplat[root] is None:
                self.nonsplat[root] = self.nonsplat[self.find(c.source.id)]

    def _index(self) -> None:
        """Records the classes each constraint is over, and which active
        constraints watch each class. A constraint that restates an earlier
        one on the same classes (see :meth:`Constraint.restatement_key`) is
        dropped. Keeps the constraints still active, in order, as ``indexed``."""
        find = self.find
        self.cvars: list[tuple[int, ...]] = []
        watchers = self.watchers
        cvars, active = self.cvars, self.active
        stated: set[tuple[object, ...]] = set()
        remaining: list[int] = []
        for ci, c in enumerate(self.constraints):
            if not active[ci]:
                # Merged or settled before: never examined (nor restored by undo).
                cvars.append(())
                continue
            restated = c.restatement_key()
            if restated is not None:
                over, what = restated
                # A find() per variable: a statement is over one or two, for
                # which a call of roots() and dict.fromkeys() cost more.
                found: list[int] = []
                for v in over:
                    root = find(v.id)
                    if root not in found:
                        found.append(root)
                roots = tuple(found)
                cvars.append(roots)
                key = (roots, what)
                if key in stated:
                    active[ci] = False
                else:
                    stated.add(key)
                    remaining.append(ci)
                    for root in roots:
                        watchers[root].append(ci)
                continue
            if type(c) is Relayout and c.strict and type(c.source) is Variable and type(
                    c.target) is Variable:
                # The source decides: a non-splat source implies the target
                # (the identity); against a splat one the target is checked
                # once known. So the target is watched only once the source
                # is known splat, and a splat constant used by every step of
                # a kernel is examined once per use, not also before.
                source, target = find(c.source.id), find(c.target.id)
                cvars.append((source,) if source == target else (source, target))
                if source != target:
                    self.splat_watched[ci] = target
                watchers[source].append(ci)
                remaining.append(ci)
                continue
            found = []
            for e in c.expressions():
                for v in variables_of(e):
                    root = find(v.id)
                    if root not in found:
                        found.append(root)
            roots = tuple(found)
            cvars.append(roots)
            remaining.append(ci)
            for r in roots:
                watchers[r].append(ci)
        self.fallbacks: dict[int, list[Constant]] = {}
        for var, values in self.system.fallbacks.items():
            self.fallbacks.setdefault(find(var.id), []).extend(values)
        #: The only constraints that can be active from now on.
        self.indexed = remaining

    # --- assignment and propagation -------------------------------------------

    def valid(self, root: int, value: Constant) -> bool:
        key = (root, value)
        cached = self._valid_cache.get(key)
        if cached is None:
            kinds = self.mixed.get(root)
            if kinds is None:
                cached = _fits(self.variables[root], value)
            else:
                cached = all(_fits(v, value) for v in kinds.values())
            self._valid_cache[key] = cached
        return cached

    def assign(self, root: int, value: Constant, reason: object) -> None:
        current = self.value[root]
        if current is not None:
            # Rules hand out shared constants: most repeats are the same object.
            if current is not value and current != value:
                message = f"needs {value}, but is already {current}"
                if _is_origin(reason):  # only before the search: naming it costs nothing
                    message = (f"{reason[1]} requires {value}, but "
                               f"{self.variables[root].site.describe()} is already {current}")
                raise Conflict(message, _ci(reason), [root])
            return
        if not self.valid(root, value):
            raise Conflict(f"{value} does not fit {self.variables[root].site.describe()}",
                           _ci(reason), [root])
        if (self.nonsplat[root] is not None and isinstance(value, RegisterLayout)
                and value.is_splat):
            raise Conflict(f"cannot be splat, but {value} is required", _ci(reason), [root])
        self.value[root] = value
        self.reason[root] = reason
        self.trail.append(("v", root))
        for ci in self.watchers.get(root, ()):
            if self.active[ci] and not self.queued[ci]:
                self.queued[ci] = True
                self.queue.append(ci)

    def examine(self, ci: int) -> None:
        try:
            self._examine(ci)
        except (Conflict, ConstraintFault):
            raise
        except Exception as e:  # a plugin's Constraint subclass misbehaved
            raise ConstraintFault(self.constraints[ci], self.origins[ci], e) from e

    def _examine(self, ci: int) -> None:
        c = self.constraints[ci]
        find, value_of, known = self.find, self.value_of, self.value
        values: list[Any] = []  # Constants once complete
        complete = True
        for e in c.expressions():
            v = known[find(e.id)] if type(e) is Variable else evaluate(e, value_of)
            if v is None:
                complete = False
            elif v is UNSUPPORTED:
                raise Conflict("has no layout for the known operands", ci, self.cvars[ci])
            values.append(v)
        if complete:
            if not c.check(tuple(values)):
                shown = ", ".join(map(str, values))
                raise Conflict(f"does not hold for {shown}", ci, self.cvars[ci])
            self.active[ci] = False
            self.trail.append(("c", ci))
            return
        if ci in self.splat_watched and values[0] is not None:
            # The source is known (splat, or the target would be implied).
            self._watch_target(ci)
        implied = False
        for var, value in c.implied(self.value_of):
            self.assign(self.find(var.id), value, ("c", ci))
            implied = True
        if implied and c.holds_once_implied:
            self.active[ci] = False
            self.trail.append(("c", ci))

    def _watch_target(self, ci: int) -> None:
        """From now on strict relayout ``ci`` is also examined when its
        target gets a layout (see :meth:`_index`)."""
        self.watchers[self.splat_watched.pop(ci)].append(ci)

    def propagate(self) -> None:
        try:
            while self.queue:
                ci = self.queue.popleft()
                self.queued[ci] = False
                if self.active[ci]:
                    self.examine(ci)
        except Conflict:
            for ci in self.queue:
                self.queued[ci] = False
            self.queue.clear()
            raise

    def undo(self, mark: int) -> None:
        while len(self.trail) > mark:
            kind, i = self.trail.pop()
            if kind == "v":
                self.value[i] = None
                self.reason[i] = None
            else:
                self.active[i] = True

    # --- search -----------------------------------------------------------------

    def _divides_for(self, var: Variable) -> tuple[int, ...] | None:
        root = self.find(var.id)
        merged = None
        for ci in self.watchers.get(root, ()):
            c = self.constraints[ci]
            if self.active[ci] and isinstance(c, Divides) and isinstance(c.expr, Variable):
                merged = c.multiple if merged is None else merge_multiples(merged, c.multiple)
        return merged

    def _candidates(self, roots: list[int],
                    constraints: list[int]) -> Iterator[tuple[int, Constant]]:
        ctx = SearchContext(self.arch, self.value_of, self._divides_for)
        deferred: list[tuple[int, Constant]] = []
        for ci in constraints:
            if not self.active[ci]:
                continue
            for var, value in self._offered(ci, ctx):
                root = self.find(var.id)
                if self.value[root] is not None:
                    continue
                if isinstance(value, RegisterLayout) and not value.is_tiled:
                    deferred.append((root, value))
                else:
                    yield root, value
        yield from deferred
        for root in roots:
            if self.value[root] is not None:
                continue
            for value in self._defaults(root):
                yield root, value

    def _offered(self, ci: int, ctx: SearchContext) -> list[tuple[Variable, Constant]]:
        try:
            return list(self.constraints[ci].candidates(ctx))
        except Exception as e:  # a plugin's Constraint subclass misbehaved
            raise ConstraintFault(self.constraints[ci], self.origins[ci], e) from e

    def _defaults(self, root: int) -> Iterator[Constant]:
        yield from self.fallbacks.get(root, ())
        var = self.variables[root]
        if var.memory_space is MemorySpace.REG:
            strided = fa.WGStridedFragLayout.from_shaped_type(var.type)
            if strided is not None:
                yield RegisterLayout(strided)
        elif var.memory_space is MemorySpace.SMEM:
            yield SmemTransforms(None, None)

    def _components(self) -> list[tuple[list[int], list[int]]]:
        parent, value = self.parent, self.value
        unknown = [r for r in range(len(self.variables)) if parent[r] == r and value[r] is None]
        if not unknown:  # propagation decided everything (most kernels)
            return []
        comp = {r: r for r in unknown}

        def cfind(r: int) -> int:
            while comp[r] != r:
                comp[r] = comp[comp[r]]
                r = comp[r]
            return r

        cvars, active = self.cvars, self.active
        for ci in self.indexed:
            if not active[ci]:
                continue
            open_roots = [r for r in self.classes.roots(cvars[ci]) if self.value[r] is None]
            for other in open_roots[1:]:
                a, b = cfind(open_roots[0]), cfind(other)
                if a != b:
                    comp[max(a, b)] = min(a, b)
        groups: dict[int, tuple[list[int], list[int]]] = {}
        for r in unknown:
            groups.setdefault(cfind(r), ([], []))[0].append(r)
        for ci in self.indexed:
            if not active[ci]:
                continue
            for r in cvars[ci]:
                r = self.find(r)
                if self.value[r] is None:
                    groups[cfind(r)][1].append(ci)
                    break
        ordered = []
        for key in sorted(groups):
            roots, cis = groups[key]
            cis.sort(key=lambda ci: (self.constraints[ci].search_priority, ci))
            ordered.append((roots, cis))
        return ordered

    def _search(self, roots: list[int], constraints: list[int]) -> None:
        """Depth-first search over the candidates of one component.

        Propagation reaches the same fixpoint whatever order decisions are
        made in, so a set of decisions whose subtree failed once fails again:
        it is remembered and skipped (the search would otherwise retry every
        ordering of the same dead end). Skipping dead ends does not change
        which solution is found first.
        """
        budget = self.budget if self.fuel is None else min(self.budget, self.fuel)
        start = budget
        conflicts: list[Conflict] = []
        stack: list[tuple[int, Iterator[tuple[int, Constant]], set]] = []
        decisions: list[tuple[int, Constant]] = []
        dead_ends: set[frozenset[tuple[int, Constant]]] = set()
        depth_mark = len(self.trail)
        iterator = self._candidates(roots, constraints)
        tried: set = set()
        while True:
            advanced = False
            for root, value in iterator:
                if self.value[root] is not None or (root, value) in tried:
                    continue
                tried.add((root, value))
                choice = frozenset((*decisions, (root, value)))
                if choice in dead_ends or not self.valid(root, value):
                    continue
                budget -= 1
                if budget < 0:
                    raise BudgetExhausted([self.variables[r] for r in roots])
                mark = len(self.trail)
                try:
                    self.assign(root, value, ("search", None))
                    self.propagate()
                except Conflict as conflict:
                    if not stack:
                        # Kept for the error, without the traceback: its frames
                        # (this one among them) would make a reference cycle
                        # holding the whole solver until the next collection.
                        conflicts.append(conflict.with_traceback(None))
                    dead_ends.add(choice)
                    self.undo(mark)
                    continue
                if all(self.value[r] is not None for r in roots):
                    if self.fuel is not None:
                        self.fuel -= start - budget
                    return
                stack.append((mark, iterator, tried))
                decisions.append((root, value))
                iterator = self._candidates(roots, constraints)
                tried = set()
                advanced = True
                break
            if advanced:
                continue
            if not stack:
                self.undo(depth_mark)
                raise self._unsolvable_component(roots, constraints, conflicts)
            dead_ends.add(frozenset(decisions))
            decisions.pop()
            mark, iterator, tried = stack.pop()
            self.undo(mark)

    # --- driver -----------------------------------------------------------------

    def solve(self) -> dict[Variable, Constant]:
        """The layout of every variable (raises :class:`Unsolvable` if there is none)."""
        return dict(zip(self.variables, self.solve_in_order()))

    def solve_in_order(self) -> list[Constant]:
        """Like :meth:`solve`, as a list: the layout of each variable by id."""
        self._propagate_nonsplat(*self._scan_constraints())
        # Classes are merged by now: every variable straight at its root.
        self.classes.flatten()
        try:
            # Before any constraint watches a class: the pass below examines
            # every active one once, in order.
            for var, layout, origin in self.system.assignments:
                self.assign(self.find(var.id), layout, ("o", origin))
            self._index()
            value, splat_watched, cvars = self.value, self.splat_watched, self.cvars
            for ci in self.indexed:
                target = splat_watched.get(ci)
                if target is not None:  # a strict relayout that may say nothing yet
                    source = value[cvars[ci][0]]
                    if source is None:
                        continue  # examined once its source has a layout
                    if value[target] is None and isinstance(source, RegisterLayout) and (
                            source.is_splat):
                        self._watch_target(ci)  # examined once its target has one
                        continue
                self.queued[ci] = True
                self.queue.append(ci)
            self.propagate()
        except Conflict as conflict:
            raise self._unsolvable(conflict) from None
        if self.fuel is not None:
            self._spend_fuel_on_propagation()
        for roots, constraints in self._components():
            self._search(roots, constraints)
        value = self.value
        # Every class has a layout once the search is done.
        return cast(list[Constant], list(map(value.__getitem__,  # map(): no bytecode per item
                                             self.classes.roots(range(len(value))))))

    def _spend_fuel_on_propagation(self) -> None:
        """Takes the classes propagation gave a layout out of :attr:`fuel`."""
        assigned = [r for r, parent in enumerate(self.parent)
                    if parent == r and self.value[r] is not None]
        self.fuel -= len(assigned)  # type: ignore[operator]
        if self.fuel < 0:
            raise BudgetExhausted([self.variables[r] for r in assigned[:5]])

    # --- explanations -----------------------------------------------------------

    def why_assigned(self, var: Variable) -> str:
        """How ``var`` got its layout: forced by a rule, implied through a
        constraint (a neighbour's layout), or chosen by the search."""
        reason = self.reason[self.find(var.id)]
        if isinstance(reason, tuple) and reason[0] == "o":
            return f"forced by {reason[1]}"
        if isinstance(reason, tuple) and reason[0] == "c":
            return f"implied by {self.origins[reason[1]]}"
        if isinstance(reason, tuple) and reason[0] == "search":
            return "chosen by the search"
        return "unknown"

    def _why(self, root: int, seen: set[int], depth: int = 0) -> list[str]:
        """Why class ``root`` has its value (or is known non-splat)."""
        if root in seen or depth > 6:
            return []
        seen.add(root)
        var = self.variables[root]
        lines = []
        reason = self.reason[root]
        value = self.value[root]
        if isinstance(reason, tuple) and reason[0] == "o":
            lines.append(f"{reason[1]} sets {var.site.describe()} to {value}")
        elif isinstance(reason, tuple) and reason[0] == "c":
            ci = reason[1]
            lines.append(f"{self.origins[ci]} requires {self.constraints[ci]}, "
                         f"so {var.site.describe()} is {value}")
            for other in self.cvars[ci]:
                lines += self._why(self.find(other), seen, depth + 1)
        elif isinstance(reason, tuple) and reason[0] == "search":
            lines.append(f"{var.site.describe()} was tried as {value}")
        if self.nonsplat[root] is not None:
            lines.append(f"{self.nonsplat[root]} makes a value that is never splat (so it "
                         f"cannot be relaid out freely), and it flows to "
                         f"{var.site.describe()}")
        lines += self._same_layout(root)
        return lines

    def _same_layout(self, root: int, shown: int = 6) -> list[str]:
        """Which other values were merged with class ``root`` (one layout for all)."""
        members = [v for v in self.variables if v.id != root and self.find(v.id) == root]
        if not members:
            return []
        names = ", ".join(m.site.describe() for m in members[:shown])
        more = f" and {len(members) - shown} more" if len(members) > shown else ""
        return [f"{self.variables[root].site.describe()} must have the same layout as "
                f"{names}{more} (they are connected through these ops)"]

    def _explain(self, conflict: Conflict) -> list[str]:
        lines = []
        if conflict.constraint is not None:
            ci = conflict.constraint
            lines.append(f"{self.origins[ci]} requires {self.constraints[ci]}: "
                         f"{conflict.reason}")
        else:
            lines.append(conflict.reason)
        seen: set[int] = set()
        for root in conflict.roots:
            lines += self._why(self.find(root), seen)
        return list(dict.fromkeys(lines))

    def _headline(self, conflict: Conflict) -> str | None:
        """One sentence: which ops ask for which layouts, and which ops
        connect them ("X asks for A; Y asks for B; they are connected
        through Z")."""
        demands: list[str] = []
        asking: set[str] = set()
        members: list[Variable] = []
        seen: set[int] = set()

        def visit(root: int, depth: int) -> None:
            if root in seen or depth > 6:
                return
            seen.add(root)
            reason = self.reason[root]
            if _is_origin(reason):
                demands.append(f"{_where(reason[1])} asks for {self.value[root]}")
                asking.add(_where(reason[1]))
            elif (ci := _ci(reason)) is not None:
                for other in self.cvars[ci]:
                    visit(self.find(other), depth + 1)
            members.extend(v for v in self.variables if self.find(v.id) == root)

        for root in conflict.roots:
            visit(self.find(root), 0)
        if conflict.constraint is not None:
            for other in self.cvars[conflict.constraint]:
                visit(self.find(other), 0)
        if not demands:
            return None
        through = [op for op in dict.fromkeys(_where_op(v.site.op) for v in members)
                   if op not in asking]
        sentence = "; ".join(dict.fromkeys(demands))
        if through:
            shown = ", ".join(through[:3]) + (" and others" if len(through) > 3 else "")
            sentence += f"; they are connected through {shown}"
        return sentence

    def _unsolvable(self, conflict: Conflict) -> Unsolvable:
        roots = [self.find(r) for r in conflict.roots]
        headline = self._headline(conflict)
        summary = headline or "the kernel's layout requirements conflict"
        return Unsolvable(summary, self._explain(conflict), [self.variables[r] for r in roots])

    def _unsolvable_component(self, roots: list[int], constraints: list[int],
                              conflicts: list[Conflict]) -> Unsolvable:
        lines = [f"no layout of {self.variables[roots[0]].site.describe()}"
                 + (f" (and {len(roots) - 1} connected values)" if len(roots) > 1 else "")
                 + " satisfies every requirement:"]
        for conflict in conflicts[:3]:
            lines += ["  " + line for line in self._explain(conflict)]
        if not conflicts:
            for ci in constraints[:8]:
                lines.append(f"  {self.origins[ci]} requires {self.constraints[ci]}")
        return Unsolvable("no layout assignment satisfies the kernel", lines,
                          [self.variables[r] for r in roots])


def _congruence_key(expr: Derived, find: Callable[[int], int]) -> tuple[Hashable, ...] | None:
    """The class ``expr`` derives from and the keys of its derivation steps,
    ``None`` if some step opts out or it derives from no variable."""
    source = expr.expression
    if type(source) is Variable:  # one derivation step (most): no list
        key = expr.congruence_key()
        return None if key is None else (find(source.id), key)
    keys: list[Hashable] = []
    while isinstance(expr, Derived):
        key = expr.congruence_key()
        if key is None:
            return None
        keys.append(key)
        expr = expr.expression
    if type(expr) is not Variable:
        return None
    return (find(expr.id), *keys)


def _splat_alike(var: Variable, expr: Expression) -> Variable | None:
    """The register variable ``expr`` derives from through splat-keeping
    steps only, if ``var`` is a register variable too; else ``None``."""
    if var.memory_space is not MemorySpace.REG or not isinstance(expr, Derived):
        return None
    while isinstance(expr, Derived):
        if not expr.keeps_splat:
            return None
        expr = expr.expression
    if type(expr) is Variable and expr.memory_space is MemorySpace.REG:
        return expr
    return None


def _where(origin: object) -> str:
    """An origin without its rule and plugin: ``op at file:line``."""
    if not isinstance(origin, Origin):
        return str(origin)
    what = origin.what
    if isinstance(what, str):
        return what
    return _where_op(what) if isinstance(what, ir.Operation) else what()


def _where_op(op: ir.Operation) -> str:
    location = format_location(op.location)
    return op.name + (f" at {location}" if location else "")


def _is_origin(reason: object) -> TypeGuard[tuple[str, Origin]]:
    return isinstance(reason, tuple) and reason[0] == "o"


def _ci(reason: object) -> int | None:
    if isinstance(reason, tuple) and reason[0] == "c":
        return reason[1]
    return None


def _fits(var: Variable, value: Constant) -> bool:
    match value:
        case layouts.RegisterLayout():
            return var.memory_space is MemorySpace.REG and value.fits(var.shape)
        case layouts.SmemTransforms():
            return var.memory_space is MemorySpace.SMEM and layouts.smem_transforms_fit(
                cast(ir.MemRefType, var.type), value)
        case layouts.TmemLayout(layout=layout):
            return var.memory_space is MemorySpace.TMEM and layouts.tmem_layout_fits(
                var.shape, layout)
    return False


def solve(system: ConstraintSystem, arch: tuple[int, int],
          budget: int = DEFAULT_SEARCH_BUDGET) -> dict[Variable, Constant]:
    """Finds a layout for every variable of ``system``, or raises :class:`Unsolvable`."""
    return Solver(system, arch, budget).solve()
