"""An asynchronous unit's access that covers a whole run of shadow cells (a
TMA box's or a WGMMA operand's SMEM tile) is checked through views of the
shadow rather than gathers (emulate/sync/checker.py, ``_as_run``): the same
reports and the same shadow as the cell-by-cell check, on random sequences
of units' reads and writes that race with each other."""

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


def _units_racing(seed: int) -> tuple[dict, np.ndarray, np.ndarray]:
    """A random sequence of three units' reads and writes of one SMEM buffer,
    none ordered after another: its races, the shadow's writes and reads."""
    rng = np.random.default_rng(seed)
    space = Space("shared", 0)
    region = space.alloc(4096, "block (0, 0, 0) SMEM")
    region.tracked = True
    ch = Checker("warn", "ignore")
    ch.clocks = Clocks(["block 0 warp 0"])
    ch.kinds = [checker_module.WARP]
    units = [ch.component(checker_module.TMA_LOAD, f"unit {k}") for k in range(3)]
    view = np.zeros(ch.clocks.matrix.shape[1], np.int32)  # knows nothing: all unordered
    for step in range(40):
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
    races, writes, reads = _units_racing(seed)
    assert races  # the sequences race: the comparison says something
    monkeypatch.setattr(checker_module, "_as_run", lambda cells: cells)
    races_by_cell, writes_by_cell, reads_by_cell = _units_racing(seed)
    assert races.keys() == races_by_cell.keys()
    for key, race in races.items():
        by_cell = races_by_cell[key]
        assert race.count == by_cell.count
        assert (race.first.start, race.first.stop) == (by_cell.first.start, by_cell.first.stop)
        assert (race.second.start, race.second.stop) == \
            (by_cell.second.start, by_cell.second.stop)
    np.testing.assert_array_equal(writes, writes_by_cell)
    np.testing.assert_array_equal(reads, reads_by_cell)
