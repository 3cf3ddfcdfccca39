"""A grid's clusters on several processes, with the sequential run's results.

Blocks of different clusters interact only through GMEM, and the checker
orders none of their accesses: two clusters that touch disjoint GMEM bytes
(or only read the same ones) compute the same whichever runs first, and
find the same races among their own accesses. So a launch runs its
clusters -- in CUDA's order, numbered 0 to n-1 -- like this:

1. The parent (this process) runs cluster 0 and times it. If what the
   other processes would save on the rest (``t0 * (n - 1) * (1 - 1/k)``
   with ``k`` processes) does not pay for starting and feeding them (a
   worker's start-up when none is running yet, compiling the module in
   each), the rest runs here, one cluster after another, as without workers.
2. Else the rest is cut into ``k`` consecutive shares: the parent runs the
   first, each of ``k - 1`` workers (:mod:`.pool`, :mod:`.worker`) one of
   the others, on its own copy of memory: the worker re-parses the module's
   text, runs the host code again on the same inputs and launches only its
   share. Each sends back what it wrote to GMEM, which GMEM bytes it wrote
   and read (from the checker's shadow, which sees every GMEM access), the
   checker's reports, each tagged with the cluster it was first found in,
   and its error, if any, with the cluster it stopped in.
3. The parent looks for a *conflict*: a GMEM byte one process wrote and
   another touched. With none, every process ran its clusters exactly as
   the sequential run would have (nothing it read was written elsewhere,
   nothing it wrote is seen elsewhere), so the parent copies in each
   worker's written bytes and takes in the reports in cluster order -- the
   order the sequential checker found them in, so the same races in the
   same order, counts added. A worker's error is raised as it was (class,
   message, attributes), the earliest cluster's, with the reports found
   before it. With a conflict (a cross-worker race, or a worker that
   died), the workers' results are dropped and the parent, whose state is
   the sequential run's after its own share, runs the remaining clusters
   itself: the result, reports and errors are then the sequential run's
   because it *is* the sequential run. A worker past the deadline (it gets
   what is left of the caller's) stops the run, as the parent does.

Only where the clusters' order cannot show (:func:`sequential_reason`):
one ``gpu.launch``; no atomics, strong loads or acquire/release fences (on
GMEM, semaphores between blocks; the scan does not tell the spaces apart,
so SMEM atomics keep a grid here too), no TMA reductions (their float sums depend on the order), no
cluster launch control (it cancels clusters not yet started), no clocks (one
counter per launch), no ``gpu.printf`` (its output is in launch order).
Without the checker (``sanitize=False``) nothing records which bytes a
worker touched, so a conflict could not be seen: such runs stay sequential,
and so does :func:`smalti.emulate.profile`. ``last_run`` says what the last
launch did (for tests and the benchmark). Known difference: a per-thread
``llvm.alloca`` in GMEM gets its address from a counter every earlier block
advanced, so an error that prints such an address can name another one.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .deadline import DeadlineExceeded, remaining
from .deadline import check as check_deadline

ENV = "SMALTI_EMULATE_WORKERS"
# A worker's start (a fresh interpreter importing jax and smalti, then its first
# job): 0.93-1.06 s measured on the 2-core development machine at load 1-2;
# counted double. A started worker's job costs some 5 ms beyond its own work.
START_S = 2.0

# ops, PTX and intrinsics whose effect depends on the order blocks run in
_ORDERED_OPS = re.compile(r"atomic|cmpxchg|clusterlaunchcontrol|globaltimer|clock|printf|"
                          r"bulk\.tensor\.reduce")
_ORDERED_PTX = re.compile(r"\b(red|atom|multimem)\.|\bld\.(relaxed|acquire|volatile)|"
                          r"\bst\.(relaxed|release|volatile)|fence\.(sc|acq_rel|acquire|release)|"
                          r"membar\.|clusterlaunchcontrol|cp\.reduce|globaltimer|%clock|"
                          r"nanosleep|vprintf|atomic")

last_run: dict[str, Any] = {}


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def resolve(workers: int | str | None) -> int:
    """The number of processes ``workers`` asks for (``None``: the
    environment variable's, else ``"auto"``: the cores this process may use)."""
    from smalti.diagnostics import SmaltiValueError

    given: Any = workers if workers is not None else os.environ.get(ENV, "auto")
    where = f"workers={workers!r}" if workers is not None else f"{ENV}={given!r}"
    count: Any = given
    if isinstance(given, str):
        text = given.strip().lower()
        if text == "auto":
            return cores()
        try:
            count = int(text)
        except ValueError:
            count = None
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise SmaltiValueError(
            "SM303", f"{where}: the emulator's worker count must be a whole number of "
            "processes, at least 1, or 'auto'", values={"given": repr(given)},
            fix=["1 runs the grid in this process; 'auto' (the default) uses every core",
                 f"unset {ENV}, or set it to a number such as 2"])
    return count


def sequential_reason(module: Any) -> str | None:
    """Why a module's clusters must run one after another, or ``None``."""
    launches = 0
    found: list[str] = []

    def walk(op: Any) -> None:
        nonlocal launches
        for region in op.regions:
            for block in region.blocks:
                for o in block.operations:
                    o = o.operation
                    name = o.name
                    launches += name == "gpu.launch"
                    if _ORDERED_OPS.search(name):
                        found.append(f"{name} at {o.location}")
                    for attr in ("asm_string", "intrin"):
                        if attr in o.attributes and _ORDERED_PTX.search(str(o.attributes[attr])):
                            found.append(f"{name} {o.attributes[attr]} at {o.location}")
                    walk(o)
    walk(module.operation)
    if launches != 1:
        return f"{launches} gpu.launch ops (one is run in parallel)"
    if found:
        return f"the order of the blocks is observable: {found[0]}"
    return None


@dataclass
class Job:
    """What a worker runs: the module, the run's inputs, its clusters."""

    text: str
    inputs: list
    outputs: list
    aliases: dict | None
    on_uninitialized: str
    clusters: list[tuple[int, tuple[int, int, int]]]  # (index in the order, first block)
    seconds: float | None  # the deadline left
    warp_split: frozenset[int] = frozenset()  # the program's (..sched.WarpSplit)


@dataclass
class Reply:
    """A worker's results (see the module docstring)."""

    races: list  # (key, Race, cluster index)
    uninitialized: list  # (key, packed UninitializedRead, cluster index)
    touched: list  # per tracked GMEM region: (written bits, read bits, written bytes)
    error: tuple | None  # (cluster index, packed exception)
    seconds: float


@dataclass
class Share:
    """A worker's part of the grid; tags each report with its cluster."""

    clusters: list
    current: int = -1
    tags: dict = field(default_factory=dict)

    def begin(self, index: int, sync: Any) -> None:
        self.close(sync)
        self.current = index

    def close(self, sync: Any) -> None:
        """Tags the reports not yet tagged: found in the current cluster."""
        if sync is None:
            return
        for key in (*sync.races, *sync.uninitialized):
            self.tags.setdefault(key, self.current)


def touched(launch: Any) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per tracked GMEM region (kernel arguments, scratch), in address order:
    the bytes written and read (bit-packed) and the written bytes' values."""
    out = []
    for r in launch.memory["global"].regions:
        if not r.tracked:
            continue
        written = np.zeros(r.data.size, bool)
        read = np.zeros(r.data.size, bool)
        sh = r.shadow
        if sh is not None:
            n = min(sh.write.size * sh.gran, r.data.size)
            written[:n] = np.repeat(sh.write != 0, sh.gran)[:n]
            seen = (sh.read[:len(sh.columns)] != 0).any(0)
            if sh.earlier is not None:
                seen |= sh.earlier != 0
            read[:n] = np.repeat(seen, sh.gran)[:n]
        out.append((np.packbits(written), np.packbits(read), r.data[written].copy()))
    return out


def conflict(parts: list[list]) -> bool:
    """Whether a GMEM byte one process wrote was touched by another."""
    for per_region in zip(*parts):
        size = per_region[0][0].size * 8
        writers = np.zeros(size, np.uint16)  # processes, per byte
        touchers = np.zeros(size, np.uint16)
        for w, r, _ in per_region:
            wb = np.unpackbits(w).astype(bool)
            writers += wb
            touchers += wb | np.unpackbits(r).astype(bool)
        if ((writers > 0) & (touchers > 1)).any():
            return True
    return False


def plan(program: Any, count: int, inputs: Sequence, outputs: list,
         aliases: Any, on_uninitialized: str) -> Parallel | None:
    """The parallel plan of one run, or ``None`` where it must be sequential."""
    if not program.sanitize:
        last_run.update(mode="sequential: no checker (sanitize=False)")
        return None
    reason = program.sequential_reason
    if reason is not None:
        last_run.update(mode=f"sequential: {reason}")
        return None
    return Parallel(program, count, [np.asarray(a) for a in inputs], outputs,
                    dict(aliases) if aliases else None, on_uninitialized)


@dataclass
class Parallel:
    """One launch's parallel run (the module docstring's steps): the program,
    how many processes, and what a worker needs to run it again."""

    program: Any
    count: int
    inputs: list
    outputs: list
    aliases: dict | None
    on_uninitialized: str

    def worth(self, t0: float, rest: int, k: int) -> bool:
        from .pool import POOL

        saved = t0 * rest * (1 - 1 / k)
        cost = (START_S if POOL.warm(k - 1) < k - 1 else 0.0) + 2 * self.program.compile_s
        return saved > cost + 0.1

    def run(self, order: list, run_one: Callable[[Any], None], launch: Any, where: str) -> None:
        """Runs every cluster of ``order`` (first blocks' ids) by ``run_one``,
        here or in workers, leaving ``launch`` as the sequential run would."""
        from .pool import POOL, gather, unpack_error

        def here(indices: range) -> None:
            for i in indices:
                check_deadline(where)
                run_one(order[i])

        n = len(order)
        last_run.update(clusters=n, workers=1, mode="sequential: one cluster")
        if n == 0:
            return
        start = time.perf_counter()
        here(range(1))
        t0 = time.perf_counter() - start
        k = min(self.count, n - 1)
        if k < 2 or not self.worth(t0, n - 1, k):
            last_run.update(mode="sequential: too little work to share", first_s=t0)
            here(range(1, n))
            return
        cuts = [1 + (n - 1) * j // k for j in range(k + 1)]
        last_run.update(workers=k, first_s=t0, mode="shared: running",
                        shares=[hi - lo for lo, hi in zip(cuts, cuts[1:])])
        workers = POOL.take(k - 1)
        text = self.program.text
        for w, lo, hi in zip(workers, cuts[1:], cuts[2:]):
            w.submit(Job(text, self.inputs, self.outputs, self.aliases, self.on_uninitialized,
                         [(i, order[i]) for i in range(lo, hi)], remaining(),
                         self.program.warp_split))
        try:
            here(range(1, cuts[1]))
            replies = gather(workers, lambda: check_deadline(where))
        finally:
            POOL.give_back(workers)
        for r in replies:  # the deadline is everyone's: stop
            if not isinstance(r, BaseException) and r.error is not None and issubclass(
                    r.error[1][0], DeadlineExceeded):
                raise unpack_error(r.error[1])
        if any(isinstance(r, BaseException) for r in replies) or any(
                r.error is not None and r.error[0] < 0 for r in replies):
            last_run.update(mode="fallback: a worker failed before its clusters")
            here(range(cuts[1], n))
            return
        if conflict([touched(launch)] + [r.touched for r in replies]):
            last_run.update(mode="fallback: a GMEM conflict between processes")
            here(range(cuts[1], n))
            return
        last_run.update(mode="parallel", worker_s=[r.seconds for r in replies])
        self.merge(replies, launch)

    def merge(self, replies: list[Reply], launch: Any) -> None:
        """Takes in the workers' reports (up to the earliest error) and
        memory; raises that error."""
        from .pool import unpack_error

        errors = [r.error for r in replies if r.error is not None]
        limit = min(e[0] for e in errors) if errors else None
        sync = launch.sync
        for r in replies:
            for key, race, index in r.races:
                if limit is None or index <= limit:
                    sync.absorb_race(key, race)
            for key, report, index in r.uninitialized:
                if limit is None or index <= limit:
                    sync.absorb_uninitialized(key, unpack_error(report))
        if errors:
            raise unpack_error(next(e[1] for e in errors if e[0] == limit))
        regions = [r for r in launch.memory["global"].regions if r.tracked]
        for r in replies:
            for region, (w, _, values) in zip(regions, r.touched):
                region.data[np.unpackbits(w, count=region.data.size).astype(bool)] = values
