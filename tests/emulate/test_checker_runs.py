"""An asynchronous unit's access that covers a whole run of shadow cells (a
TMA box's or a WGMMA operand's SMEM tile) is checked through views of the
shadow rather than gathers, and a read-only address array that recurs (a
WGMMA descriptor's operand) keeps its cells (emulate/sync/checker.py,
``_unit_cells``): the same reports and the same shadow as the cell-by-cell
check of fresh arrays, on random sequences of units' reads and writes that
race with each other; memory (emulate/memory.py) likewise keeps where such
an array points, until its buffers change."""

from __future__ import annotations

import numpy as np
import pytest

from smalti.emulate.memory import Space
from smalti.emulate.sync import checker as checker_module
from smalti.emulate.sync.checker import Checker, _as_run
from smalti.emulate.sync.clocks import Clocks
from smalti.emulate.sync.shadow import OpSite


def test_a_permuted_run_of_cells_is_a_slice_and_a_run_with_a_hole_is_not():
    cells = np.random.default_rng(0).permutation(np.arange(100, 164))
    assert _as_run(cells) == slice(100, 164)
    assert _as_run(np.concatenate([cells, cells[:5]])) == slice(100, 164)  # repeats
    holed = cells[cells != 130]
    assert _as_run(holed) is holed
    spread = np.arange(0, 128, 2)
    assert _as_run(spread) is spread


def _address_pool(rng: np.random.Generator) -> list[tuple[np.ndarray, int]]:
    """Read-only element addresses (shuffled; some runs, some with a hole)
    and their element size, for accesses that recur."""
    pool = []
    for _ in range(8):
        itemsize = int(rng.choice([2, 4]))
        addrs = int(rng.integers(0, 64)) * 16 + itemsize * np.arange(int(rng.integers(1, 64)))
        addrs = addrs[addrs + itemsize <= 4096]
        if rng.random() < 0.3 and len(addrs) > 2:
            addrs = addrs[addrs != addrs[len(addrs) // 2]]
        rng.shuffle(addrs)
        addrs.setflags(write=False)
        pool.append((addrs, itemsize))
    return pool


def _units_racing(seed: int, recurring: bool = False, fresh_copies: bool = False
                  ) -> tuple[dict, np.ndarray, np.ndarray]:
    """A random sequence of three units' reads and writes of one SMEM buffer,
    none ordered after another: its races, the shadow's writes and reads.
    ``recurring``: the addresses come from a pool of read-only arrays (as
    fresh writable copies with ``fresh_copies``)."""
    rng = np.random.default_rng(seed)
    pool = _address_pool(rng)
    space = Space("shared", 0)
    region = space.alloc(4096, "block (0, 0, 0) SMEM")
    region.tracked = True
    ch = Checker("warn", "ignore")
    ch.clocks = Clocks(["block 0 warp 0"])
    ch.kinds = [checker_module.WARP]
    units = [ch.component(checker_module.TMA_LOAD, f"unit {k}") for k in range(3)]
    view = np.zeros(ch.clocks.matrix.shape[1], np.int32)  # knows nothing: all unordered
    for step in range(40):
        if recurring:
            addrs, itemsize = pool[int(rng.integers(0, len(pool)))]
            addrs = addrs.copy() if fresh_copies else addrs
        else:
            itemsize = int(rng.choice([2, 4]))
            start = int(rng.integers(0, 64)) * 16
            count = int(rng.integers(1, 64))
            addrs = start + itemsize * np.arange(count)
            addrs = addrs[addrs + itemsize <= region.size]
            if rng.random() < 0.3:  # a hole: not a run
                addrs = addrs[addrs != addrs[len(addrs) // 2]] if len(addrs) > 2 else addrs
            rng.shuffle(addrs)
        unit = units[int(rng.integers(0, 3))]
        site = OpSite(f"op{step}", f"kernel.py:{step}")
        ch.async_access(view, space, addrs, itemsize, bool(rng.random() < 0.5), site,
                        unit, step + 1, f"unit {unit}")
    sh = region.shadow
    return ch.races, sh.write.copy(), sh.read[:len(sh.columns)].copy()


@pytest.mark.parametrize("seed", range(6))
def test_runs_report_and_record_what_the_cell_by_cell_check_does(seed, monkeypatch):
    by_runs = _units_racing(seed)
    assert by_runs[0]  # the sequences race: the comparison says something
    monkeypatch.setattr(checker_module, "_as_run", lambda cells: cells)
    _same(by_runs, _units_racing(seed))

def _same(a: tuple[dict, np.ndarray, np.ndarray], b: tuple[dict, np.ndarray, np.ndarray]) -> None:
    races, writes, reads = a
    other_races, other_writes, other_reads = b
    assert races.keys() == other_races.keys()
    for key, race in races.items():
        other = other_races[key]
        assert race.count == other.count
        assert (race.first.start, race.first.stop, race.second.start, race.second.stop) == \
            (other.first.start, other.first.stop, other.second.start, other.second.stop)
    np.testing.assert_array_equal(writes, other_writes)
    np.testing.assert_array_equal(reads, other_reads)


@pytest.mark.parametrize("seed", range(6))
def test_recurring_read_only_addresses_check_as_fresh_ones(seed, monkeypatch):
    """Kept cells stay right across the shadow's refinement (2-byte accesses
    after 4-byte ones) and whatever the arrays' order of use."""
    kept = _units_racing(seed, recurring=True)
    assert kept[0]
    fresh = _units_racing(seed, recurring=True, fresh_copies=True)
    _same(kept, fresh)
    monkeypatch.setattr(checker_module, "_as_run", lambda cells: cells)
    _same(kept, _units_racing(seed, recurring=True, fresh_copies=True))


def test_a_recurring_address_array_reads_the_buffer_there_now():
    """Space keeps where a read-only address array points (a WGMMA operand's,
    loaded once per instruction) until its buffers change: a buffer freed
    and another allocated at the same address is read, not the old one."""
    space = Space("shared", 0)
    first = space.alloc(64, "first")
    first.view(np.dtype(np.int32))[:] = np.arange(16)
    addrs = np.array([12, 4, 0], np.int64)
    addrs.setflags(write=False)
    dtype = np.dtype(np.int32)
    np.testing.assert_array_equal(space.load(addrs, dtype), [3, 1, 0])
    first.view(dtype)[0] = 7  # the data itself is read each time
    np.testing.assert_array_equal(space.load(addrs, dtype), [3, 1, 7])
    space.free(first)
    second = space.alloc(64, "second")
    assert second.base == first.base
    second.view(dtype)[:] = -np.arange(16)
    np.testing.assert_array_equal(space.load(addrs, dtype), [-3, -1, 0])
    space.store(addrs, np.array([5, 6, 8], np.int32), dtype)
    np.testing.assert_array_equal(second.view(dtype)[[3, 1, 0]], [5, 6, 8])


def test_where_a_recurring_array_points_is_kept_from_launch_to_launch():
    """Each launch has new spaces and buffers, at the same addresses: the
    kept indices serve the next launch's buffer at the same base, and are
    not used where the buffer there now starts elsewhere or is missing."""
    from smalti.emulate.sync.reports import OutOfBounds
    dtype = np.dtype(np.int32)
    addrs = np.array([1024 + 80, 1024 + 68], np.int64)
    addrs.setflags(write=False)
    for launch, base in enumerate([1024, 1024, 1024 + 64]):
        space = Space("shared", base)
        region = space.alloc(256, "smem", align=64)
        assert region.base == base
        region.view(dtype)[:] = np.arange(64) + 100 * launch
        want = (addrs - base) // 4 + 100 * launch  # a stale index would read 20, 17
        np.testing.assert_array_equal(space.load(addrs, dtype), want)
    with pytest.raises(OutOfBounds):  # no buffer there now
        Space("shared", 1024).load(addrs, dtype)


def test_a_units_kept_cells_serve_the_next_launch_at_the_same_base_only():
    """The cells a recurring array covers are kept across launches (new
    checkers, new buffers): a buffer at the same base gets the same cells
    recorded; one at another base gets its own."""
    addrs = 2048 + 4 * np.array([5, 2, 9], np.int64)
    addrs.setflags(write=False)
    written = []
    for base in (2048, 2048, 2048 - 16):
        space = Space("shared", base)
        region = space.alloc(256, "smem", align=16)
        region.tracked = True
        ch = Checker("warn", "ignore")
        ch.clocks = Clocks(["block 0 warp 0"])
        ch.kinds = [checker_module.WARP]
        unit = ch.component(checker_module.TMA_LOAD, "unit")
        view = np.zeros(ch.clocks.matrix.shape[1], np.int32)
        ch.async_access(view, space, addrs, 4, True, OpSite("op", "k.py:1"), unit, 1, "unit")
        written.append(np.flatnonzero(region.shadow.write))
    np.testing.assert_array_equal(written[0], [2, 5, 9])
    np.testing.assert_array_equal(written[1], [2, 5, 9])
    np.testing.assert_array_equal(written[2], [6, 9, 13])
