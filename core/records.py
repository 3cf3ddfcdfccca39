"""Value objects whose fields are their ``__slots__``.

smalti has two ways to write a data class, and uses each for one kind:

- On the path from ``import smalti`` to a compiled kernel (what every
  process building a pipeline or compiling a kernel defines): subclasses of
  :class:`Record` (immutable, hashable: error codes, rule records;
  :class:`HashedRecord` for the layouts, hashed once) or :class:`Fields`
  (compared by value, mutable: the constraint language's statements, the
  constraint system, the reports). They get comparison by value, a
  dataclass-style ``repr`` and, for records, immutability and a hash from
  the ``__slots__`` alone, with no code generated at import: generating each
  class's methods (attrs, then) took 44 of the 86 ms a pipeline build took
  on a slow machine (``benchmarks/NOTES.md``, version 15).
- Everywhere else (the emulator, the vocabulary, the test kit, the plugin
  checker): standard-library dataclasses, frozen unless they must change.

A subclass lists its fields in ``__slots__`` (names starting with ``_``
are private state, not fields) and takes them in that order in its
``__init__``, which a :class:`Record` writes through :meth:`Record._set`
(by position: ``tests/core/test_records.py`` holds every subclass in smalti
to that order).

The few value objects made once per operand or per constraint while a
kernel is inferred (``Variable``, ``ValueSite``, the solver's origins) are
hand-written slotted classes, each saying why: a constructor that only
stores its fields is what they can afford. Slotted classes that are not data
(the emulator's frames and tasks, the solver's and the builder's working
state) are neither.
"""

from __future__ import annotations

from typing import Any, ClassVar


class Fields:
    """Compared by value and shown as attrs shows its classes
    (``Equal(lhs=V0(...), rhs=V1(...))``)."""

    __slots__ = ()
    #: Every field, bases' first (worked out for each subclass).
    _fields: ClassVar[tuple[str, ...]] = ()
    #: Fields left out of comparison, hashing and ``repr`` (a subclass's
    #: choice: say, a module object a record only carries along).
    _uncompared: ClassVar[frozenset[str]] = frozenset()
    #: The fields that are compared (worked out for each subclass).
    _compared: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._fields = tuple(name for klass in reversed(cls.__mro__)
                            for name in klass.__dict__.get("__slots__", ())
                            if not name.startswith("_"))
        cls._compared = tuple(name for name in cls._fields if name not in cls._uncompared)

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._compared)

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._compared)
        return f"{type(self).__name__}({fields})"


class Record(Fields):
    """An immutable, hashable :class:`Fields`."""

    __slots__ = ()

    def _set(self, *values: Any) -> None:
        """Sets the fields, in order, from ``__init__`` (records are
        otherwise immutable)."""
        for name, value in zip(self._fields, values, strict=True):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot delete {name!r}")

    def __hash__(self) -> int:
        return hash((self.__class__, *self._values()))

    def __reduce__(self) -> tuple[Any, ...]:
        # Copies and pickles go through __init__ (setting slots is refused).
        return self.__class__, tuple(getattr(self, name) for name in self._fields)


class HashedRecord(Record):
    """A :class:`Record` that works out its hash once, when made (for
    records hashed over and over: the layouts the solver compares)."""

    __slots__ = ("_hash",)
    _hash: int

    def _set(self, *values: Any) -> None:
        super()._set(*values)
        object.__setattr__(self, "_hash", hash((self.__class__, *self._values())))

    def __hash__(self) -> int:
        return self._hash
