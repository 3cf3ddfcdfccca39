"""Union-find over the ids ``0..n-1``: the layout solver's classes of
variables that must have one layout.

How it works:

- ``parent[i]`` is ``i`` for a class's root, else an id of the same class
  closer to the root. :meth:`find` follows the parents to the root and
  then points every id it passed straight at it (path compression), so a
  second look takes one step.
- **The earliest id is the root.** :meth:`union` hangs the later of the
  two roots under the earlier one. So every id's parent precedes it, and
  :meth:`flatten` points every id at its root in one pass in order; the
  solver relies on that once its classes are merged (what follows finds
  each root in one step).
- A class's own data (the solver's: whether it can be splat, which kinds
  of values it holds) is not kept here: :meth:`union` says which root was
  kept and which absorbed, and the caller merges its data the same way.
- Speed: the solver looks up roots thousands of times per kernel,
  nearly always of an id that is its root or right below it. :meth:`find`
  answers those without its loops, and :meth:`roots` answers a whole list
  in one Python loop with that fast path inside, without a call per id
  (a call costs more than the lookup: ``benchmarks/NOTES.md``).
"""

from __future__ import annotations

from collections.abc import Iterable


class UnionFind:
    """Classes of the ids ``0..n-1``, each represented by its earliest id."""

    __slots__ = ("parent",)

    def __init__(self, n: int) -> None:
        #: Each id's parent; a root is its own (read it, never write it).
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        """The root of ``i``'s class."""
        parent = self.parent
        root = parent[i]
        if parent[root] == root:  # i is a root or right below one (most ids)
            return root
        while parent[root] != root:
            root = parent[root]
        while parent[i] != root:  # compress the path walked
            parent[i], i = root, parent[i]
        return root

    def roots(self, ids: Iterable[int]) -> list[int]:
        """The root of each of ``ids``, in their order (repeats kept)."""
        parent, find = self.parent, self.find
        # find()'s fast path inside: a call only for ids deeper down. (One
        # comprehension: cheaper than a loop that appends, or one over map().)
        return [root if parent[root := parent[i]] == root else find(root) for i in ids]

    def union(self, a: int, b: int) -> tuple[int, int] | None:
        """Merges the classes of ``a`` and ``b``. Returns the root kept (the
        earlier one) and the root absorbed, or ``None`` if they were one
        class already."""
        parent = self.parent
        ra, rb = parent[a], parent[b]
        if parent[ra] != ra:
            ra = self.find(ra)
        if parent[rb] != rb:
            rb = self.find(rb)
        if ra == rb:
            return None
        if rb < ra:
            ra, rb = rb, ra
        parent[rb] = ra
        return ra, rb

    def flatten(self) -> None:
        """Points every id straight at its root. Each id's parent precedes
        it (see the module's docstring), so one pass in order does it."""
        parent = self.parent
        for i in range(len(parent)):
            parent[i] = parent[parent[i]]
