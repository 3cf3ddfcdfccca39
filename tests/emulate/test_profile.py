"""The profiler (smalti.emulate.profile) on kernels whose counts are known by
construction (benchmarks/h200_counters.py, which the lead also runs under
Nsight Compute on a GPU): each expected count is derived here from how the
kernel is built, never pasted. Also: the bank model against a brute-force
count, the phase split of 64- and 128-bit accesses, the instruction count of
inline PTX, the checker and the profiler on at once, and the test kit."""

from __future__ import annotations

import inspect
import itertools
import types

import numpy as np
import pytest

import smalti.emulate as emu
from benchmarks import h200_counters as H
from smalti.emulate import profiling as P

F32 = 4  # bytes
BANKS, BANK_BYTES = 32, 4
WAVEFRONT_BYTES = BANKS * BANK_BYTES  # a conflict-free wavefront serves 128 bytes


def shared(p, ld_or_st: str) -> tuple[int, int, int]:
    """(instructions, wavefronts, conflicts) of one direction."""
    c = p.counters
    return (c[f"smsp__inst_executed_op_shared_{ld_or_st}"],
            c[f"{P.WAVEFRONTS}_op_{ld_or_st}"], c[f"{P.CONFLICTS}_op_{ld_or_st}"])


def assert_by_line_sums(p) -> None:
    for name, total in p.counters.items():
        assert sum(c.get(name, 0) for c in p.by_line.values()) == total, name


def line_of(fn, text: str) -> str:
    """``file:line`` of the line of ``fn``'s source containing ``text``."""
    lines, first = inspect.getsourcelines(fn)
    (k,) = [i for i, s in enumerate(lines) if text in s]
    return f"{inspect.getsourcefile(fn)}:{first + k}"


def test_conflict_free_copy():
    k = H.copy_conflict_free()
    p = emu.profile(k.fn, *k.args)
    np.testing.assert_array_equal(p.outputs[0], k.want(*k.args))
    nbytes = int(np.prod(H.COPY_SHAPE)) * F32
    per_thread = H.VEC * F32  # one 128-bit access per instruction
    warp_bytes = 32 * per_thread
    phases = 32 * per_thread // WAVEFRONT_BYTES  # quarter-warps, each 128 contiguous bytes
    for d in ("ld", "st"):
        inst, wf, conflicts = shared(p, d)
        assert inst == nbytes // warp_bytes
        assert wf == inst * phases == nbytes // WAVEFRONT_BYTES
        assert conflicts == 0
    assert p[P.WAVEFRONTS] == 2 * nbytes // WAVEFRONT_BYTES and p[P.CONFLICTS] == 0
    assert p[P.TMA_LOAD] == p[P.TMA_STORE] == nbytes
    assert p[P.GLOBAL_LD] == p[P.GLOBAL_ST] == 0  # only TMA touches global memory
    # the SMEM traffic is the line that loads and stores; the TMA bytes their lines'
    src = H.copy_conflict_free
    move = line_of(src, "plgpu.load(x_smem")
    assert p.by_line[move][P.WAVEFRONTS] == p[P.WAVEFRONTS]
    assert p.by_line[line_of(src, "copy_gmem_to_smem(")][P.TMA_LOAD] == nbytes
    assert p.by_line[line_of(src, "copy_smem_to_gmem(")][P.TMA_STORE] == nbytes
    assert_by_line_sums(p)


@pytest.mark.parametrize("swizzled", [False, True], ids=["column_read_32way", "swizzled"])
def test_transpose_through_smem(swizzled):
    k = H.transpose(swizzled)
    p = emu.profile(k.fn, *k.args)
    np.testing.assert_array_equal(p.outputs[0], k.want(*k.args))
    tile = 32  # a warp's tile is 32 x 32 f32: one row (or column) per instruction
    inst = tile * H.WARPS
    # pass 1: lane l writes word 32 r + l (or 32 r + (l ^ r)): 32 distinct banks
    assert shared(p, "st") == (inst, inst, 0)
    # pass 2: lane l reads word 32 l + c -- bank c for every lane, 32 words: a
    # 32-way conflict; swizzled, word 32 l + (c ^ l): bank c ^ l, all distinct
    ways = 1 if swizzled else tile
    assert shared(p, "ld") == (inst, inst * ways, inst * (ways - 1))
    # global rows: 32 lanes x 4 bytes, 128 aligned bytes: four 32-byte sectors
    for d in ("ld", "st"):
        assert p[f"smsp__inst_executed_op_global_{d}"] == inst
        assert p[f"{P.SECTORS}{d}"] == inst * 32 * F32 // 32
        assert p[f"{P.GLOBAL_BYTES}{d}"] == inst * 32 * F32
    # the lines: the conflicts are the column pass's, the barrier the one between
    src = H.transpose
    column_pass = p.by_line[line_of(src, "# pass 2")]
    assert column_pass[P.WAVEFRONTS + "_op_ld"] == inst * ways
    assert column_pass.get(P.CONFLICTS, 0) == p[P.CONFLICTS]
    assert p.by_line[line_of(src, "# between the passes")][P.BARRIERS] == H.WARPS
    assert p[P.THREAD_INST] == 32 * p[P.INST]  # no thread is ever masked off
    assert_by_line_sums(p)


def test_swizzled_transpose_through_matrix_instructions():
    """jax's own transpose through 128-byte-swizzled SMEM: ldmatrix.x4 reads,
    stmatrix.x4 into the transposed view writes, 4 matrices of 8 rows of 16
    bytes each; the swizzle puts a matrix's 8 rows (128 bytes apart, the same
    logical 16-byte column) into 8 distinct 16-byte chunks: one wavefront
    per matrix."""
    k = H.tma_transpose()
    p = emu.profile(k.fn, *k.args)
    np.testing.assert_array_equal(p.outputs[0], k.want(*k.args))
    nbytes = int(np.prod(H.TMA_TRANSPOSE_SHAPE)) * 2
    matrix = 8 * 16
    per_instruction = 4 * matrix  # .x4
    assert p[P.LDSM] == p[P.STSM] == nbytes // per_instruction
    for d in ("ld", "st"):
        assert p[f"{P.WAVEFRONTS}_op_{d}"] == nbytes // matrix
    assert p[P.CONFLICTS] == 0
    assert p[P.SHARED_LD] == p[P.SHARED_ST] == 0  # no plain shared access
    assert p[P.TMA_LOAD] == p[P.TMA_STORE] == nbytes
    assert_by_line_sums(p)


def test_wgmma_tile():
    k = H.wgmma_tile()
    p = emu.profile(k.fn, *k.args)
    np.testing.assert_array_equal(p.outputs[0], k.want(*k.args))
    m, kk, n = H.WGMMA_M, H.WGMMA_K, H.WGMMA_N
    bf16 = 2
    k_per_instruction = 32 // bf16  # wgmma.m64nNk16 for 16-bit operands
    assert p[P.WGMMA] == kk // k_per_instruction
    assert p[P.FLOPS] == 2 * m * n * kk
    operand_bytes = (m * kk + kk * n) * bf16
    assert p[P.WGMMA_SMEM] == operand_bytes  # each operand byte read once
    assert p[P.TMA_LOAD] == operand_bytes and p[P.TMA_INST] == 2
    assert p[P.GLOBAL_BYTES + "st"] == m * n * F32  # the accumulator, from registers
    assert p[P.WAVEFRONTS] == 0  # WGMMA reads SMEM through descriptors, not the LSU
    assert p[P.MBAR_WAITS] == 2 * 4  # two barrier_waits, four warps
    assert p.by_line[line_of(H.wgmma_tile, "plgpu.wgmma(")][P.FLOPS] == 2 * m * n * kk
    assert_by_line_sums(p)


def brute_wavefronts(words) -> int:
    """The most distinct words any bank holds, by Python sets."""
    banks: dict[int, set] = {}
    for w in words:
        if w >= 0:
            banks.setdefault(w % BANKS, set()).add(w)
    return max((len(s) for s in banks.values()), default=0)


def test_wavefronts_against_brute_force():
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, span, 32) for span in (1, 8, 40, 64, 200, 4096) for _ in range(20)]
    rows += [np.where(rng.random(32) < 0.5, r, -1) for r in rows[:40]]  # inactive lanes
    rows.append(np.full(32, -1))
    words = np.stack(rows)
    np.testing.assert_array_equal(P.wavefronts(words), [brute_wavefronts(r) for r in rows])


def _frame(T=32, mask=None):
    return types.SimpleNamespace(T=T, mask=mask, mem=None)


def _access(byte_addrs, itemsize, vec, mask=None):
    """Counters of one shared load: thread t's ``vec`` elements at byte_addrs[t]."""
    prof = P.Profiler()
    a = np.asarray(byte_addrs, np.int64)[:, None] + np.arange(vec) * itemsize
    site = types.SimpleNamespace(location="k.py:1")
    prof.access(_frame(len(byte_addrs), mask), "shared", a, 1, itemsize, False, site)
    return prof.lines["k.py:1"]


def test_wide_accesses_split_into_phases():
    lane = np.arange(32)
    # 64-bit: lanes l and l + 16 hit the same banks (256 bytes apart) but are
    # in different half-warp phases: 2 wavefronts, no conflict
    c = _access((lane % 16) * 8 + (lane // 16) * 256, 4, 2)
    assert (c[P.WAVEFRONTS], c[P.CONFLICTS], c[P.SHARED_LD]) == (2, 0, 1)
    # the same 64-bit addresses spread so each half-warp hits one bank pair
    # 16 times: 16 wavefronts per phase
    c = _access(lane * 256, 4, 2)
    assert (c[P.WAVEFRONTS], c[P.CONFLICTS]) == (32, 30)
    # 128-bit: quarter-warps; lanes 0..7 read 128 contiguous bytes, and so on
    c = _access(lane * 16, 4, 4)
    assert (c[P.WAVEFRONTS], c[P.CONFLICTS]) == (4, 0)
    # 128-bit, two lanes of each quarter 128 bytes apart: 2 per quarter
    c = _access((lane % 8) // 2 * 16 + (lane % 2) * 128 + (lane // 8) * 1024, 4, 4)
    assert (c[P.WAVEFRONTS], c[P.CONFLICTS]) == (8, 4)
    # broadcast: every lane one word: one wavefront
    c = _access(np.zeros(32), 4, 1)
    assert (c[P.WAVEFRONTS], c[P.CONFLICTS]) == (1, 0)
    # inactive lanes neither conflict nor count a warp; an idle phase takes none
    mask = lane < 8
    c = _access(lane * 128, 4, 1, mask)
    assert (c[P.WAVEFRONTS], c[P.CONFLICTS], c[P.SHARED_LD]) == (8, 7, 1)
    c = _access(lane * 16, 4, 4, mask)
    assert (c[P.WAVEFRONTS], c[P.CONFLICTS]) == (1, 0)


def test_vectors_wider_than_16_bytes_are_several_instructions():
    lane = np.arange(32)
    c = _access(lane * 32, 4, 8)  # 32 bytes a thread: two 128-bit loads
    assert c[P.SHARED_LD] == 2
    # each: quarter-warp lanes 32 bytes apart cover 256 bytes: 2 wavefronts
    assert (c[P.WAVEFRONTS], c[P.CONFLICTS]) == (16, 8)


@pytest.mark.parametrize("text, n", [
    ("mov.u32 $0, %laneid;", 1),
    ("{\n.reg .pred p;\nsetp.ne.b32 p, $1, 0;\n@p bar.sync 1, 128;\n}", 2),
    ("wgmma.fence.sync.aligned;", 1),
    ("", 1),
])
def test_ptx_instruction_count(text, n):
    assert P.ptx_instructions(text) == n


def test_checker_and_profiler_together():
    """profile() runs the synchronization checker too: a racy kernel raises."""
    from tests.emulate.race_kernels import commit_before_tma_store

    racy, clean = commit_before_tma_store(True), commit_before_tma_store(False)
    with pytest.raises(emu.RaceError):
        emu.profile(racy.fn, *racy.args)
    p = emu.profile(clean.fn, *clean.args)
    np.testing.assert_array_equal(p.outputs[0], clean.ref(*clean.args)[0])
    assert p[P.SHARED_ST] > 0


def test_test_kit_fixture_profiles(smalti_emulate):
    k = H.transpose(True)
    p = smalti_emulate(k.fn, *k.args, profile=True)
    assert isinstance(p, emu.Profile)
    np.testing.assert_array_equal(p.outputs[0], k.want(*k.args))
    assert p[P.CONFLICTS] == 0 and p[P.SHARED_LD] == 32 * H.WARPS


def test_table_names_every_nonzero_counter():
    k = H.transpose(False)
    p = emu.profile(k.fn, *k.args)
    text = str(p)
    for name, v in p.counters.items():
        if v:
            assert name in text and f"{v:,d}" in text
    assert "by line" in text
    assert set(itertools.chain.from_iterable(p.by_line.values())) <= set(p.counters)


def test_distributed_shared_memory_bytes():
    """Reads of a peer's SMEM (ld.shared::cluster) and st.async into it: each
    block of the cluster moves its whole block once."""
    from tests.emulate.test_cluster import cluster_barrier_kernel, exchange_kernel

    x = np.random.default_rng(1).standard_normal((2, 128)).astype(np.float32)
    p = emu.profile(cluster_barrier_kernel(), x)  # 2 blocks read the peer's (128,) f32
    assert p[P.DSMEM_BYTES + "ld"] == x.nbytes and p[P.DSMEM_BYTES + "st"] == 0
    x = np.random.default_rng(2).standard_normal((3, 2, 64, 64)).astype(np.float16)
    p = emu.profile(exchange_kernel(), x)  # 3 clusters of 2: a (64, 64) block each way
    assert p[P.DSMEM_BYTES + "st"] == x.nbytes
    np.testing.assert_array_equal(p.outputs[0], x[:, ::-1])


def _op(name, *types_):
    from smalti.emulate import irtypes

    ts = [irtypes.parse(t) for t in types_]
    return types.SimpleNamespace(name=name, loc='loc("k.py":3:1)', out_types=ts[:1],
                                 in_types=ts[1:])


@pytest.mark.parametrize("name, types_, n", [
    ("arith.addf", ("f32", "f32", "f32"), 1),
    ("arith.addf", ("vector<2xf32>", "vector<2xf32>", "vector<2xf32>"), 2),
    ("arith.addf", ("vector<2xbf16>", "vector<2xbf16>", "vector<2xbf16>"), 1),  # packed
    ("arith.truncf", ("vector<2xbf16>", "vector<2xf32>"), 2),
    ("vector.load", ("vector<8xf32>",), 2),  # 32 bytes: two 16-byte loads
    ("vector.extract", ("f32", "vector<2xf32>"), 0),
    ("arith.constant", ("i32",), 0),
])
def test_issue_counts(name, types_, n):
    assert P.issue_count(_op(name, *types_)) == n


def test_instructions_count_warps_and_threads_of_a_partial_mask():
    """An op issues once per warp with an active thread; thread-instructions
    count the active threads."""
    executed = []
    step = P.counting(lambda fr: executed.append(fr), _op("arith.addf", "f32", "f32", "f32"))
    prof = P.Profiler()
    lane = np.arange(128)
    for mask in (None, lane < 40, (lane % 32) == 0, lane < 0):
        fr = types.SimpleNamespace(T=128, mask=mask, prof=prof)
        step(fr)
    c = prof.lines["k.py:3"]
    # all 4 warps and 128 threads; warps 0, 1 (40 threads); 4 warps, 1 thread each; none
    assert c[P.INST] == 4 + 2 + 4 + 0
    assert c[P.THREAD_INST] == 128 + 40 + 4 + 0
    assert len(executed) == 4  # the step itself always runs


SPREAD = ["ws_emit_pipeline", "tma_gather4_swizzle128", "grid_and_scf_if",
          "layout_cast_wgmma_transposed_f16", "lane_semantics_divergent_if"]


@pytest.mark.parametrize("name", SPREAD)
def test_profiling_changes_no_output(name):
    """Warp-specialized pipelines, TMA gathers, grids with divergence, layout
    casts, Lane-semantics kernels: profiled, each computes what run computes."""
    from tests.emulate.kernels import cases

    (case,) = [c for c in cases() if c.name == name]
    want = emu.run(case.fn, *case.args, arch=case.arch)
    p = emu.profile(case.fn, *case.args, arch=case.arch)
    for got, w in zip(p.outputs, want, strict=True):
        np.testing.assert_array_equal(got, w)
    assert p[P.INST] > 0
    assert_by_line_sums(p)


@pytest.mark.parametrize("n", [2, 4])
def test_multicast_tma_bytes(n):
    """Each of n blocks loads 1/n of the tile and multicasts it: every block's
    SMEM receives the whole tile, n transfers of 1/n for each of n blocks."""
    from tests.emulate.test_cluster import multicast_kernel

    x = np.random.default_rng(3).standard_normal((64, 64)).astype(np.float16)
    p = emu.profile(multicast_kernel(n), x)
    assert p[P.TMA_LOAD] == n * x.nbytes
    assert p[P.TMA_INST] == n * n
