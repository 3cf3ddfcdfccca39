"""``red.async...mbarrier::complete_tx::bytes`` (:mod:`smalti.emulate.ops.atomics`):
in a cluster of two blocks, every thread reduces a value into its word of the
peer's SMEM, completing the bytes on the peer's mbarrier, as jax's
``store_tiled_async(atomic=...)`` does -- every op/type pair the PTX ISA
allows, on edge values, against numpy; and the checker both ways."""

from __future__ import annotations

import re

import numpy as np
import pytest

from smalti.emulate.errors import Unsupported
from smalti.emulate.ops.atomics import RED_ASYNC_FORMS, RED_ASYNC_PREFIX
from smalti.emulate.sync.reports import RaceError

from .harness import covers, int_edges, run
from .test_ptx import cluster_launch, form, side

T = 32
EXPECT_CLUSTER = "mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64 _, [$0], $1;"
SYNC = side("barrier.cluster.arrive.release.aligned;") + "\n" + \
    side("barrier.cluster.wait.acquire.aligned;")


def _text(op: str, ty: str) -> str:
    return f"{RED_ASYNC_PREFIX}.{op}.{ty} [$0], $1, [$2];"


def _kernel(op: str, ty: str, init_sync: str = SYNC, wait: bool = True) -> str:
    """Each block: its barrier initialized, a cluster sync; word t of SMEM
    (at 64) := init[rank, t]; ``init_sync``;
    thread t reduces val[rank, t] into word t of the peer's SMEM; wait for
    the own barrier; out[rank, t] := word t."""
    bits = 64 if ty == "u64" else 32
    it, nbytes = f"i{bits}", T * bits // 8
    waiting = "nvvm.mbarrier.try_wait.parity %smem, %z, %z : !llvm.ptr<3>, i32, i32" if wait else ""
    return f"""
      %nbytes = llvm.mlir.constant({nbytes} : i32) : i32
      {side("@$2 mbarrier.init.shared::cta.b64 [$0], $1;", "l,r,b", ("%smem", "!llvm.ptr<3>"),
            ("%one", "i32"), ("%first", "i1"))}
      {SYNC}
      %i = arith.index_cast %t : i32 to index
      %rk = arith.index_cast %rank : i32 to index
      %init = memref.load %inits[%rk, %i] : memref<2x{T}x{it}>
      %val = memref.load %vals[%rk, %i] : memref<2x{T}x{it}>
      %w0 = llvm.getelementptr %smem[64] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8
      %w = llvm.getelementptr %w0[%t] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, {it}
      llvm.store %init, %w : {it}, !llvm.ptr<3>
      {init_sync}
      %own = nvvm.mapa %smem, %rank : !llvm.ptr<3> -> !llvm.ptr<7>
      {side("@$2 " + EXPECT_CLUSTER, "l,r,b", ("%own", "!llvm.ptr<7>"), ("%nbytes", "i32"),
            ("%first", "i1"))}
      %wp = nvvm.mapa %w, %peer : !llvm.ptr<3> -> !llvm.ptr<7>
      %bp = nvvm.mapa %smem, %peer : !llvm.ptr<3> -> !llvm.ptr<7>
      {side(_text(op, ty), "l,r,l" if bits == 32 else "l,l,l", ("%wp", "!llvm.ptr<7>"),
            ("%val", it), ("%bp", "!llvm.ptr<7>"))}
      {waiting}
      %got = llvm.load %w : !llvm.ptr<3> -> {it}
      memref.store %got, %out[%rk, %i] : memref<2x{T}x{it}>
      {SYNC}"""


def _inputs(ty: str) -> tuple[np.ndarray, np.ndarray]:
    dt = {"u32": np.uint32, "s32": np.int32, "b32": np.uint32, "u64": np.uint64}[ty]
    edges = np.array(int_edges("i64" if ty == "u64" else "i32"), np.int64)
    edges = edges.astype(np.uint64 if ty == "u64" else np.int64)
    k = np.arange(2 * T)
    inits = edges[k % edges.size].astype(dt).reshape(2, T)
    vals = edges[(k * 7 + 3) % edges.size].astype(dt).reshape(2, T)
    return inits, vals


def _run(op: str, ty: str, **kw) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    inits, vals = _inputs(ty)
    it = "i64" if ty == "u64" else "i32"
    storage = inits.view(np.int64 if ty == "u64" else np.int32)
    got = run(cluster_launch(_kernel(op, ty, **kw), smem=64 + T * 8),
              {"inits": (f"memref<2x{T}x{it}>", storage),
               "vals": (f"memref<2x{T}x{it}>", vals.view(storage.dtype)),
               "out": (f"memref<2x{T}x{it}>", np.zeros_like(storage))}, host=True, sanitize=True)
    return inits, vals, got["out"].view(inits.dtype)


def _reference(op: str, old: np.ndarray, v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        if op == "add":
            return old + v
        if op == "inc":
            return np.where(old >= v, 0, old + 1).astype(old.dtype)
        if op == "dec":
            return np.where((old == 0) | (old > v), v, old - 1).astype(old.dtype)
        return {"min": np.minimum, "max": np.maximum, "and": np.bitwise_and,
                "or": np.bitwise_or, "xor": np.bitwise_xor}[op](old, v)


FORMS = sorted(RED_ASYNC_FORMS)


@covers(form(_text("add", "u32")), form(EXPECT_CLUSTER), "nvvm.mapa")
@pytest.mark.parametrize("op,ty", FORMS)
def test_each_block_reduces_into_its_peers_words(op, ty):
    inits, vals, got = _run(op, ty)
    # block r's words hold init[r] reduced with the peer's values
    want = _reference(op, inits, vals[::-1])
    np.testing.assert_array_equal(got, want)


def test_forms_the_ptx_isa_does_not_allow_are_not_modelled():
    for op, ty in [("inc", "s32"), ("min", "b32"), ("and", "u32"), ("min", "u64")]:
        with pytest.raises(Unsupported, match=re.escape(f".{op}.{ty}")):
            _run(op, ty)


@covers(form(_text("add", "u32")))
def test_reading_the_word_without_waiting_on_the_barrier_is_a_race():
    with pytest.raises(RaceError) as e:
        _run("add", "u32", wait=False)
    text = str(e.value)
    assert "read-after-write" in text
    assert re.search(r"red\.async issued by block \(\d, 0, 0\) warpgroup 0 warp 0: "
                     r"red\.async\.relaxed.*add\.u32 at -:\d+", text)
    assert re.search(r"llvm\.load at -:\d+", text)


@covers(form(_text("or", "b32")))
def test_the_peers_initial_store_must_be_ordered_before_the_reduction():
    with pytest.raises(RaceError, match="write-after-write") as e:
        _run("or", "b32", init_sync="")
    assert "llvm.store at" in str(e.value)
