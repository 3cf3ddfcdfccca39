"""``llvm.inline_asm``: the PTX strings Mosaic GPU's code generators emit,
recognised one by one (after an optional ``@$N`` predicate); any other string
raises :class:`Unsupported` naming it.

Approximate instructions (``ex2.approx``, ``lg2.approx``, ``tanh.approx``,
``sin/cos.approx``, ``rsqrt.approx``, ``sqrt.approx``) are modelled by the
exact function, rounded once; the PTX ISA bounds the hardware's distance from
it: ex2.approx.f32 2 ulp, lg2.approx.f32 2^-22 absolute/relative, sin/cos
2^-20.9 absolute in [-pi, pi], rsqrt.approx/sqrt.approx 2^-23 relative-ish
(1 ulp-ish), tanh.approx.f32 2^-10.987 relative (~2^13 ulp of f32!).
``.ftz`` flushes subnormal inputs and outputs to zero as the hardware does."""

from __future__ import annotations

import re

import numpy as np

from .. import irtypes
from ..compiler import Op, Step, rule
from ..errors import Unsupported
from ..machine import Frame, uniform
from .gpu import cluster_arrive, cluster_wait, full_block_barrier, named_barrier
from .nvvm import (bulk_commit, bulk_wait, effective, mbarrier_arrive, mbarrier_init,
                   per_thread, proxy_fence, tma_load_check, tma_store_check, wgmma_commit,
                   wgmma_wait)

F32_TINY = np.float32(np.finfo(np.float32).tiny)


def _ftz(x: np.ndarray) -> np.ndarray:
    return np.where(np.abs(x) < F32_TINY, np.zeros_like(x), x)


def _f32(fn, ftz: bool):
    def f(x):
        x = np.asarray(x, np.float32)
        if ftz:
            x = _ftz(x)
        with np.errstate(all="ignore"):
            y = np.asarray(fn(x.astype(np.float64))).astype(np.float32)
        return _ftz(y) if ftz else y
    return f


UNARY_F32 = {
    "ex2.approx": np.exp2, "lg2.approx": np.log2, "sin.approx": np.sin, "cos.approx": np.cos,
    "tanh.approx": np.tanh, "rsqrt.approx": lambda x: 1 / np.sqrt(x),
    "sqrt.approx": np.sqrt, "rcp.approx": lambda x: 1 / x,
}
PACKED_TYPES = {"f16": np.float16, "bf16": irtypes.SCALARS["bf16"]}


def _packed(fn, elem: str, n_args: int):
    """A packed (x2) or single 16-bit instruction on i32/i16 registers."""
    dt = np.dtype(PACKED_TYPES[elem])

    def f(*regs):
        xs = [np.asarray(r) for r in regs]
        width = xs[0].dtype.itemsize
        views = [np.array(x).view(np.uint16 if width == 2 else np.uint32) for x in xs]
        if width == 4:
            halves = [np.stack([v & 0xFFFF, v >> 16], -1).astype(np.uint16).view(dt) for v in views]
        else:
            halves = [v.view(dt) for v in views]
        with np.errstate(all="ignore"):
            y = np.asarray(fn(*[h.astype(np.float64) for h in halves])).astype(dt)
        if width == 4:
            u = y.view(np.uint16).astype(np.uint32)
            return (u[..., 0] | (u[..., 1] << 16)).view(np.int32)
        return y.view(np.int16)
    return f


BINARY = {"max.NaN": np.maximum, "min.NaN": np.minimum, "max": np.fmax, "min": np.fmin,
          "add": np.add, "sub": np.subtract, "mul": np.multiply}


def _prmt(a, b, c):
    a = irtypes.unsigned(np.asarray(a, np.int32)).astype(np.uint64)
    b = irtypes.unsigned(np.asarray(b, np.int32)).astype(np.uint64)
    c = irtypes.unsigned(np.asarray(c, np.int32)).astype(np.uint64)
    src = a | (b << np.uint64(32))
    out = np.zeros(np.broadcast(a, b, c).shape, np.uint64)
    for i in range(4):
        sel = (c >> np.uint64(4 * i)) & np.uint64(0xF)
        byte = (src >> ((sel & np.uint64(7)) * np.uint64(8))) & np.uint64(0xFF)
        sign = np.where(byte & np.uint64(0x80), np.uint64(0xFF), np.uint64(0))
        byte = np.where(sel & np.uint64(8), sign, byte)
        out = out | (byte << np.uint64(8 * i))
    return out.astype(np.uint32).view(np.int32)


def _pure(o: Op, fn) -> Step:
    ins, out = o.ins, o.outs[0]
    if o.out_types[0].kind not in ("scalar", "vector"):
        raise o.unsupported(f"inline asm returning {o.out_types[0].text}")

    def step(fr: Frame) -> None:
        fr.regs[out] = fn(*[fr.regs[i] for i in ins])
    return step


def _value_instr(o: Op, opcode: str, n_in: int) -> Step | None:
    parts = opcode.split(".")
    base = ".".join(parts[:2]) if len(parts) > 1 and parts[1] in ("approx", "NaN") else parts[0]
    ftz = "ftz" in parts
    ty = parts[-1]
    if base in UNARY_F32 and n_in == 1:
        if ty == "f32":
            return _pure(o, _f32(UNARY_F32[base], ftz))
        if ty in ("f16", "f16x2", "bf16", "bf16x2") and base == "tanh.approx":
            return _pure(o, _packed(np.tanh, ty.removesuffix("x2"), 1))
        return None
    if base == "abs" and n_in == 1 and ty == "f32":  # exact (abs.ftz flushes subnormals)
        return _pure(o, _f32(np.abs, ftz))
    if base == "abs" and n_in == 1 and ty in ("f16", "f16x2", "bf16", "bf16x2"):
        return _pure(o, _packed(np.abs, ty.removesuffix("x2"), 1))
    if base in BINARY and n_in == 2:
        fn = BINARY[base]
        if ty == "f32":
            return _pure(o, lambda a, b: fn(np.asarray(a, np.float32), np.asarray(b, np.float32))
                         .astype(np.float32))
        if ty in ("f16", "f16x2", "bf16", "bf16x2"):
            return _pure(o, _packed(fn, ty.removesuffix("x2"), 2))
        return None
    if opcode == "prmt.b32" and n_in == 3:
        return _pure(o, _prmt)
    return None


ASM_ARG = re.compile(r"\$(\d+)")


def _parse(text: str) -> tuple[str | None, bool, str, list[str]]:
    """(predicate operand, negated, opcode, args) of a one-instruction string."""
    s = " ".join(text.replace("\n", " ").split()).strip()
    if s.count(";") != 1 or not s.endswith(";") or s.startswith("{"):
        return None, False, "", []
    s = s[:-1].strip()
    pred, neg = None, False
    m = re.match(r"@(!?)\$(\d+)\s+(.*)", s)
    if m:
        neg, pred, s = m.group(1) == "!", m.group(2), m.group(3)
    opcode, _, rest = s.partition(" ")
    args = [a.strip() for a in rest.split(",")] if rest.strip() else []
    return pred, neg, opcode, args


@rule("llvm.inline_asm")
def inline_asm(o: Op) -> Step:
    from jax._src.lib.mlir import ir
    text = ir.StringAttr(o.attr("asm_string")).value
    from . import wgmma
    if wgmma.is_wgmma(text):
        return wgmma.compile_wgmma(o, text)
    pred, neg, opcode, args = _parse(text)
    loc = o.loc
    hint = " (tcgen05 MMAs are not modelled yet)" if "tcgen05" in text else ""
    unknown = Unsupported(f"inline PTX {text!r}{hint}", loc)
    ins = o.ins
    results = [s for s, t in zip(o.outs, o.out_types) if t.kind != "none"]
    pred_slots = [ins[int(pred)]] if pred is not None else []
    if neg:
        raise unknown
    if not text.strip():  # an optimization barrier: outputs tied to inputs, no code
        cons = ir.StringAttr(o.attr("constraints")).value.split(",")
        ins_c = [c for c in cons if not c.startswith("=") and not c.startswith("~")]
        if len(ins_c) != len(ins) or any(not c.isdigit() for c in ins_c):
            raise unknown
        ties = {int(c): k for k, c in enumerate(ins_c)}
        n_out = sum(1 for c in cons if c.startswith("="))
        if sorted(ties) != list(range(n_out)) or len(results) != 1:
            raise unknown

        def barrier(fr: Frame) -> None:
            vals = [fr.regs[ins[ties[j]]] for j in range(n_out)]
            if n_out == 1:
                fr.regs[o.outs[0]] = vals[0]
            else:
                fr.regs[o.outs[0]] = tuple(vals)
        return barrier

    def arg_slot(a: str) -> int:
        m = ASM_ARG.fullmatch(a.strip("[]{} "))
        if not m:
            raise unknown
        k = int(m.group(1)) - len(results)
        return ins[k]

    m = REMOTE_ARRIVE.fullmatch(" ".join(text.split()))
    if m and not results:  # jax's arrival on a peer block's mbarrier (ClusterBarrier)
        p_s, a_s, r_s = (ins[int(m.group(k))] for k in (2, 3, 4))
        return lambda fr: _remote_arrive(fr, p_s, a_s, r_s, loc)
    if not opcode:
        raise unknown
    # --- value instructions: `$0` is the result -----------------------------
    if results and pred is None and args and args[0] == "$0":
        n_in = len(args) - 1
        if [f"${i}" for i in range(1, n_in + 1)] != args[1:] or n_in != len(ins):
            raise unknown
        step = _value_instr(o, opcode, n_in)
        if step is None:
            raise unknown
        return step
    # --- side effects -------------------------------------------------------------
    outs = o.outs
    site = o.site(opcode)
    if opcode in ("fence.mbarrier_init.release.cluster", "prefetch.tensormap",
                  "griddepcontrol.wait", "griddepcontrol.launch_dependents",
                  "fence.acq_rel.cta", "fence.sc.cta", "wgmma.fence.sync.aligned"
                  ) or opcode.startswith("setmaxnreg."):
        # no memory ordering the checker models (fence.acq_rel/sc.cta order a
        # thread's own accesses, which a warp's program order already does)
        def noop(fr: Frame) -> None:
            for out in outs:
                fr.regs[out] = None
        return noop
    if opcode in ("fence.proxy.async.shared::cta", "fence.proxy.async",
                  "fence.proxy.async.global") and not args:
        return proxy_fence
    if opcode == "cp.async.bulk.commit_group" and not args:
        return lambda fr: bulk_commit(fr, pred_slots)
    if opcode in ("cp.async.bulk.wait_group", "cp.async.bulk.wait_group.read") \
            and len(args) <= 1 and pred is None:
        pending = int(args[0]) if args else 0
        read_only = opcode.endswith(".read")
        return lambda fr: bulk_wait(fr, pending, read_only)
    if opcode == "wgmma.commit_group.sync.aligned" and not args:
        return wgmma_commit
    if opcode == "wgmma.wait_group.sync.aligned" and len(args) == 1:
        pending = int(args[0])
        return lambda fr: wgmma_wait(fr, pending)
    if opcode in ("bar.sync", "barrier.sync", "bar.sync.aligned", "barrier.sync.aligned"):
        if len(args) == 1 and args[0] in ("0",):
            return lambda fr: full_block_barrier(fr, text, loc)
        if len(args) not in (1, 2):
            raise unknown
        ident, count = (_literal_or_slot(a, arg_slot) for a in (args + [None])[:2])

        def bar_sync(fr: Frame) -> None:
            i = _read(fr, ident, loc)
            n = _read(fr, count, loc) if count is not None else fr.need_block(text, loc).block_T
            if i == 0 and count is None:
                return full_block_barrier(fr, text, loc)
            named_barrier(fr, i, n, text, loc)
        return bar_sync
    if opcode in ("barrier.cluster.arrive.relaxed.aligned", "barrier.cluster.arrive.aligned",
                  "barrier.cluster.arrive", "barrier.cluster.arrive.relaxed",
                  "barrier.cluster.arrive.release.aligned", "barrier.cluster.arrive.release") \
            and not args and pred is None:
        return lambda fr: cluster_arrive(fr, text, loc)
    if opcode in ("barrier.cluster.wait.aligned", "barrier.cluster.wait",
                  "barrier.cluster.wait.acquire.aligned", "barrier.cluster.wait.acquire") \
            and not args and pred is None:
        return lambda fr: cluster_wait(fr, text, loc)
    if opcode.startswith(ST_ASYNC) and len(args) >= 3:
        ty = opcode[len(ST_ASYNC):]
        vec = 1
        if ty.startswith(".v2") or ty.startswith(".v4"):
            vec, ty = int(ty[2]), ty[3:]
        width = {".b32": 4, ".u32": 4, ".s32": 4, ".f32": 4, ".b64": 8, ".u64": 8, ".s64": 8,
                 ".f64": 8}.get(ty)
        if width is None or len(args) != vec + 2:
            raise unknown
        a, bar = arg_slot(args[0]), arg_slot(args[-1])
        vals = [arg_slot(x) for x in args[1:-1]]
        return lambda fr: _st_async(fr, pred_slots, a, vals, width, bar, loc, site)
    if opcode in ("mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64",
                  "mbarrier.arrive.expect_tx.release.cta.shared::cta.b64") \
            and len(args) == 3 and args[0] == "_":
        # jax 0.12 emits the CTA-scope form for a block's own barriers
        a, tx = arg_slot(args[1]), arg_slot(args[2])
        remote = ".cluster." in opcode
        return lambda fr: mbarrier_arrive(fr, a, effective(fr, pred_slots), loc, tx_slot=tx,
                                          remote=remote)
    if opcode == "mbarrier.init.shared::cta.b64" and len(args) == 2:
        a, n = arg_slot(args[0]), arg_slot(args[1])
        return lambda fr: mbarrier_init(fr, a, n, effective(fr, pred_slots), loc)
    if opcode in ("mbarrier.arrive.release.cta.shared::cta.b64", "mbarrier.arrive.shared::cta.b64",
                  "mbarrier.arrive.shared.b64") and args and args[0] == "_":
        a = arg_slot(args[1])
        cnt = _literal_or_slot(args[2], arg_slot) if len(args) > 2 else None
        if cnt is not None and cnt[0] == "lit":
            k = cnt[1]
            return lambda fr: mbarrier_arrive(fr, a, effective(fr, pred_slots), loc, count_const=k)
        cs = cnt[1] if cnt is not None else None
        return lambda fr: mbarrier_arrive(fr, a, effective(fr, pred_slots), loc, count_slot=cs)
    if opcode == "mbarrier.complete_tx.shared::cta.b64" and len(args) == 2:
        a, n = arg_slot(args[0]), arg_slot(args[1])

        def complete_tx(fr: Frame) -> None:
            b = fr.need_block("mbarrier.complete_tx", loc)
            m = effective(fr, pred_slots)
            addrs = per_thread(fr.regs[a], fr.T)[m]
            tx = per_thread(fr.regs[n], fr.T)[m]
            rows = b.warp_rows[m]
            for ad, t, row in zip(addrs, tx, rows):
                bar = b.barrier(ad, loc)
                if fr.sync is not None:  # releases like an arrival
                    fr.sync.release(row, bar.point)
                bar.complete_tx(int(t))
        return complete_tx
    if opcode == "cp.async.bulk.shared::cta.global.mbarrier::complete_tx::bytes" and len(args) == 4:
        dst, src, n, bar = (arg_slot(a) for a in args)
        return lambda fr: _bulk_copy(fr, pred_slots, dst, "shared", src, "global", n, bar, loc,
                                     site)
    if opcode == "cp.async.bulk.global.shared::cta.bulk_group" and len(args) == 3:
        dst, src, n = (arg_slot(a) for a in args)
        return lambda fr: _bulk_copy(fr, pred_slots, dst, "global", src, "shared", n, None, loc,
                                     site)
    if (tile := TMA_TILE.fullmatch(opcode)) \
            and len(args) == int(tile[1]) + (3 if tile[2] == "shared::cta" else 2):
        return _tma_tile(tile, args, arg_slot, pred_slots, loc, site)
    if opcode == GATHER4 and len(args) == 8:  # [smem], [desc, {col, r0..r3}], [bar]
        smem, desc, col, *rows, bar = (arg_slot(a) for a in args)
        return lambda fr: _gather4(fr, pred_slots, smem, desc, col, rows, bar, loc, site)
    if opcode == SCATTER4 and len(args) == 7:  # [desc, {col, r0..r3}], [smem]
        desc, col, *rows, smem = (arg_slot(a) for a in args)
        return lambda fr: _gather4(fr, pred_slots, smem, desc, col, rows, None, loc, site)
    raise unknown



def _literal_or_slot(a, arg_slot):
    """An operand of a PTX string: ("lit", int) or ("reg", slot); None stays None."""
    if a is None:
        return None
    a = a.strip()
    if re.fullmatch(r"\d+", a):
        return ("lit", int(a))
    return ("reg", arg_slot(a))


def _read(fr: Frame, operand, where: str) -> int:
    kind, v = operand
    return v if kind == "lit" else int(uniform(fr.regs[v], fr, "a barrier operand", where))


REMOTE_ARRIVE = re.compile(
    r"\{ \.reg \.b32 (\w+); @\$(\d+) mapa\.shared::cluster\.u32 \1, \$(\d+), \$(\d+); "
    r"@\$\2 mbarrier\.arrive\.shared::cluster\.b64 _, \[\1\]; \}")


def _remote_arrive(fr: Frame, pred: int, addr: int, rank: int, where: str) -> None:
    """``mapa`` + ``mbarrier.arrive.shared::cluster``: each thread whose
    predicate holds arrives once on the barrier at its SMEM offset in the block
    of CTA rank ``rank``."""
    b = fr.need_block("mbarrier.arrive.shared::cluster", where)
    m = effective(fr, [pred])
    addrs = per_thread(fr.regs[addr], fr.T).astype(np.int64)[m]
    ranks = per_thread(fr.regs[rank], fr.T).astype(np.int64)[m]
    rows = b.warp_rows[m]
    for (a, k) in sorted(set(zip(addrs.tolist(), ranks.tolist()))):
        sel = (addrs == a) & (ranks == k)
        bar = b.peer(k, where).barrier(a, where)
        if fr.sync is not None:  # orders the arriving warps' accesses for the peer's waiters
            fr.sync.release(np.unique(rows[sel]), bar.point)
        bar.arrive(int(sel.sum()), where)


ST_ASYNC = "st.async.cluster.shared::cluster.mbarrier::complete_tx::bytes"


def _st_async(fr: Frame, pred_slots, addr: int, vals: list[int], width: int, bar: int,
              where: str, site) -> None:
    """``st.async``: each thread stores its value(s) at a shared::cluster
    address (usually another block's SMEM) and completes their bytes on the
    mbarrier at a shared::cluster address, when issued."""
    b = fr.need_block("st.async", where)
    m = effective(fr, pred_slots)
    if not m.any():
        return
    r = fr.regs
    bits = np.dtype(np.uint32 if width == 4 else np.uint64)
    addrs = per_thread(r[addr], fr.T).astype(np.int64)
    space = fr.mem["cluster"] if b.cluster.size > 1 else None
    if space is None:
        raise Unsupported("st.async outside a cluster of several blocks", where)
    for k, v in enumerate(vals):
        x = np.asarray(r[v])
        if x.dtype.itemsize != width:
            raise Unsupported(f"st.async of {width} bytes from a {x.dtype} register", where)
        x = per_thread(np.array(x).view(bits), fr.T)
        space.store(addrs + k * width, x, bits, m, where)
    bars = per_thread(r[bar], fr.T).astype(np.int64)[m]
    if fr.sync is not None:
        _st_async_check(fr, m, addrs[m], bars, len(vals), width, site, where)
    for a in np.unique(bars):
        b.remote_barrier(int(a), where).complete_tx(int((bars == a).sum()) * width * len(vals))


def _st_async_check(fr: Frame, m: np.ndarray, addrs: np.ndarray, bars: np.ndarray, n: int,
                    width: int, site, where: str) -> None:
    """The checker's view of ``st.async`` by the threads ``m``: each warp's
    stores, checked against what it knows, recorded under the transfers
    completing on the (peer's) barrier -- visible to whoever waits for that
    phase."""
    sync, b = fr.sync, fr.block
    issuing = b.warp_rows[m]
    for row in np.unique(issuing):
        row = int(row)
        for a in np.unique(bars[issuing == row]):
            sel = (issuing == row) & (bars == a)
            target = b.remote_barrier(int(a), where)
            comp = sync.barrier_component(target, b)
            target.point.stamp(comp, target.phase + 1)
            elems = (addrs[sel][:, None] + np.arange(n) * width).reshape(-1)
            agent = f"st.async issued by {sync.clocks.names[row]}"
            for space, local, _ in sync.spaces(fr, "cluster", elems):
                sync.async_access(sync.clocks.matrix[row].copy(), space, local, width, True, site,
                                  comp, target.phase + 1, agent, proxy_read=False)


GATHER4 = "cp.async.bulk.tensor.2d.shared::cta.global.tile::gather4.mbarrier::complete_tx::bytes"
SCATTER4 = "cp.async.bulk.tensor.2d.global.shared::cta.tile::scatter4.bulk_group"


#: jax 0.12's TMA tile copies, as inline PTX (0.11 emits nvvm ops): a load
#: ``[smem], [desc, {coords}], [bar]`` or a store ``[desc, {coords}], [smem]``.
TMA_TILE = re.compile(r"cp\.async\.bulk\.tensor\.([1-5])d\.(shared::cta|global)\.(?:global|shared::cta)"
                      r"(?:\.mbarrier::complete_tx::bytes|\.bulk_group)")


def _tma_tile(match: re.Match, args: list[str], arg_slot, pred_slots, where: str, site):
    """The step of a TMA tile load (``shared::cta`` destination) or store."""
    from .. import tma

    if match[2] == "shared::cta":
        smem, desc, *coords, bar = (arg_slot(a) for a in args)
    else:
        desc, *coords, smem = (arg_slot(a) for a in args)
        bar = None

    def step(fr: Frame) -> None:
        b = fr.need_block("TMA copy", where)
        for t, d, s in _tma_issuers(fr, pred_slots, desc, smem, where):
            at = [int(per_thread(fr.regs[c], fr.T)[t]) for c in coords]
            if bar is None:
                tma.store(fr, d, s, at, where, check=tma_store_check(fr, t, site))
            else:
                target = b.barrier(per_thread(fr.regs[bar], fr.T)[t], where)
                n = tma.load(fr, d, s, at, where, smem_space=b.smem,
                             check=tma_load_check(fr, t, b, target, site))
                target.complete_tx(n)
    return step


def _tma_issuers(fr: Frame, pred_slots, desc: int, smem: int, where: str):
    """Each thread issuing a TMA copy: (thread, its descriptor, its SMEM address)."""
    from .. import tma

    for t in np.flatnonzero(effective(fr, pred_slots)):
        yield (t, tma.descriptor(fr, per_thread(fr.regs[desc], fr.T)[t], where),
               int(per_thread(fr.regs[smem], fr.T)[t]))


def _gather4(fr: Frame, pred_slots, smem: int, desc: int, col: int, rows: list[int],
             bar: int | None, where: str, site) -> None:
    """TMA ``tile::gather4`` (``bar`` given) or ``tile::scatter4``, per issuing
    thread, complete when issued."""
    from .. import tma

    b = fr.need_block("tile::gather4", where)
    r = fr.regs
    for t, d, s in _tma_issuers(fr, pred_slots, desc, smem, where):
        c = int(per_thread(r[col], fr.T)[t])
        rs = [int(per_thread(r[x], fr.T)[t]) for x in rows]
        if bar is None:
            tma.scatter4(fr, d, s, c, rs, where, check=tma_store_check(fr, t, site))
        else:
            target = b.barrier(per_thread(r[bar], fr.T)[t], where)
            n = tma.gather4(fr, d, s, c, rs, where, check=tma_load_check(fr, t, b, target, site))
            target.complete_tx(n)


def _bulk_copy(fr: Frame, pred_slots, dst: int, dst_space: str, src: int, src_space: str,
               n: int, bar: int | None, where: str, site) -> None:
    """A non-tensor bulk copy of n bytes, complete when issued: a load
    completes on ``bar``, a store joins the thread's bulk async-group."""
    b = fr.need_block("cp.async.bulk", where)
    m = effective(fr, pred_slots)
    r = fr.regs
    for t in np.flatnonzero(m):
        size = int(per_thread(r[n], fr.T)[t])
        s_addr, d_addr = int(per_thread(r[src], fr.T)[t]), int(per_thread(r[dst], fr.T)[t])
        data = fr.mem[src_space].read_bytes(s_addr, size, where).copy()
        fr.mem[dst_space].write_bytes(d_addr, data, where)
        target = None if bar is None else b.barrier(per_thread(r[bar], fr.T)[t], where)
        check = (tma_store_check(fr, t, site, "TMA bulk copy") if target is None
                 else tma_load_check(fr, t, b, target, site))
        if check is not None and size:
            check(fr.mem[src_space], s_addr + np.arange(size), 1, False)
            check(fr.mem[dst_space], d_addr + np.arange(size), 1, True)
        if target is not None:
            target.complete_tx(size)
