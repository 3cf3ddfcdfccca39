"""smalti.union_find: roots, merges and the earliest-root rule the solver
relies on, checked against a naive partition."""

import random

import pytest

from smalti.union_find import UnionFind


def test_singletons_are_their_own_roots():
    classes = UnionFind(5)
    assert [classes.find(i) for i in range(5)] == [0, 1, 2, 3, 4]
    assert classes.roots(range(5)) == [0, 1, 2, 3, 4]
    assert classes.roots([]) == []
    assert UnionFind(0).roots([]) == []


def test_union_keeps_the_earliest_root_whatever_the_order():
    classes = UnionFind(6)
    assert classes.union(4, 2) == (2, 4)
    assert classes.union(1, 4) == (1, 2)  # roots, not the ids given
    assert classes.union(5, 3) == (3, 5)
    assert classes.union(5, 4) == (1, 3)
    assert classes.roots(range(6)) == [0, 1, 1, 1, 1, 1]


def test_union_of_one_class_changes_nothing():
    classes = UnionFind(4)
    classes.union(0, 3)
    before = list(classes.parent)
    assert classes.union(3, 0) is None
    assert classes.union(3, 3) is None
    assert classes.union(2, 2) is None
    assert classes.parent == before


def test_roots_keep_the_order_and_repeats_of_the_ids():
    classes = UnionFind(5)
    classes.union(1, 4)
    assert classes.roots([4, 0, 4, 1, 3]) == [1, 0, 1, 1, 3]
    assert classes.roots(iter([3, 4])) == [3, 1]  # any iterable, once


def _chain(n):
    """A chain built from its far end: each union hangs a root under the
    next lower id, so the last id is n - 1 steps below the root (no
    find() has compressed anything yet)."""
    classes = UnionFind(n)
    for i in reversed(range(1, n)):
        classes.union(i - 1, i)
    return classes


def test_a_chain_is_deep_until_found_then_one_step():
    n = 50
    classes = _chain(n)
    assert classes.parent == [0] + list(range(n - 1))  # each under its predecessor
    assert classes.find(n - 1) == 0
    assert all(classes.parent[i] == 0 for i in range(n))  # the path compressed


@pytest.mark.parametrize("n", [1, 2, 3, 50])
def test_roots_of_a_deep_chain(n):
    classes = _chain(n)
    assert classes.roots(reversed(range(n))) == [0] * n


def test_flatten_points_every_id_at_its_root_in_one_pass():
    n = 64
    classes = UnionFind(n)
    for i in reversed(range(1, n // 2)):
        classes.union(i - 1, i)
    for i in reversed(range(n // 2 + 1, n)):
        classes.union(i, i - 1)
    classes.union(n - 1, n // 2 - 1)  # joins the chains' ends: root 0
    classes.flatten()
    assert classes.parent == [0] * n


def test_against_a_naive_partition():
    rng = random.Random(38)
    n = 200
    classes = UnionFind(n)
    naive = [{i} for i in range(n)]  # the class of each id, shared by its members
    for _ in range(300):
        a, b = rng.randrange(n), rng.randrange(n)
        joined = classes.union(a, b)
        if naive[a] is naive[b]:
            assert joined is None
            continue
        assert joined == (min(min(naive[a]), min(naive[b])), max(min(naive[a]), min(naive[b])))
        merged = naive[a] | naive[b]
        for i in merged:
            naive[i] = merged
        if rng.random() < 0.3:  # finds between unions compress paths midway
            i = rng.randrange(n)
            assert classes.find(i) == min(naive[i])
    expected = [min(naive[i]) for i in range(n)]
    assert classes.roots(range(n)) == expected
    assert all(classes.parent[i] <= i for i in range(n))  # parents precede
    classes.flatten()
    assert classes.parent == expected
