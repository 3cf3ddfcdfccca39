"""A catalogue of racy Pallas Mosaic GPU kernels and their clean twins.

Every kernel is written in Warpgroup semantics for sm_90 and is small
((64, 64) f32 or f16 blocks). Twins are built by one function with a
``racy`` flag: the racy kernel leaves out (or misplaces) exactly one
synchronization step; the clean one has it and computes ``ref``'s answer.

A racy entry names a race the emulator must report: its kind (in execution
order: ``first`` is the earlier access), its memory space, the agents that
make the two accesses, and the source lines of both. The lines are marked in
this file with trailing comments ``# first: MARK`` and ``# second: MARK``
and found by tokenizing this file (:data:`MARKS`), so edits never invalidate
them.

When the two accesses come from agents that nothing orders (two warpgroups,
two blocks, a peer block's copy), which one executes first is the
schedule's choice; such entries set ``either_order`` and also accept the
mirror image (first and second swapped, read-after-write read as
write-after-read).

One judgement call is recorded here rather than hidden: a consumer's
generic-proxy SMEM read, released through an mbarrier that the producer
waits on before its TMA load refills the buffer, is treated as ordered (no
``commit_smem`` needed), as CUTLASS's TMA pipelines and jax's own
``emit_pipeline_warp_specialized`` assume
(``producer_refills_slot_after_consumer_release``). Every other clean twin
is clean under the stricter reading too.
"""

from __future__ import annotations

import re
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
S = jax.ShapeDtypeStruct
F32, F16 = jnp.float32, jnp.float16
RNG = np.random.default_rng(2026)

RAW, WAR, WAW = "read-after-write", "write-after-read", "write-after-write"
MIRROR = {RAW: WAR, WAR: RAW, WAW: WAW}
# Agents of an access: a warpgroup's own threads, or an asynchronous unit.
THREAD, TMA, WGMMA = "thread", "TMA", "WGMMA"


def _scan_marks(path: Path) -> dict[tuple[str, str], int]:
    """(role, mark) -> line number of every ``# first: MARK`` / ``# second:
    MARK`` comment in ``path`` (real comments, found by the tokenizer); a mark
    given twice for one role is an error."""
    marks: dict[tuple[str, str], int] = {}
    with tokenize.open(path) as source:
        for token in tokenize.generate_tokens(source.readline):
            if token.type != tokenize.COMMENT:
                continue
            number = token.start[0]
            for role, mark in re.findall(r"\b(first|second):\s*([\w-]+)", token.string):
                if (role, mark) in marks:
                    raise ValueError(f"{path.name}: '# {role}: {mark}' on lines "
                                     f"{marks[role, mark]} and {number}")
                marks[role, mark] = number
    return marks


MARKS = _scan_marks(Path(__file__))


@dataclass(frozen=True)
class ExpectedRace:
    kind: str  # RAW, WAR or WAW
    space: str  # "smem" or "gmem"
    mark: str  # the marker comments on the lines of the two accesses
    agents: tuple[str | None, str | None]  # THREAD, TMA, WGMMA; None: not checked
    either_order: bool = False  # the two accesses are unordered across agents

    @property
    def first_line(self) -> int:
        return MARKS["first", self.mark]

    @property
    def second_line(self) -> int:
        return MARKS["second", self.mark]

    def accepted(self) -> list[tuple[str, int, int, tuple[str | None, str | None]]]:
        """(kind, first line, second line, agents) of every report naming this race."""
        seen = [(self.kind, self.first_line, self.second_line, self.agents)]
        if self.either_order:
            seen.append((MIRROR[self.kind], self.second_line, self.first_line,
                         self.agents[::-1]))
        return seen


@dataclass(frozen=True)
class Entry:
    name: str
    rule: str  # the letter of the rule in the catalogue's brief, or a few words
    fn: Callable  # a plgpu.kernel
    args: tuple  # numpy inputs
    race: ExpectedRace | None  # None: the kernel is clean
    ref: Callable | None = None  # clean only: the outputs (a tuple) from the inputs
    rtol: float = 0.0  # clean only: 0 means bit-exact

    @property
    def verdict(self) -> str:
        return "clean" if self.race is None else "race"


def K(body, out, scratch=(), **kw):
    return plgpu.kernel(body, out_type=out, scratch_types=scratch, compiler_params=WG, **kw)


def normal(shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def swizzled(shape, dtype=F16):
    cols = 128 // np.dtype(dtype).itemsize
    return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, cols)),
                                                plgpu.SwizzleTransform(128)))


def f32(v) -> np.float32:
    return np.float32(v)


def twin(racy: bool, racy_name: str, clean_name: str, rule: str, fn, args, race, ref,
         rtol=0.0) -> Entry:
    """The racy or the clean entry of a twin pair, as ``racy`` says."""
    if racy:
        return Entry(racy_name, rule, fn, args, race)
    return Entry(clean_name, rule, fn, args, None, ref, rtol)


BLOCK = (64, 64)
SMEM = plgpu.SMEM(BLOCK, F32)
CLUSTER = dict(cluster=(2,), cluster_names=("c",))


# (a) registers -> SMEM -> TMA store: the generic-proxy writes must be fenced
# (commit_smem) before the TMA, in the async proxy, reads them.
def commit_before_tma_store(racy: bool) -> Entry:
    def body(x_gmem, o_gmem, smem):
        smem[...] = x_gmem[...] * 2  # first: no-commit
        if not racy:
            plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, o_gmem)  # second: no-commit
        plgpu.wait_smem_to_gmem(0)
    return twin(racy, "tma_store_without_commit_smem", "tma_store_after_commit_smem", "a",
                K(body, S(BLOCK, F32), [SMEM]), (normal(BLOCK),),
                ExpectedRace(RAW, "smem", "no-commit", (THREAD, TMA)),
                lambda x: (x * f32(2),))


# (a) across warpgroups: the writing warpgroup must fence its writes before
# it hands the buffer to the warpgroup that stores it with TMA.
def commit_before_handing_over_to_tma(racy: bool) -> Entry:
    def body(o_gmem, smem, written):
        wg = lax.axis_index("wg")

        @pl.when(wg == 1)
        def _writer():
            smem[...] = jnp.full(BLOCK, 5.0, F32)  # first: handover
            if not racy:
                plgpu.commit_smem()
            plgpu.barrier_arrive(written)

        @pl.when(wg == 0)
        def _storer():
            plgpu.barrier_wait(written)
            plgpu.copy_smem_to_gmem(smem, o_gmem)  # second: handover
            plgpu.wait_smem_to_gmem(0)
    fn = K(body, S(BLOCK, F32), [SMEM, plgpu.Barrier()], num_threads=2, thread_name="wg")
    return twin(racy, "warpgroup_hands_smem_to_tma_without_commit",
                "warpgroup_hands_smem_to_tma_after_commit", "a", fn, (),
                ExpectedRace(RAW, "smem", "handover", (THREAD, TMA)),
                lambda: (np.full(BLOCK, 5, np.float32),))


# (b) a TMA store's SMEM source may only be overwritten once the store has
# read it (wait_smem_to_gmem).
def overwrite_tma_store_source(racy: bool) -> Entry:
    def body(x_gmem, o1_gmem, o2_gmem, smem):
        smem[...] = x_gmem[...] * 2
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, o1_gmem)  # first: store-src
        if not racy:
            plgpu.wait_smem_to_gmem(0)
        smem[...] = x_gmem[...] * 3  # second: store-src
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, o2_gmem)
        plgpu.wait_smem_to_gmem(0)
    return twin(racy, "tma_store_source_overwritten_before_wait",
                "tma_store_source_overwritten_after_wait", "b",
                K(body, (S(BLOCK, F32), S(BLOCK, F32)), [SMEM]), (normal(BLOCK),),
                ExpectedRace(WAR, "smem", "store-src", (TMA, THREAD)),
                lambda x: (x * f32(2), x * f32(3)))


# (c) a TMA load's destination may only be read once its barrier completed.
def read_tma_load_destination(racy: bool) -> Entry:
    def body(x_gmem, o_gmem, smem, bar):
        plgpu.copy_gmem_to_smem(x_gmem, smem, bar)  # first: load-dst
        if not racy:
            plgpu.barrier_wait(bar)
        o_gmem[...] = smem[...] + 1  # second: load-dst
        if racy:
            plgpu.barrier_wait(bar)
    return twin(racy, "tma_load_read_before_barrier_wait", "tma_load_read_after_barrier_wait",
                "c", K(body, S(BLOCK, F32), [SMEM, plgpu.Barrier()]), (normal(BLOCK),),
                ExpectedRace(RAW, "smem", "load-dst", (TMA, THREAD)),
                lambda x: (x + f32(1),))


# (d) wait_smem_to_gmem(0, wait_read_only=True) waits for a store's SMEM
# reads, not its GMEM writes: the source may be reused ...
def reuse_source_after_read_only_wait() -> Entry:
    def body(x_gmem, o1_gmem, o2_gmem, smem):
        smem[...] = x_gmem[...] * 2
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, o1_gmem)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        smem[...] = x_gmem[...] * 3
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, o2_gmem)
        plgpu.wait_smem_to_gmem(0)
    return Entry("tma_store_source_overwritten_after_read_only_wait", "d",
                 K(body, (S(BLOCK, F32), S(BLOCK, F32)), [SMEM]), (normal(BLOCK),), None,
                 lambda x: (x * f32(2), x * f32(3)))


# (d) ... but the GMEM destination may not be read back yet.
def read_tma_store_destination(racy: bool) -> Entry:
    def body(x_gmem, o_gmem, copy_gmem, smem):
        smem[...] = x_gmem[...] * 2
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, o_gmem)  # first: store-dst
        plgpu.wait_smem_to_gmem(0, wait_read_only=racy)
        copy_gmem[...] = o_gmem[...] + 1  # second: store-dst
    return twin(racy, "gmem_read_after_read_only_wait", "gmem_read_after_full_wait", "d",
                K(body, (S(BLOCK, F32), S(BLOCK, F32)), [SMEM]), (normal(BLOCK),),
                ExpectedRace(RAW, "gmem", "store-dst", (TMA, THREAD)),
                lambda x: (x * f32(2), x * f32(2) + f32(1)))


# (e) wait_smem_to_gmem(1) leaves the newest store in flight: only the older
# store's source is free.
def wait_for_one_of_two_stores(racy: bool) -> Entry:
    def body(x_gmem, o_old, o_new, o_again, older, newer):
        older[...] = x_gmem[...] * 2
        newer[...] = x_gmem[...] * 3
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(older, o_old)
        plgpu.copy_smem_to_gmem(newer, o_new)  # first: one-group
        plgpu.wait_smem_to_gmem(1)
        reused = newer if racy else older
        reused[...] = x_gmem[...] * 4  # second: one-group
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(reused, o_again)
        plgpu.wait_smem_to_gmem(0)
    return twin(racy, "wait_one_group_then_overwrite_newer_source",
                "wait_one_group_then_overwrite_older_source", "e",
                K(body, (S(BLOCK, F32),) * 3, [SMEM, SMEM]), (normal(BLOCK),),
                ExpectedRace(WAR, "smem", "one-group", (TMA, THREAD)),
                lambda x: (x * f32(2), x * f32(3), x * f32(4)))


# (f) two TMA stores in flight are unordered: overlapping destinations need
# a wait between them.
def overlapping_tma_stores(racy: bool) -> Entry:
    def body(x_gmem, o_gmem, lo, hi):
        lo[...] = x_gmem[...] * 2
        hi[...] = x_gmem[...] * 3
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(lo, o_gmem.at[pl.ds(0, 64)])  # first: overlap
        if not racy:
            plgpu.wait_smem_to_gmem(0)
        plgpu.copy_smem_to_gmem(hi, o_gmem.at[pl.ds(32, 64)])  # second: overlap
        plgpu.wait_smem_to_gmem(0)

    def ref(x):
        out = np.empty((96, 64), np.float32)
        out[:32] = (x * f32(2))[:32]
        out[32:] = x * f32(3)
        return (out,)
    return twin(racy, "overlapping_tma_stores_without_wait", "overlapping_tma_stores_with_wait",
                "f", K(body, S((96, 64), F32), [SMEM, SMEM]), (normal(BLOCK),),
                ExpectedRace(WAW, "gmem", "overlap", (TMA, TMA)), ref)


# TMA against TMA: a TMA load into the source of a TMA store still reading it.
def tma_load_into_pending_store_source(racy: bool) -> Entry:
    def body(x_gmem, y_gmem, o1_gmem, o2_gmem, smem, bar):
        smem[...] = x_gmem[...] * 2
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, o1_gmem)  # first: tma-tma
        if not racy:
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        plgpu.copy_gmem_to_smem(y_gmem, smem, bar)  # second: tma-tma
        plgpu.barrier_wait(bar)
        o2_gmem[...] = smem[...]
        plgpu.wait_smem_to_gmem(0)
    return twin(racy, "tma_load_into_source_of_pending_tma_store",
                "tma_load_into_source_after_read_only_wait", "TMA store then TMA load",
                K(body, (S(BLOCK, F32), S(BLOCK, F32)), [SMEM, plgpu.Barrier()]),
                (normal(BLOCK), normal(BLOCK)),
                ExpectedRace(WAR, "smem", "tma-tma", (TMA, TMA)),
                lambda x, y: (x * f32(2), y))


# (g) producer/consumer warpgroups: the producer may refill the slot only
# once the consumer released it (``empty``); waiting for its own previous
# load to land is not enough. ``fence`` adds a commit_smem to the release
# (which jax's interpreter requires, see the module docstring).
def producer_refills_slot(racy: bool, fence: bool = False) -> Entry:
    def body(x_gmem, o_gmem, slot, full, empty):
        wg = lax.axis_index("wg")

        @pl.when(wg == 1)
        def _producer():
            plgpu.copy_gmem_to_smem(x_gmem.at[0], slot, full.at[0])
            plgpu.barrier_wait(full.at[0] if racy else empty)
            plgpu.copy_gmem_to_smem(x_gmem.at[1], slot, full.at[1])  # first: refill

        @pl.when(wg == 0)
        def _consumer():
            plgpu.barrier_wait(full.at[0])
            o_gmem.at[0][...] = slot[...] + 1  # second: refill
            if fence:
                plgpu.commit_smem()
            plgpu.barrier_arrive(empty)
            plgpu.barrier_wait(full.at[1])
            o_gmem.at[1][...] = slot[...] + 1

    fn = K(body, S((2, 64, 64), F32), [SMEM, plgpu.Barrier(num_barriers=2), plgpu.Barrier()],
           num_threads=2, thread_name="wg")
    clean_name = ("producer_refills_slot_after_fenced_consumer_release" if fence
                  else "producer_refills_slot_after_consumer_release")
    return twin(racy, "producer_refills_slot_without_consumer_release", clean_name, "g",
                fn, (normal((2, 64, 64)),),
                ExpectedRace(RAW, "smem", "refill", (TMA, THREAD), either_order=True),
                lambda x: (x + f32(1),))


# (h) WGMMA reads its SMEM operands asynchronously: they may be overwritten
# only after wgmma_wait.
def overwrite_wgmma_operand(racy: bool) -> Entry:
    def body(a_gmem, b_gmem, o_gmem, a2_gmem, a_smem, b_smem, bar):
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, bar.at[0])
        plgpu.copy_gmem_to_smem(b_gmem, b_smem, bar.at[1])
        plgpu.barrier_wait(bar.at[0])
        plgpu.barrier_wait(bar.at[1])

        def scope(acc_ref):
            plgpu.wgmma(acc_ref, a_smem, b_smem)  # first: wgmma
            if not racy:
                plgpu.wgmma_wait(0)
            a_smem[...] = a_smem[...] * 2  # second: wgmma
            if racy:
                plgpu.wgmma_wait(0)
            return acc_ref[...]
        o_gmem[...] = pl.run_scoped(scope, plgpu.ACC(BLOCK, F32))
        a2_gmem[...] = a_smem[...]

    fn = K(body, (S(BLOCK, F32), S(BLOCK, F16)),
           [swizzled(BLOCK), swizzled(BLOCK), plgpu.Barrier(num_barriers=2)])
    return twin(racy, "wgmma_operand_overwritten_before_wgmma_wait",
                "wgmma_operand_overwritten_after_wgmma_wait", "h", fn,
                (normal(BLOCK, np.float16), normal(BLOCK, np.float16)),
                ExpectedRace(WAR, "smem", "wgmma", (WGMMA, THREAD)),
                lambda a, b: ((a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32),
                              a * np.float16(2)),
                rtol=1e-4)  # 64 f16 products summed in f32, in any order


# (i) clusters: a block reads its peer's SMEM (distributed shared memory)
# only after a cluster barrier orders the peer's write before the read.
def read_peer_smem(racy: bool) -> Entry:
    def body(x_gmem, o_gmem, smem, ready, done):
        c = lax.axis_index("c")
        smem[...] = x_gmem[c] * 2  # first: peer-read
        if not racy:
            plgpu.barrier_arrive(ready)
            plgpu.barrier_wait(ready)
        o_gmem[c] = plgpu.cluster_ref(smem, {"c": 1 - c})[...] + 1  # second: peer-read
        plgpu.barrier_arrive(done)  # keeps each SMEM alive until the peer has read it
        plgpu.barrier_wait(done)

    fn = K(body, S((2, 128), F32), [plgpu.SMEM((128,), F32),
                                    plgpu.ClusterBarrier(collective_axes=("c",)),
                                    plgpu.ClusterBarrier(collective_axes=("c",))], **CLUSTER)
    return twin(racy, "cluster_peer_smem_read_without_cluster_barrier",
                "cluster_peer_smem_read_after_cluster_barrier", "i", fn, (normal((2, 128)),),
                ExpectedRace(RAW, "smem", "peer-read", (THREAD, THREAD), either_order=True),
                lambda x: (x[::-1] * f32(2) + f32(1),))


# (i) clusters: a block stores into its peer's SMEM (st.async, completing
# the peer's barrier); the peer may read it only after waiting on it.
def store_into_peer_smem(racy: bool) -> Entry:
    def body(x_gmem, o_gmem, x_smem, smem, loaded, stored):
        c = lax.axis_index("c")
        plgpu.copy_gmem_to_smem(x_gmem.at[c], x_smem, loaded)
        plgpu.barrier_wait(loaded)
        to_peer = dict(cluster_idx=1 - c, cluster_dim="c")
        plgpu.async_store_smem(x_smem[...], smem, stored, **to_peer)  # first: st-async
        if not racy:
            plgpu.barrier_wait(stored)
        o_gmem[c] = smem[...] + 1  # second: st-async
        if racy:
            plgpu.barrier_wait(stored)

    fn = K(body, S((2, 64, 64), F16), [swizzled(BLOCK), swizzled(BLOCK), plgpu.Barrier(),
                                       plgpu.Barrier()], **CLUSTER)
    return twin(racy, "cluster_peer_store_read_before_barrier_wait",
                "cluster_peer_store_read_after_barrier_wait", "i", fn,
                (normal((2, 64, 64), np.float16),),
                ExpectedRace(RAW, "smem", "st-async", (None, THREAD), either_order=True),
                lambda x: (x[::-1] + np.float16(1),))


# (i) clusters: a multicast TMA load issued by the peer writes this block's
# SMEM too, so the block must have finished reading the previous tile (and
# said so through a cluster barrier) before the peer multicasts the next.
def multicast_over_unread_tile(racy: bool) -> Entry:
    def body(x_gmem, o_gmem, smem, bar, released):
        c = lax.axis_index("c")
        plgpu.copy_gmem_to_smem(x_gmem.at[0], smem, bar, collective_axes="c")
        plgpu.barrier_wait(bar)
        o_gmem.at[c, 0][...] = smem[...] * (c + 1).astype(F16)  # first: multicast
        if not racy:
            plgpu.commit_smem()
            plgpu.barrier_arrive(released)
            plgpu.barrier_wait(released)
        plgpu.copy_gmem_to_smem(x_gmem.at[1], smem, bar, collective_axes="c")  # second: multicast
        plgpu.barrier_wait(bar)
        o_gmem.at[c, 1][...] = smem[...] * (c + 1).astype(F16)

    fn = K(body, S((2, 2, 64, 64), F16),
           [swizzled(BLOCK), plgpu.Barrier(), plgpu.ClusterBarrier(collective_axes=("c",))],
           **CLUSTER)
    return twin(racy, "cluster_multicast_over_tile_peer_still_reads",
                "cluster_multicast_after_cluster_barrier", "i", fn,
                (normal((2, 64, 64), np.float16),),
                ExpectedRace(WAR, "smem", "multicast", (THREAD, TMA), either_order=True),
                lambda x: (np.stack([x * np.float16(1), x * np.float16(2)]),))


# (j) two warpgroups of one block write one SMEM buffer: the same bytes
# race, disjoint halves do not (accesses are tracked per byte range).
def two_warpgroups_write_smem(racy: bool) -> Entry:
    def body(o_gmem, smem, written):
        wg = lax.axis_index("wg")
        value = jnp.full(BLOCK, 1.0, F32) * (wg + 2).astype(F32)
        if racy:
            @pl.when(wg == 0)
            def _():
                smem.at[0][...] = value  # first: same-bytes

            @pl.when(wg == 1)
            def _():
                smem.at[0][...] = value  # second: same-bytes
                smem.at[1][...] = value  # (so that the store reads no uninitialized bytes)
        else:
            smem.at[wg][...] = value
        plgpu.commit_smem()
        plgpu.barrier_arrive(written)

        @pl.when(wg == 0)
        def _():
            plgpu.barrier_wait(written)
            plgpu.copy_smem_to_gmem(smem, o_gmem)
            plgpu.wait_smem_to_gmem(0)

    fn = K(body, S((2, 64, 64), F32), [plgpu.SMEM((2, 64, 64), F32),
                                       plgpu.Barrier(num_arrivals=2)],
           num_threads=2, thread_name="wg")
    return twin(racy, "two_warpgroups_write_same_smem", "two_warpgroups_write_disjoint_halves",
                "j", fn, (),
                ExpectedRace(WAW, "smem", "same-bytes", (THREAD, THREAD), either_order=True),
                lambda: (np.stack([np.full(BLOCK, 2, np.float32),
                                   np.full(BLOCK, 3, np.float32)]),))


# Blocks of a grid run concurrently: two blocks writing the same GMEM race.
def blocks_write_gmem(racy: bool) -> Entry:
    def body(x_gmem, o_gmem):
        i = lax.axis_index("x")
        row = 0 if racy else i * 64
        o_gmem[pl.ds(row, 64)] = x_gmem[pl.ds(i * 64, 64)] + 1  # first: blocks  second: blocks
    fn = K(body, S((128, 64), F32), grid=(2,), grid_names=("x",))
    return twin(racy, "two_blocks_write_same_gmem", "two_blocks_write_own_gmem_rows",
                "grid blocks", fn, (normal((128, 64)),),
                ExpectedRace(WAW, "gmem", "blocks", (THREAD, THREAD)),
                lambda x: (x + f32(1),))


TWINS = (commit_before_tma_store, commit_before_handing_over_to_tma, overwrite_tma_store_source,
         read_tma_load_destination, read_tma_store_destination, wait_for_one_of_two_stores,
         overlapping_tma_stores, tma_load_into_pending_store_source, producer_refills_slot,
         overwrite_wgmma_operand, read_peer_smem, store_into_peer_smem,
         multicast_over_unread_tile, two_warpgroups_write_smem, blocks_write_gmem)


def entries() -> list[Entry]:
    """Every entry, each racy kernel next to its clean twin (built afresh:
    new kernel objects, new random inputs)."""
    out = []
    for build in TWINS:
        out += [build(racy=True), build(racy=False)]
    out.append(producer_refills_slot(racy=False, fence=True))
    out.append(reuse_source_after_read_only_wait())
    return out
