"""``gpu`` rules: ``gpu.launch`` over a grid (and a grid of clusters), every
id and size op against the launch's block arguments and CUDA's numbering,
``gpu.barrier`` between the warpgroups of a block exchanging values through
dynamic shared memory, what a barrier only part of a block reaches raises, and
``gpu.printf`` as C's printf formats it, thread by thread."""

from __future__ import annotations

import numpy as np
import pytest

from smalti.emulate.sync.reports import BarrierDivergence

from .harness import assert_same_bits, covers, run

IDS = ["gpu.thread_id x", "gpu.block_id x", "gpu.block_id y", "gpu.block_dim x",
       "gpu.grid_dim x", "gpu.grid_dim y", "gpu.lane_id", "gpu.cluster_id x",
       "gpu.cluster_block_id x", "gpu.cluster_dim x", "gpu.cluster_dim_blocks x",
       "gpu.thread_id y", "gpu.block_id z"]


def _launch(grid, block, cluster=None) -> np.ndarray:
    """Each thread of a launch stores every id of IDS at its global index."""
    gx, gy, gz = grid
    n = gx * gy * gz * block
    lines = []
    for k, op in enumerate(IDS):
        lines += [f"%v{k} = {op}", f"%k{k} = arith.constant {k} : index",
                  f"memref.store %v{k}, %out[%g, %k{k}] : memref<{n}x{len(IDS)}xindex>"]
    consts = "\n".join(f"%c{v} = arith.constant {v} : index"
                       for v in sorted({1, *grid, block, *(cluster or ())}))
    cl = ""
    if cluster:
        cl = (f"clusters(%cx, %cy, %cz) in (%ncx = %c{cluster[0]}, %ncy = %c{cluster[1]}, "
              f"%ncz = %c{cluster[2]}) ")
    body = f"""
      {consts}
      gpu.launch {cl}blocks(%bx, %by, %bz) in (%gx = %c{gx}, %gy = %c{gy}, %gz = %c{gz})
                 threads(%tx, %ty, %tz) in (%sx = %c{block}, %sy = %c1, %sz = %c1) {{
        %l1 = arith.muli %bz, %gy : index
        %l2 = arith.addi %l1, %by : index
        %l3 = arith.muli %l2, %gx : index
        %l4 = arith.addi %l3, %bx : index
        %l5 = arith.muli %l4, %sx : index
        %g = arith.addi %l5, %tx : index
        {chr(10).join(lines)}
        gpu.terminator
      }}"""
    out = np.full((n, len(IDS)), -1, np.int64)
    return run(body, {"out": (f"memref<{n}x{len(IDS)}xindex>", out)}, host=True)["out"]


def _expected(grid, block, cluster=(1, 1, 1)) -> np.ndarray:
    gx, gy, gz = grid
    rows = []
    for bz in range(gz):
        for by in range(gy):
            for bx in range(gx):
                for t in range(block):
                    rows.append([t, bx, by, block, gx, gy, t % 32, bx // cluster[0],
                                 bx % cluster[0], gx // cluster[0], cluster[0], 0, bz])
    return np.array(rows, np.int64)


@covers("gpu.launch", "gpu.thread_id", "gpu.block_id", "gpu.block_dim", "gpu.grid_dim",
        "gpu.lane_id", "gpu.cluster_id", "gpu.cluster_block_id", "gpu.cluster_dim",
        "gpu.cluster_dim_blocks")
def test_launch_runs_every_block_and_ids_number_as_cuda_does():
    assert_same_bits(_launch((3, 2, 2), 64), _expected((3, 2, 2), 64))
    assert_same_bits(_launch((4, 1, 1), 32, cluster=(2, 1, 1)),
                     _expected((4, 1, 1), 32, cluster=(2, 1, 1)))


SMEM = "#gpu.address_space<workgroup>"


@covers("gpu.launch", "gpu.barrier", "gpu.dynamic_shared_memory", "memref.view")
def test_barrier_orders_warpgroups_through_dynamic_smem():
    """256 threads (two warpgroups, run as two tasks): each stores its id to
    SMEM, waits at the barrier, then reads its neighbour's, which the other
    warpgroup wrote for the last thread of each."""
    n = 256
    got = run(f"""
      %c1 = arith.constant 1 : index
      %cn = arith.constant {n} : index
      %bytes = arith.constant {8 * n} : i32
      gpu.launch blocks(%bx, %by, %bz) in (%gx = %c1, %gy = %c1, %gz = %c1)
                 threads(%tx, %ty, %tz) in (%sx = %cn, %sy = %c1, %sz = %c1)
                 dynamic_shared_memory_size %bytes {{
        %raw = gpu.dynamic_shared_memory : memref<?xi8, {SMEM}>
        %c0 = arith.constant 0 : index
        %s = memref.view %raw[%c0][] : memref<?xi8, {SMEM}> to memref<{n}xindex, {SMEM}>
        memref.store %tx, %s[%tx] : memref<{n}xindex, {SMEM}>
        gpu.barrier
        %t1 = arith.addi %tx, %c1 : index
        %nb = arith.remui %t1, %cn : index
        %v = memref.load %s[%nb] : memref<{n}xindex, {SMEM}>
        memref.store %v, %out[%tx] : memref<{n}xindex>
        gpu.terminator
      }}""", {"out": (f"memref<{n}xindex>", np.zeros(n, np.int64))}, host=True)
    assert_same_bits(got["out"], (np.arange(n) + 1) % n)


@covers("gpu.barrier", "scf.if")
def test_a_barrier_in_a_divergent_branch_is_reported():
    with pytest.raises(BarrierDivergence, match="reached by 16 of the 32 threads"):
        run("""
          %t = gpu.thread_id x
          %c16 = arith.constant 16 : index
          %lo = arith.cmpi ult, %t, %c16 : index
          scf.if %lo {
            gpu.barrier
          }""")


@covers("gpu.printf", "scf.if")
def test_printf_prints_each_active_thread_in_order_as_c_does(capsys):
    """Each thread of 32 prints its i32 (INT_MIN, INT_MAX, -1, 0... as %d,
    %u, %08x), its i64 as %lld and its f64 as %.3f and %e (-0, inf, the
    largest double); then only the odd threads print, under an scf.if."""
    i32 = np.array([-2 ** 31, 2 ** 31 - 1, -1, 0, 1, 255, -256, 7] * 4, np.int32)
    i64 = np.array([-2 ** 63, 2 ** 63 - 1, -1, 0] * 8, np.int64)
    f64 = np.array([-0.0, np.inf, -np.inf, np.finfo(np.float64).max, 1.0005, -2.5e-300, 3.0,
                    0.1] * 4)
    run("""
      gpu.printf "a=%d u=%u x=%08x|%lld %.3f %e %%\\n", %a, %a, %a, %b, %c, %c : i32, i32, i32, i64, f64, f64
      %t = gpu.thread_id x
      %c1 = arith.constant 1 : index
      %bit = arith.andi %t, %c1 : index
      %odd = arith.cmpi eq, %bit, %c1 : index
      scf.if %odd {
        gpu.printf "odd %5d\\n", %a : i32
      }""",  # noqa: E501 -- MLIR text, one op a line
        {"a": ("i32", i32), "b": ("i64", i64), "c": ("f64", f64)})
    want = "".join(f"a={a} u={a % 2 ** 32} x={a % 2 ** 32:08x}|{b} {c:.3f} {c:e} %\n"
                   for a, b, c in zip(i32.tolist(), i64.tolist(), f64.tolist()))
    want += "".join(f"odd {a:5d}\n" for a in i32[1::2].tolist())
    assert capsys.readouterr().out == want


@covers("gpu.printf")
def test_printf_of_a_conversion_it_cannot_print_is_unsupported():
    from smalti.emulate.errors import Unsupported

    with pytest.raises(Unsupported, match="printf conversion '%s'"):
        run('gpu.printf "%s\\n", %a : i32', {"a": ("i32", 1)})
    with pytest.raises(Unsupported, match="more conversions than its 1 arguments"):
        run('gpu.printf "%d %d\\n", %a : i32', {"a": ("i32", 1)})
    with pytest.raises(Unsupported, match="1 conversions for 2 arguments"):
        run('gpu.printf "%d\\n", %a, %a : i32, i32', {"a": ("i32", 1)})
