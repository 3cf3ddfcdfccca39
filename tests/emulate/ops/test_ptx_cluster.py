"""Blackwell's cluster inline PTX, op by op as jax writes it: cluster launch
control (:mod:`smalti.emulate.ops.clc`: ``try_cancel`` multicast to the
cluster, jax's ``query_cancel`` block, the two ``fence.proxy.async::generic``
fences around the response) over a grid of clusters, and the TMA load of a
CTA pair whose bytes the leader's mbarrier tracks
(:mod:`~smalti.emulate.ops.tma_pair`) -- under the synchronization checker."""

from __future__ import annotations

import numpy as np
import pytest

from smalti.emulate import device

from .harness import assert_same_bits, covers, run
from .test_builtin import INIT, init_tma_desc, tma_inputs
from .test_ptx import cluster_launch, form, side

TRY_CANCEL = ("clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes"
              ".multicast::cluster::all.b128 [$0], [$1];")
QUERY = ("{ .reg .b128 handle; ld.shared.b128 handle, [$4]; "
         "clusterlaunchcontrol.query_cancel.is_canceled.pred.b128 $3, handle; "
         "@$3 clusterlaunchcontrol.query_cancel.get_first_ctaid.v4.b32.b128 {$0, $1, $2, _}, "
         " handle; }")
FENCE_RELEASE = "fence.proxy.async::generic.release.sync_restrict::shared::cta.cluster;"
FENCE_ACQUIRE = "fence.proxy.async::generic.acquire.sync_restrict::shared::cluster.cluster;"
PAIR_LOAD = ("{ .reg .b32 mapped_addr; @$0 mapa.shared::cluster.u32 mapped_addr, $3, 0; "
             "@$0 cp.async.bulk.tensor.2d.shared::cta.global.tile.mbarrier::complete_tx::bytes"
             ".cta_group::2 [$1], [$2, {$4,$5}], [mapped_addr]; }")
# jax 0.12's: the mbarrier mapped to CTA 0 beforehand (its own inline mapa)
PAIR_LOAD_MAPPED = ("@$0 cp.async.bulk.tensor.2d.shared::cta.global.tile.mbarrier::complete_tx"
                    "::bytes.cta_group::2 [$1], [$2, {$4,$5}], [$3];")
PAIR_MULTICAST_MAPPED = ("@$0 cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::"
                         "complete_tx::bytes.multicast::cluster.cta_group::2 [$1], [$2, {$4,$5}], "
                         "[$3], $6;")
MAPA = "mapa.shared::cluster.u32 $0, $1, $2;"
# the leader's mbarrier (%smem of CTA 0) as jax 0.12 maps it, in %barc
MAPPED_BARRIER = (f'%barc = llvm.inline_asm "{MAPA}", "=r,r,r" %smem, %z '
                  ': (!llvm.ptr<3>, i32) -> !llvm.ptr<7>')
PAIR_MULTICAST = ("{ .reg .b32 mapped_addr; @$0 mapa.shared::cluster.u32 mapped_addr, $3, 0; "
                  "@$0 cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx"
                  "::bytes.multicast::cluster.cta_group::2 [$1], [$2, {$4,$5}], [mapped_addr], "
                  "$6; }")

# each thread's word of the tile, to out[rank * 32 + t]
READ_BACK = """
      %mine = llvm.getelementptr %tile[%t] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, f32
      %v = llvm.load %mine : !llvm.ptr<3> -> f32
      %i = arith.index_cast %t : i32 to index
      %c32i = arith.constant 32 : index
      %rk = arith.index_cast %rank : i32 to index
      %base_i = arith.muli %rk, %c32i : index
      %at = arith.addi %base_i, %i : index
      memref.store %v, %out[%at] : memref<64xf32>"""

# the cluster's leader thread (thread 0 of CTA rank 0), in a kernel of :func:`cluster_launch`
LEADER = """
    %leader = arith.cmpi eq, %rank, %z : i32
    %issuer = arith.andi %first, %leader : i1"""


def pair_load(row: str, mapped: bool = False) -> str:
    """The leader's mbarrier expecting the pair's 256 bytes, a cluster
    barrier, then each CTA's TMA load of its (4, 8) box at (``row``, 8) into
    SMEM byte 128 (``%tile``), on the leader's barrier (``%bar``, its
    offset; ``mapped``: as jax 0.12 emits it, ``%barc``, its shared::cluster
    address)."""
    load = side(PAIR_LOAD_MAPPED, "b,l,l,r,r,r", ("%first", "i1"), ("%tile", "!llvm.ptr<3>"),
                ("%desc", "!llvm.ptr"), ("%barc", "!llvm.ptr<7>"), ("%col", "i32"),
                (row, "i32")) if mapped else \
        side(PAIR_LOAD, "b,l,l,r,r,r", ("%first", "i1"), ("%tile", "!llvm.ptr<3>"),
             ("%desc", "!llvm.ptr"), ("%bar", "i32"), ("%col", "i32"), (row, "i32"))
    return f"""
      %nbytes = llvm.mlir.constant(256 : i32) : i32
      %col = llvm.mlir.constant(8 : i32) : i32
      %tile = llvm.getelementptr %smem[128] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8
      %bar = llvm.ptrtoint %smem : !llvm.ptr<3> to i32
      {side("@$2 mbarrier.init.shared::cta.b64 [$0], $1;", "l,r,b", ("%smem", "!llvm.ptr<3>"),
            ("%one", "i32"), ("%issuer", "i1"))}
      {side("@$2 mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [$0], $1;", "l,r,b",
            ("%smem", "!llvm.ptr<3>"), ("%nbytes", "i32"), ("%issuer", "i1"))}
      {side("barrier.cluster.arrive.release.aligned;")}
      {side("barrier.cluster.wait.acquire.aligned;")}
      {MAPPED_BARRIER}
      {load}"""


ONE_BLOCK_AN_SM = 120 * 1024  # dynamic SMEM for which an SM holds one block


def _cancel(blocks: int, smem: int = 512) -> np.ndarray:
    """Each block of a grid of clusters of 2 (``smem`` bytes of dynamic SMEM):
    barrier (16 bytes expected), the cluster's leader thread 0 asks to
    cancel a cluster, each block waits and decodes the response; thread 0
    of block b writes (x, y, z, canceled) to out[b]."""
    body = f"""
      %nbytes = llvm.mlir.constant(16 : i32) : i32
      %resp = llvm.getelementptr %smem[16] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8
      {side("@$2 mbarrier.init.shared::cta.b64 [$0], $1;", "l,r,b", ("%smem", "!llvm.ptr<3>"),
            ("%one", "i32"), ("%first", "i1"))}
      {side("@$2 mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [$0], $1;", "l,r,b",
            ("%smem", "!llvm.ptr<3>"), ("%nbytes", "i32"), ("%first", "i1"))}
      {side(FENCE_RELEASE)}
      {side("barrier.cluster.arrive.release.aligned;")}
      {side("barrier.cluster.wait.acquire.aligned;")}
      {side("@$2 " + TRY_CANCEL, "l,l,b", ("%resp", "!llvm.ptr<3>"), ("%smem", "!llvm.ptr<3>"),
            ("%issuer", "i1"))}
      nvvm.mbarrier.try_wait.parity %smem, %z, %z : !llvm.ptr<3>, i32, i32
      {side(FENCE_ACQUIRE)}
      %q = llvm.inline_asm has_side_effects "{QUERY}", "=r,=r,=r,=b,r" %resp : (!llvm.ptr<3>) -> !llvm.struct<(i32, i32, i32, i1)>
      %qx = llvm.extractvalue %q[0] : !llvm.struct<(i32, i32, i32, i1)>
      %qy = llvm.extractvalue %q[1] : !llvm.struct<(i32, i32, i32, i1)>
      %qz = llvm.extractvalue %q[2] : !llvm.struct<(i32, i32, i32, i1)>
      %qc = llvm.extractvalue %q[3] : !llvm.struct<(i32, i32, i32, i1)>
      %qci = arith.extui %qc : i1 to i32
      scf.if %first {{
        %c0i = arith.constant 0 : index
        %c1i = arith.constant 1 : index
        %c2i = arith.constant 2 : index
        %c3i = arith.constant 3 : index
        memref.store %qx, %out[%bx, %c0i] : memref<{blocks}x4xi32>
        memref.store %qy, %out[%bx, %c1i] : memref<{blocks}x4xi32>
        memref.store %qz, %out[%bx, %c2i] : memref<{blocks}x4xi32>
        memref.store %qci, %out[%bx, %c3i] : memref<{blocks}x4xi32>
      }}"""  # noqa: E501 -- MLIR text, one op a line
    got = run(cluster_launch(LEADER + body, blocks, smem=smem),
              {"out": (f"memref<{blocks}x4xi32>", np.full((blocks, 4), -1, np.int32))},
              host=True, sanitize=True)
    return got["out"]


@covers(form(TRY_CANCEL), form(QUERY), form(FENCE_RELEASE), form(FENCE_ACQUIRE))
def test_each_running_cluster_cancels_the_next_and_both_blocks_read_its_id(monkeypatch):
    """Four clusters of 2 on a GPU that holds one (2 SMs, one block each), run
    in CUDA's order: cluster 0 cancels cluster 1 (first block (2, 0, 0)),
    then cluster 2 starts and cancels cluster 3 (block 6); the canceled
    clusters never run. Every block of a cluster decodes the same response."""
    monkeypatch.setattr(device, "NUM_SMS", 2)
    got = _cancel(8, ONE_BLOCK_AN_SM)
    none = [-1, -1, -1, -1]
    assert got.tolist() == [[2, 0, 0, 1]] * 2 + [none] * 2 + [[6, 0, 0, 1]] * 2 + [none] * 2


@covers(form(TRY_CANCEL), form(QUERY))
def test_only_clusters_waiting_for_an_sm_can_be_canceled(monkeypatch):
    """One cluster more than the GPU holds (6 SMs of one block: 3 of 4
    clusters start at once): the first cancels the waiting one (block 6) and
    the others find nothing -- what jax's test_cluster_launch_control asks."""
    monkeypatch.setattr(device, "NUM_SMS", 6)
    got = _cancel(8, ONE_BLOCK_AN_SM)
    none = [-1, -1, -1, -1]
    assert got.tolist() == [[6, 0, 0, 1]] * 2 + [[0, 0, 0, 0]] * 4 + [none] * 2


@covers(form(TRY_CANCEL), form(QUERY))
def test_a_grid_the_gpu_holds_at_once_has_nothing_to_cancel():
    """Eight small blocks on 132 SMs all start together: no cluster waits."""
    assert _cancel(8).tolist() == [[0, 0, 0, 0]] * 8


@covers(form(TRY_CANCEL), form(QUERY))
def test_with_no_cluster_left_the_response_says_not_canceled():
    got = _cancel(2)
    assert got.tolist() == [[0, 0, 0, 0]] * 2


@covers(form(PAIR_LOAD), form(PAIR_LOAD_MAPPED), form(MAPA))
def test_a_cta_pair_loads_its_boxes_on_the_leaders_barrier():
    """Each CTA of a pair loads its (4, 8) box (rows 4 rank on, columns 8 on)
    into its own SMEM, both completing on the leader's mbarrier, which
    expects the pair's 256 bytes; the leader waits, then a cluster barrier,
    and each thread reads its word: the pair holds rows 0-7 of the tensor.
    In jax 0.11.2's form and in 0.12's (the barrier mapped beforehand)."""
    x = (np.arange(8 * 16, dtype=np.float32).reshape(8, 16) - 40) * 0.5
    x[0, 8:11] = [np.inf, -0.0, np.nan]
    for mapped in (False, True):
        body = f"""
      %c4 = llvm.mlir.constant(4 : i32) : i32
      %row = llvm.mul %rank, %c4 : i32{pair_load("%row", mapped)}
      scf.if %leader {{
        nvvm.mbarrier.try_wait.parity %smem, %z, %z : !llvm.ptr<3>, i32, i32
      }}
      {side("barrier.cluster.arrive.release.aligned;")}
      {side("barrier.cluster.wait.acquire.aligned;")}
{READ_BACK}"""
        got = run(init_tma_desc() + cluster_launch(LEADER + body, smem=512),
                  {**tma_inputs(x, (4, 8)), "out": ("memref<64xf32>", np.zeros(64, np.float32))},
                  host=True, prelude=INIT, sanitize=True)
        assert_same_bits(got["out"], x[0:8, 8:16].reshape(-1))


@covers(form(PAIR_LOAD), form(PAIR_LOAD_MAPPED))
def test_a_pair_load_without_the_leaders_wait_races():
    from smalti.emulate.sync.reports import RaceError

    x = np.zeros((8, 16), np.float32)
    for mapped in (False, True):
        body = f"""{pair_load("%z", mapped)}
      %mine = llvm.getelementptr %tile[%t] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, f32
      %v = llvm.load %mine : !llvm.ptr<3> -> f32
      scf.if %leader {{
        nvvm.mbarrier.try_wait.parity %smem, %z, %z : !llvm.ptr<3>, i32, i32
      }}"""
        with pytest.raises(RaceError, match="read-after-write"):
            run(init_tma_desc() + cluster_launch(LEADER + body, smem=512), tma_inputs(x, (4, 8)),
                host=True, prelude=INIT, sanitize=True)


def test_a_pair_load_tracked_beyond_the_first_pair_is_unsupported():
    """jax 0.12's form names the tracking mbarrier by its shared::cluster
    address: one in CTA rank 2 (outside the pair of ranks 0 and 1) is
    refused."""
    from smalti.emulate.errors import Unsupported

    body = pair_load("%z", mapped=True).replace(
        '%smem, %z : (!llvm.ptr<3>, i32)', '%smem, %two : (!llvm.ptr<3>, i32)')
    body = "\n      %two = llvm.mlir.constant(2 : i32) : i32" + body
    with pytest.raises(Unsupported, match="mbarrier of CTA rank 2"):
        run(init_tma_desc() + cluster_launch(LEADER + body, smem=512, cluster=4, blocks=4),
            tma_inputs(np.zeros((8, 16), np.float32), (4, 8)), host=True, prelude=INIT,
            sanitize=True)


def pair_multicast(mask: int, leader_waits: bool, mapped: bool = False) -> str:
    """The leader's mbarrier expecting 256 bytes; the leader thread alone
    multicasts the (4, 8) box at (0, 8) into SMEM byte 128 of the CTAs in
    ``mask``, on its own barrier (``mapped``: as jax 0.12 names it); the
    leader waits (or not); a cluster barrier; each thread reads its word to
    out[rank * 32 + t]."""
    copy = side(PAIR_MULTICAST_MAPPED, "b,l,l,r,r,r,h", ("%issuer", "i1"),
                ("%tile", "!llvm.ptr<3>"), ("%desc", "!llvm.ptr"), ("%barc", "!llvm.ptr<7>"),
                ("%col", "i32"), ("%z", "i32"), ("%mask", "i16")) if mapped else \
        side(PAIR_MULTICAST, "b,l,l,r,r,r,h", ("%issuer", "i1"), ("%tile", "!llvm.ptr<3>"),
             ("%desc", "!llvm.ptr"), ("%bar", "i32"), ("%col", "i32"), ("%z", "i32"),
             ("%mask", "i16"))
    wait = """scf.if %leader {
        nvvm.mbarrier.try_wait.parity %smem, %z, %z : !llvm.ptr<3>, i32, i32
      }""" if leader_waits else ""
    return f"""
      %nbytes = llvm.mlir.constant(256 : i32) : i32
      %col = llvm.mlir.constant(8 : i32) : i32
      %mask = llvm.mlir.constant({mask} : i16) : i16
      %tile = llvm.getelementptr %smem[128] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8
      %bar = llvm.ptrtoint %smem : !llvm.ptr<3> to i32
      {side("@$2 mbarrier.init.shared::cta.b64 [$0], $1;", "l,r,b", ("%smem", "!llvm.ptr<3>"),
            ("%one", "i32"), ("%issuer", "i1"))}
      {side("@$2 mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [$0], $1;", "l,r,b",
            ("%smem", "!llvm.ptr<3>"), ("%nbytes", "i32"), ("%issuer", "i1"))}
      {side("barrier.cluster.arrive.release.aligned;")}
      {side("barrier.cluster.wait.acquire.aligned;")}
      {MAPPED_BARRIER}
      {copy}
      {wait}
      {side("barrier.cluster.arrive.release.aligned;")}
      {side("barrier.cluster.wait.acquire.aligned;")}
{READ_BACK}"""


def _multicast(x: np.ndarray, mask: int, leader_waits: bool = True,
               mapped: bool = False) -> np.ndarray:
    got = run(init_tma_desc() + cluster_launch(LEADER + pair_multicast(mask, leader_waits,
                                                                       mapped), smem=512),
              {**tma_inputs(x, (4, 8)), "out": ("memref<64xf32>", np.zeros(64, np.float32))},
              host=True, prelude=INIT, sanitize=True)
    return got["out"]


@covers(form(PAIR_MULTICAST), form(PAIR_MULTICAST_MAPPED))
def test_a_pair_multicast_lands_in_both_ctas_on_the_leaders_barrier():
    """jax's leader_tracked=REPLICATED copy: one (4, 8) box, multicast to
    both CTAs of the pair (mask 0b11), 2 x 128 bytes completing the leader's
    barrier; after the leader's wait and a cluster barrier both CTAs hold
    it. In jax 0.11.2's form and in 0.12's."""
    x = (np.arange(8 * 16, dtype=np.float32).reshape(8, 16) - 40) * 0.5
    x[1, 8:11] = [np.inf, -0.0, np.nan]
    box = x[0:4, 8:16].reshape(-1)
    for mapped in (False, True):
        assert_same_bits(_multicast(x, 0b11, mapped=mapped), np.concatenate([box, box]))


@covers(form(PAIR_MULTICAST), form(PAIR_MULTICAST_MAPPED))
def test_a_pair_multicast_read_without_the_leaders_wait_races_in_the_peer():
    from smalti.emulate.sync.reports import RaceError

    for mapped in (False, True):
        with pytest.raises(RaceError, match="read-after-write") as e:
            _multicast(np.zeros((8, 16), np.float32), 0b11, leader_waits=False, mapped=mapped)
        assert "TMA load issued by block (0, 0, 0)" in str(e.value)


@covers(form(PAIR_MULTICAST), form(PAIR_MULTICAST_MAPPED))
def test_a_pair_multicast_beyond_the_first_pair_is_unsupported():
    from smalti.emulate.errors import Unsupported

    for mapped in (False, True):
        with pytest.raises(Unsupported, match="CTA mask 0x0004"):
            _multicast(np.zeros((8, 16), np.float32), 0b100, mapped=mapped)
