"""Counting what a kernel costs, as Nsight Compute would, from the emulated run.

``smalti.emulate.profile(f, *args)`` runs a kernel as ``run`` does, with a
:class:`Profiler` attached to the launch (``Launch.prof``; every block's
frames see it as ``Frame.prof``), and returns a :class:`Profile`: the
outputs, the counters summed over the launch, and the same counters per
kernel source line (``file:line``). Counting is exact for the model below:
it is computed from the addresses each thread accesses and the mask of
active threads the emulator already has -- nothing is sampled or estimated.
Counters are keyed by Nsight Compute's metric names where ncu has the
metric (ncu reports the launch's total as ``<name>.sum``), and named
``smalti__...`` where it has none.

**Instructions** (``smsp__inst_executed``: warp-level instructions). The
compiler wraps each Lane-level op's step (only when profiling) with a
counter that adds, each time the op executes, its *issue count* times the
number of warps with at least one active thread. An op's issue count is
fixed when it is compiled (:func:`issue_count`):

* 0 for ops that emit no machine instruction: constants, ``undef``/``poison``,
  aggregate and vector element moves (``llvm.insertvalue``/``extractvalue``,
  ``vector.extract``/``insert``/``splat``/``broadcast``/``shuffle``/
  ``shape_cast``/``bitcast`` and strided slices), casts between equal bits
  (bitcasts, ``unrealized_conversion_cast``), ``memref`` views (their address
  arithmetic is counted where it is spelled as ``arith``/``llvm`` ops), and
  structured control flow itself (``scf.for``/``if``/``while``/``yield``:
  branches and loop counters are not counted; the ops in their bodies are);
* loads and stores: one per 16 bytes each thread moves (``ld.v4.b32`` is
  the widest access), at least one;
* ``llvm.inline_asm``: the PTX instructions in its string (statements ending
  in ``;``, without declarations ``.reg ...;`` and braces);
* other ops on vectors: one per element, or one per two elements for
  ``arith``/``math`` ops whose floating-point types are all 16-bit (packed
  ``f16x2``/``bf16x2`` instructions);
* every other op: 1 (an ``nvvm`` intrinsic, a scalar ``arith`` op, a GEP).

``smsp__thread_inst_executed`` adds the same issue count times the active
threads instead: ``32 * smsp__inst_executed`` where no thread is masked off.
This is PTX-level counting: ptxas may fuse (``mul``+``add`` into ``fma``),
split or remove instructions, so SASS counts differ by such rewrites.

**Shared memory** (per warp and instruction, from the active threads'
addresses). SMEM is 32 banks of 4 bytes; bank = (address / 4) mod 32. An
access of ``w`` bytes per thread is served in phases: 32-bit and narrower
accesses in one phase of the whole warp, 64-bit accesses in two half-warp
phases, 128-bit accesses in four quarter-warp phases (NVIDIA's CUDA
programming guide, "Shared Memory" of compute capability 5.x and later). In
each phase with an active thread, each bank serves one distinct 4-byte word
per wavefront (threads reading the same word share it: broadcast), so the
phase takes as many wavefronts as its most-requested bank has distinct
words. ``l1tex__data_pipe_lsu_wavefronts_mem_shared`` sums them;
``l1tex__data_bank_conflicts_pipe_lsu_mem_shared`` sums the wavefronts
beyond one per phase. ``ldmatrix``/``stmatrix`` move 8 rows of 16 bytes per
8x8 matrix: one phase of eight 16-byte rows per matrix.
``smsp__inst_executed_op_shared_ld``/``_st`` count the warp-level shared
load/store instructions (``ldmatrix`` is ``smsp__inst_executed_op_ldsm``,
``stmatrix`` ``smalti__inst_executed_op_stsm``).

**Global memory.** Plain loads and stores: ``smsp__inst_executed_op_global_ld``/
``_st``, ``l1tex__t_sectors_pipe_lsu_mem_global_op_ld``/``_st`` (the distinct
32-byte sectors each warp instruction touches) and ``smalti__global_bytes_ld``/
``_st`` (the bytes the active threads move). TMA: ``smalti__tma_bytes_load``
(bytes a TMA load writes to SMEM, out-of-bounds fill included) and
``smalti__tma_bytes_store`` (bytes a TMA store writes to global memory),
``smalti__tma_instructions`` (transfers: one per issuing thread, and per
destination block of a multicast); the non-tensor bulk copies
(``cp.async.bulk``, also the TMA unit's) count with them. Accesses to
per-thread ``alloca``s (which LLVM usually promotes to registers) are not
global traffic: ``smalti__inst_executed_op_local_ld``/
``_st`` count them.

**Synchronization.** ``smalti__barrier_warps``: warps executing a block or
cluster barrier (``bar.sync``, ``barrier.sync``, ``gpu.barrier``,
``barrier.cluster``); ``smalti__mbarrier_wait_warps``: warps executing an
mbarrier ``try_wait``/``test_wait`` -- in the emulator's schedule, where
asynchronous copies complete when issued, so spinning polls of the GPU are
not counted.

**MMA.** ``smalti__wgmma_instructions`` (``wgmma.mma_async`` issued, per
warpgroup), ``smalti__mma_flops`` (2 * M * N * K of each) and
``smalti__wgmma_smem_bytes`` (operand bytes WGMMA reads from SMEM through
its descriptors, not through the LSU pipe: not in the wavefront counters).
Ampere ``mma.sync``: ``smsp__inst_executed_pipe_tensor_op_hmma``/``_imma``
(per warp; float and integer kinds), 2 * 16 * 8 * K flops each.

**Ampere cp.async** (LDGSTS): ``smsp__inst_executed_op_ldgsts`` (warp
instructions), ``l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts`` (distinct
global sectors read per instruction; src-size 0 reads none) and
``smalti__global_bytes_ldgsts`` (bytes read: the src-sizes). Its shared side
is in no shared or wavefront counter.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

import numpy as np

INST = "smsp__inst_executed"
THREAD_INST = "smsp__thread_inst_executed"
SHARED_LD, SHARED_ST = "smsp__inst_executed_op_shared_ld", "smsp__inst_executed_op_shared_st"
LDSM, STSM = "smsp__inst_executed_op_ldsm", "smalti__inst_executed_op_stsm"
WAVEFRONTS = "l1tex__data_pipe_lsu_wavefronts_mem_shared"
CONFLICTS = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared"
GLOBAL_LD, GLOBAL_ST = "smsp__inst_executed_op_global_ld", "smsp__inst_executed_op_global_st"
SECTORS = "l1tex__t_sectors_pipe_lsu_mem_global_op_"  # + ld / st
GLOBAL_BYTES = "smalti__global_bytes_"  # + ld / st
DSMEM_BYTES = "smalti__dsmem_bytes_"  # + ld / st
TMA_LOAD, TMA_STORE = "smalti__tma_bytes_load", "smalti__tma_bytes_store"
TMA_INST = "smalti__tma_instructions"
LOCAL_LD, LOCAL_ST = "smalti__inst_executed_op_local_ld", "smalti__inst_executed_op_local_st"
BARRIERS, MBAR_WAITS = "smalti__barrier_warps", "smalti__mbarrier_wait_warps"
WGMMA, FLOPS, WGMMA_SMEM = ("smalti__wgmma_instructions", "smalti__mma_flops",
                             "smalti__wgmma_smem_bytes")
LDGSTS = "smsp__inst_executed_op_ldgsts"
HMMA, IMMA = "smsp__inst_executed_pipe_tensor_op_hmma", "smsp__inst_executed_pipe_tensor_op_imma"

#: the counters every profile has (zero where nothing counted them), in table order
COUNTERS = (INST, THREAD_INST, SHARED_LD, SHARED_ST, LDSM, STSM, WAVEFRONTS, WAVEFRONTS + "_op_ld",
            WAVEFRONTS + "_op_st", CONFLICTS, CONFLICTS + "_op_ld", CONFLICTS + "_op_st",
            GLOBAL_LD, GLOBAL_ST, SECTORS + "ld", SECTORS + "st", GLOBAL_BYTES + "ld",
            GLOBAL_BYTES + "st", DSMEM_BYTES + "ld", DSMEM_BYTES + "st", TMA_LOAD, TMA_STORE,
            TMA_INST, LOCAL_LD, LOCAL_ST, BARRIERS, MBAR_WAITS, WGMMA, FLOPS, WGMMA_SMEM,
            LDGSTS, SECTORS + "ldgsts", GLOBAL_BYTES + "ldgsts", HMMA, IMMA)

# --- issue counts -------------------------------------------------------------

FREE = frozenset({
    "arith.constant", "llvm.mlir.constant", "llvm.mlir.undef", "llvm.mlir.poison",
    "llvm.mlir.zero", "llvm.mlir.addressof", "ub.poison",
    "llvm.insertvalue", "llvm.extractvalue", "builtin.unrealized_conversion_cast",
    "arith.bitcast", "llvm.bitcast", "vector.bitcast", "vector.extract", "vector.insert",
    "vector.extractelement", "vector.insertelement", "llvm.extractelement",
    "llvm.insertelement", "vector.splat", "vector.broadcast", "vector.shuffle",
    "llvm.shufflevector", "vector.shape_cast", "vector.extract_strided_slice",
    "vector.insert_strided_slice", "vector.from_elements",
    "scf.for", "scf.if", "scf.while", "scf.yield", "scf.condition", "scf.execute_region",
    "scf.index_switch", "gpu.launch",
})
FREE_PREFIXES = ("memref.subview", "memref.reinterpret_cast", "memref.collapse_shape",
                 "memref.expand_shape", "memref.cast", "memref.view", "memref.transpose",
                 "memref.extract_", "memref.get_global", "memref.assume_alignment",
                 "memref.memory_space_cast", "memref.dim")
LOADS = frozenset({"llvm.load", "vector.load", "memref.load"})
STORES = frozenset({"llvm.store", "vector.store", "memref.store"})
BARRIER_OPS = frozenset({"gpu.barrier", "nvvm.barrier", "nvvm.barrier0",
                         "nvvm.cluster.arrive", "nvvm.cluster.arrive.relaxed",
                         "nvvm.cluster.wait"})
_BARRIER_PTX = re.compile(r"\b(bar|barrier)\.(sync|arrive|cluster)")
_MBAR_WAIT = re.compile(r"mbarrier\.(try_wait|test_wait)")
_STATEMENT = re.compile(r"[^;]*;")


def ptx_instructions(text: str) -> int:
    """PTX instructions in an inline-asm string: statements ending in ``;``,
    less declarations (``.reg .b32 r;``) and labels; at least one."""
    n = 0
    for s in _STATEMENT.findall(text):
        s = s.strip().strip("{}").strip()
        if s and not s.startswith(".") and not s.endswith(":"):
            n += 1
    return max(n, 1)


def _elements(t) -> int:
    return int(np.prod(t.shape)) if t.kind == "vector" else 1


def issue_count(o) -> int:
    """Warp-level instructions one execution of ``o`` (an :class:`..compiler.Op`)
    issues per warp; the rules are the module docstring's."""
    name = o.name
    if name in FREE or name.startswith(FREE_PREFIXES):
        return 0
    if name == "llvm.inline_asm":
        return ptx_instructions(_asm_text(o))
    if name in LOADS or name in STORES:
        t = o.out_types[0] if name in LOADS else o.in_types[0]
        if t.kind == "array":
            return 1
        nbytes = _elements(t) * (t.dtype.itemsize if t.kind in ("scalar", "vector") else 8)
        return max(1, -(-nbytes // 16))
    types = [t for t in o.out_types + o.in_types if t.kind in ("scalar", "vector")]
    n = max((_elements(t) for t in types), default=1)
    if n <= 1:
        return 1
    floats = [t for t in types if t.is_float]
    if name.startswith(("arith.", "math.")) and floats and all(t.bits == 16 for t in floats):
        return -(-n // 2)
    return n


def _asm_text(o) -> str:
    from jax._src.lib.mlir import ir

    return ir.StringAttr(o.attr("asm_string")).value


def _event(o) -> str | None:
    """The synchronization counter an execution of ``o`` adds to, if any."""
    if o.name in BARRIER_OPS:
        return BARRIERS
    if "mbarrier.try_wait" in o.name or "mbarrier.test_wait" in o.name:
        return MBAR_WAITS
    if o.name == "llvm.inline_asm":
        text = _asm_text(o)
        if _MBAR_WAIT.search(text):
            return MBAR_WAITS
        if _BARRIER_PTX.search(text):
            return BARRIERS
    return None


def active(fr) -> tuple[int, int]:
    """(warps with an active thread, active threads) of ``fr``."""
    m = fr.mask
    if m is None:
        return -(-fr.T // 32), fr.T
    m = np.asarray(m, bool).reshape(-1)
    return _warps(m), int(m.sum())


def counting(step: Callable, o) -> Callable:
    """``step``, counting its op's instructions (and barrier waits) in the
    frame's profiler first; ``step`` itself where the op issues nothing."""
    n = issue_count(o)
    event = _event(o)
    if n == 0 and event is None:
        return step
    from .sync.reports import source_line

    line = source_line(o.loc)

    def counted(fr) -> None:
        p = fr.prof
        if p is not None:
            w, t = active(fr)
            if w:
                c = p.line(line)
                c[INST] += n * w
                c[THREAD_INST] += n * t
                if event is not None:
                    c[event] += w
        step(fr)
    if hasattr(step, "accumulators"):
        counted.accumulators = step.accumulators  # type: ignore[attr-defined]
    return counted


# --- memory -------------------------------------------------------------------

def wavefronts(words: np.ndarray) -> np.ndarray:
    """Per row (one phase of one warp): the wavefronts serving the 4-byte
    words in it (-1: no word), i.e. the most distinct words any bank holds."""
    R, n = words.shape
    if n == 0 or R == 0:
        return np.zeros(R, np.int64)
    s = np.sort(words, axis=1)
    first = np.ones_like(s, bool)
    first[:, 1:] = s[:, 1:] != s[:, :-1]
    keep = first & (s >= 0)
    rows = np.broadcast_to(np.arange(R)[:, None], s.shape)
    counts = np.bincount((rows * 32 + s % 32)[keep], minlength=R * 32).reshape(R, 32)
    return counts.max(axis=1)


def _phases(width: int) -> int:
    """Phases a warp's access of ``width`` bytes per thread is split into."""
    return 1 if width <= 4 else (2 if width <= 8 else 4)


def _pad_warps(x: np.ndarray, fill) -> np.ndarray:
    pad = -x.shape[0] % 32
    if pad:
        x = np.concatenate([x, np.full((pad,) + x.shape[1:], fill, x.dtype)])
    return x


def _warps(act: np.ndarray) -> int:
    """Warps with an active thread, of a per-thread mask."""
    return int(_pad_warps(act, False).reshape(-1, 32).any(axis=1).sum())


def _sectors(start: np.ndarray, act: np.ndarray, width) -> int:
    """The distinct 32-byte sectors each warp's active threads touch with
    ``width`` bytes (per thread, or one width for all) from ``start``, summed
    over the warps (an access spans at most two sectors: 16 bytes at most,
    aligned to its size)."""
    first, last = start // 32, (start + width - 1) // 32
    secs = np.stack([first, last], 1)
    secs = np.where(act[:, None], secs, -1)
    secs = _pad_warps(secs, -1).reshape(-1, 64)
    s = np.sort(secs, axis=1)
    new = np.ones_like(s, bool)
    new[:, 1:] = s[:, 1:] != s[:, :-1]
    return int((new & (s >= 0)).sum())


def _local(fr, a: np.ndarray, act: np.ndarray) -> bool:
    """Whether global addresses ``a`` lie in a per-thread ``alloca``."""
    first = int(a[np.argmax(act), 0])
    region = fr.mem["global"].find(first, first + 1, "")
    return not region.tracked and "alloca" in region.name


def _key(line: str) -> str:
    """A line key: ``file:line``, or ``<primitive>`` for ops the location of
    which names no source line (jax's own code around the kernel body)."""
    if line.startswith("loc("):
        from .sync.reports import primitive_name

        name = primitive_name(line)
        return f"<{name}>" if name else line
    return line


class Profiler:
    """The observer the emulator calls while profiling: counters by source line."""

    def __init__(self) -> None:
        self.lines: dict[str, Counter] = {}

    def line(self, line: str) -> Counter:
        c = self.lines.get(line)
        if c is None:
            c = self.lines[line] = Counter()
        return c

    def access(self, fr, space: str, addrs, vrank: int, itemsize: int, is_write: bool,
               site, mask=None, by_warp: bool = False) -> None:
        """Threads of ``fr`` (the active ones, or ``mask``: per thread) access the
        elements at ``addrs`` (per thread ``(T, *v)`` or the same in each ``v``,
        ``vrank`` trailing dims, contiguous); ``by_warp``: an ``ldmatrix``/
        ``stmatrix``, ``addrs`` (warps, matrices, 8 rows, 8 halves)."""
        c = self.line(site.location)
        a = np.asarray(addrs, np.int64)
        if by_warp:
            self._matrices(c, fr, a, is_write)
            return
        if a.ndim == vrank:
            a = np.broadcast_to(a, (fr.T,) + a.shape)
        a = a.reshape(fr.T, -1)
        m = fr.mask if mask is None else mask
        act = np.ones(fr.T, bool) if m is None else np.asarray(m, bool).reshape(fr.T, -1)[:, 0]
        if not act.any():
            return
        nbytes = a.shape[1] * itemsize
        width = min(16, nbytes)
        per = max(1, width // itemsize)
        op = "st" if is_write else "ld"
        if space == "global" and _local(fr, a, act):
            c[LOCAL_ST if is_write else LOCAL_LD] += _warps(act)
            return
        if space in ("shared", "global"):
            for k in range(-(-nbytes // 16)):
                chunk = a[:, k * per:(k + 1) * per]
                w = min(width, (chunk.shape[1]) * itemsize)
                if space == "shared":
                    self._shared(c, chunk[:, 0], act, w, op)
                else:
                    self._global(c, chunk[:, 0], act, w, op)
        elif space == "cluster":
            c[DSMEM_BYTES + op] += int(act.sum()) * nbytes
        if space == "global":
            c[GLOBAL_BYTES + op] += int(act.sum()) * nbytes

    def _shared(self, c: Counter, start: np.ndarray, act: np.ndarray, width: int, op: str) -> None:
        """One shared instruction: each active thread's ``width`` bytes at ``start``."""
        P = _phases(width)
        nw = max(1, -(-width // 4))
        words = start[:, None] // 4 + np.arange(nw)  # (T, nw)
        words = np.where(act[:, None], words, -1)
        words = _pad_warps(words, -1).reshape(-1, P, (32 // P) * nw).reshape(-1, (32 // P) * nw)
        self._wavefronts(c, words, op)
        c[SHARED_ST if op == "st" else SHARED_LD] += _warps(act)

    def _wavefronts(self, c: Counter, words: np.ndarray, op: str) -> None:
        wf = wavefronts(words)
        phases = int((wf > 0).sum())
        total = int(wf.sum())
        c[WAVEFRONTS] += total
        c[WAVEFRONTS + "_op_" + op] += total
        c[CONFLICTS] += total - phases
        c[CONFLICTS + "_op_" + op] += total - phases

    def _matrices(self, c: Counter, fr, rows: np.ndarray, is_write: bool) -> None:
        W, num = rows.shape[:2]
        act = np.ones(W, bool) if fr.mask is None else \
            np.asarray(fr.mask).reshape(W, 32).any(axis=1)
        start = rows[..., 0]  # (W, num, 8): each row's first byte
        words = start[..., None] // 4 + np.arange(4)  # a row is 16 bytes: 4 words
        words = np.where(act[:, None, None, None], words, -1).reshape(W * num, 32)
        self._wavefronts(c, words, "st" if is_write else "ld")
        c[STSM if is_write else LDSM] += int(act.sum())

    def _global(self, c: Counter, start: np.ndarray, act: np.ndarray, width, op: str) -> None:
        """One global instruction: 32-byte sectors per warp (``width``: bytes
        per thread, or per thread's array)."""
        c[SECTORS + op] += _sectors(start, act, width)
        c[GLOBAL_ST if op == "st" else GLOBAL_LD] += _warps(act)

    def cp_async(self, where: str, start: np.ndarray, nbytes: np.ndarray,
                 act: np.ndarray) -> None:
        """One Ampere ``cp.async`` (LDGSTS): each active thread copies its
        ``nbytes`` (its src-size: 0 reads nothing and zero-fills) from global
        memory at ``start`` to shared memory."""
        from .sync.reports import source_line

        c = self.line(source_line(where))
        c[LDGSTS] += _warps(act)
        reads = act & (nbytes > 0)
        c[SECTORS + "ldgsts"] += _sectors(start, reads, np.maximum(nbytes, 1))
        c[GLOBAL_BYTES + "ldgsts"] += int(nbytes[reads].sum())

    def mma_sync(self, where: str, warps: int, k: int, integer: bool) -> None:
        """``warps`` warps each issue one ``mma.sync`` of a (16, k) by (k, 8) product."""
        from .sync.reports import source_line

        c = self.line(source_line(where))
        c[IMMA if integer else HMMA] += warps
        c[FLOPS] += warps * 2 * 16 * 8 * k

    def tma(self, where: str, nbytes: int, store: bool) -> None:
        """A TMA transfer of ``nbytes`` (to SMEM, or with ``store`` to global)."""
        from .sync.reports import source_line

        c = self.line(source_line(where))
        c[TMA_STORE if store else TMA_LOAD] += int(nbytes)
        c[TMA_INST] += 1

    def mma(self, where: str, m: int, n: int, k: int, smem_bytes: int) -> None:
        """One warpgroup MMA of an (m, k) by (k, n) product."""
        from .sync.reports import source_line

        c = self.line(source_line(where))
        c[WGMMA] += 1
        c[FLOPS] += 2 * m * n * k
        c[WGMMA_SMEM] += int(smem_bytes)


class Profile:
    """What :func:`smalti.emulate.profile` returns: ``outputs`` (the kernel's,
    as ``run`` returns them), ``counters`` (summed over the launch) and
    ``by_line`` (``file:line`` -> counters of the ops from that line; lines
    that counted nothing are left out)."""

    def __init__(self, outputs: tuple, profiler: Profiler) -> None:
        self.outputs = outputs
        lines: dict[str, Counter] = {}
        total: Counter = Counter()
        for line, c in profiler.lines.items():
            lines.setdefault(_key(line), Counter()).update(c)
            total.update(c)
        self.by_line: dict[str, dict[str, int]] = {
            line: {k: int(v) for k, v in c.items() if v}
            for line, c in sorted(lines.items()) if any(c.values())}
        self.counters: dict[str, int] = {k: int(total.get(k, 0)) for k in COUNTERS}
        self.counters.update({k: int(v) for k, v in total.items() if k not in self.counters})

    def __getitem__(self, name: str) -> int:
        return self.counters[name]

    def __str__(self) -> str:
        rows = [(k, v) for k, v in self.counters.items() if v]
        width = max((len(k) for k, _ in rows), default=10)
        out = ["counter".ljust(width) + "  " + "total".rjust(12)]
        out += [k.ljust(width) + "  " + f"{v:12,d}" for k, v in rows]
        cols = [k for k in (INST, SHARED_LD, SHARED_ST, WAVEFRONTS, CONFLICTS, GLOBAL_LD,
                            GLOBAL_ST, TMA_LOAD, TMA_STORE, FLOPS) if self.counters[k]]
        if self.by_line and cols:
            short = {INST: "inst", SHARED_LD: "lds", SHARED_ST: "sts", WAVEFRONTS: "wavefronts",
                     CONFLICTS: "conflicts", GLOBAL_LD: "ldg", GLOBAL_ST: "stg",
                     TMA_LOAD: "tma_ld_B", TMA_STORE: "tma_st_B", FLOPS: "mma_flops"}
            lw = max(len(_short_line(line)) for line in self.by_line)
            out += ["", "by line".ljust(lw) + "".join(short[k].rjust(12) for k in cols)]
            for line, c in self.by_line.items():
                out.append(_short_line(line).ljust(lw)
                           + "".join(f"{c.get(k, 0):12,d}" for k in cols))
        return "\n".join(out)

    def __repr__(self) -> str:
        return f"Profile({len(self.outputs)} outputs, {len(self.by_line)} lines)"


def _short_line(line: str) -> str:
    """``file:line`` with the file's directories dropped, for the table."""
    path, _, n = line.rpartition(":")
    return f"{path.rsplit('/', 1)[-1]}:{n}" if path else line

