"""smalti.records: the value objects of the pipeline's import path."""

import copy
import inspect
import os
import pickle
import subprocess
import sys

import pytest
from jax.experimental.mosaic.gpu import fragmented_array as fa

from smalti.codes import Code
from smalti.layouts import RegisterLayout, SmemTransforms
from smalti.records import Fields, HashedRecord, Record
from smalti.registry import Architectures, RuleKind, RuleRecord


class Point(Record):
    __slots__ = ("x", "y", "note")
    _uncompared = frozenset({"note"})

    def __init__(self, x: int, y: int, note: str = "") -> None:
        self._set(x, y, note)


class Hashed(HashedRecord):
    __slots__ = ("items",)

    def __init__(self, items: tuple[int, ...]) -> None:
        self._set(items)


class Mutable(Fields):
    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value


def _rule(op, builder):
    """A rule for the records below (module level: picklable)."""


def test_records_compare_hash_and_show_by_their_compared_fields():
    assert Point(1, 2, "a") == Point(1, 2, "b")
    assert hash(Point(1, 2, "a")) == hash(Point(1, 2, "b"))
    assert Point(1, 2) != Point(2, 1)
    assert repr(Point(1, 2, "a")) == "Point(x=1, y=2)"
    assert Point._fields == ("x", "y", "note") and Point._compared == ("x", "y")


def test_records_of_different_classes_never_compare_equal():
    class Other(Record):
        __slots__ = ("x", "y", "note")

        def __init__(self, x, y, note=""):
            self._set(x, y, note)

    assert Point(1, 2) != Other(1, 2)
    assert Point(1, 2).__eq__(Other(1, 2)) is NotImplemented


def test_records_are_immutable():
    point = Point(1, 2)
    with pytest.raises(AttributeError, match="Point is immutable: cannot set 'x'"):
        point.x = 3
    with pytest.raises(AttributeError, match="cannot delete 'y'"):
        del point.y
    with pytest.raises(AttributeError):
        point.z = 0  # no such slot, and no __dict__
    assert point == Point(1, 2)


def test_a_record_takes_exactly_its_fields():
    with pytest.raises(ValueError):
        Point._set(object.__new__(Point), 1, 2)  # one value short


def test_hashed_records_hash_once_as_records_do():
    record = Hashed((1, 2, 3))
    assert hash(record) == hash(Hashed((1, 2, 3))) == hash((Hashed, (1, 2, 3)))
    assert record._hash == hash(record)
    assert "_hash" not in Hashed._fields and repr(record) == "Hashed(items=(1, 2, 3))"


def test_fields_compare_by_value_and_stay_mutable_and_unhashable():
    value = Mutable(1)
    value.value = 2
    assert value == Mutable(2) and value != Mutable(1)
    with pytest.raises(TypeError):
        hash(value)


@pytest.mark.parametrize("record", [
    Code("SM999", "A title", "What it means.", before="x", after="y"),
    Architectures(minimum=[9, 0]),
    RuleRecord(RuleKind.CONSTRAINT, "arith.addf", _rule, "mine", Architectures((9, 0), (10, 0)),
               opaque_regions=True),
    RegisterLayout(fa.WGMMA_LAYOUT),
    SmemTransforms([8, 64], 128),
], ids=lambda record: type(record).__name__)
def test_smalti_records_copy_and_pickle_through_their_constructors(record):
    for again in (copy.copy(record), copy.deepcopy(record), pickle.loads(pickle.dumps(record))):
        assert again == record and hash(again) == hash(record)
        assert type(again) is type(record)


def test_converting_constructors_still_check_and_convert():
    assert Architectures(minimum=[9, 0]).minimum == (9, 0)
    with pytest.raises(ValueError, match="a .major, minor. pair"):
        Architectures(minimum=(9,))
    assert SmemTransforms([8, 64]).tiling == (8, 64)
    with pytest.raises(ValueError, match="swizzle must be one of"):
        SmemTransforms(None, 16)
    with pytest.raises(ValueError, match="empty tiling"):
        SmemTransforms(())


def test_building_a_pipeline_and_compiling_imports_no_attrs():
    # attrs' import and its generated methods were half the pipeline's
    # build time; the compile path stays clear of it.
    code = ("import sys, jax, jax.experimental.mosaic.gpu\n"
            "import smalti, smalti.inference, smalti.lowering, smalti.jax\n"
            "smalti.build_pipeline()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('attr', 'attrs')))\n")
    env = {**os.environ, "SMALTI_BLOCK_PLUGINS": "smalti_example_plugin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _smalti_fields_classes() -> list[type]:
    """Every Fields subclass defined in smalti's packages (imported here)."""
    import importlib
    import pkgutil

    for package in ("smalti", "smalti.plugins", "smalti.hopper", "smalti.blackwell"):
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
            importlib.import_module(f"{package}.{info.name}")
    found, stack = [], [Fields]
    while stack:
        for sub in stack.pop().__subclasses__():
            stack.append(sub)
            if sub.__module__.split(".")[0] == "smalti" and sub._fields:
                found.append(sub)
    return found


def test_every_smalti_record_takes_its_fields_in_slot_order():
    # Record._set writes __init__'s values by position into the __slots__'
    # fields: an __init__ whose parameters were in another order would
    # silently swap two fields.
    classes = _smalti_fields_classes()
    assert len(classes) >= 30  # the registry's, the layouts', the constraint language's...
    for cls in classes:
        parameters = tuple(inspect.signature(cls.__init__).parameters)[1:]
        assert parameters == cls._fields, f"{cls.__module__}.{cls.__qualname__}"


def test_the_slot_order_check_sees_a_swapped_constructor():
    class Swapped(Record):
        __slots__ = ("x", "y")

        def __init__(self, y: int, x: int) -> None:
            self._set(y, x)

    parameters = tuple(inspect.signature(Swapped.__init__).parameters)[1:]
    assert parameters != Swapped._fields
    assert Swapped(y=1, x=2).x == 1  # what the check guards against
