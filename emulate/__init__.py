"""Run the Lane-level Mosaic GPU IR a kernel lowers to, on the CPU.

``run(f, *args)`` lowers ``f`` (a jax function whose body is one Mosaic GPU
kernel call) for CUDA on the CPU with whatever pipeline is installed -- jax's
own, or smalti's inside ``smalti.jax.installed()`` -- captures the module
Mosaic GPU's Python pipeline finished with (:mod:`.capture`), and executes it:

* **Compilation.** The module is compiled once into Python closures
  (:mod:`.compiler`), one per op, by per-dialect rules (:mod:`.ops`).
* **Host code** (kernel-argument unpacking, TMA descriptor set-up through
  ``mosaic_gpu_init_tma_desc``) runs once.
* **The launch** runs every cluster of the grid in turn (without a cluster,
  every block); the blocks of a cluster run together, each with its own
  SMEM, reachable from its peers through ``mapa``'s shared::cluster
  addresses (st.async, remote mbarrier arrivals, multicast TMA,
  ``barrier.cluster``). Within a warpgroup
  all threads execute in lockstep, vectorized: a register is a numpy array
  with a leading thread axis (or without it when it is the same in every
  thread). Divergent ``scf.if`` and ``scf.index_switch`` run each branch
  under a mask of active threads, divergent loops each thread's own
  iterations; stores, mbarrier arrivals and copies honour the mask and the
  ops' predicates. A block of several warpgroups (or a cluster of several
  blocks) runs each warpgroup as a coroutine (:mod:`.sched`) that switches
  where it waits, so warp-specialized
  producer/consumer kernels run.
* **Memory** (:mod:`.memory`) is byte arrays: global buffers for the inputs
  and outputs, SMEM per block, addresses exactly as the IR computes them;
  sub-byte types bit-packed as on the GPU (:mod:`.subbyte`).
  TMA copies (:mod:`.tma`) read their descriptors and apply box, swizzle and
  out-of-bounds rules; mbarriers count arrivals and transaction bytes.
* **Ordering.** Every op completes before the next starts and asynchronous
  copies and WGMMAs complete when issued; mbarrier waits and barriers block
  a warpgroup until other warpgroups complete them (a wait nothing can
  complete raises :class:`Deadlock`, naming what each warpgroup waits for).
* **Synchronization** (:mod:`.sync`). Beside the run, a checker follows the
  PTX memory model with vector clocks -- asynchronous units as agents,
  fences, async-group waits, mbarrier phases and barriers as the only
  ordering -- and reports races (:class:`RaceError`), uninitialized SMEM
  reads, out-of-bounds accesses, barrier divergence and over-arrivals,
  whatever the schedule.
* **Numbers.** Integer ops are exact two's complement; f32/f16/bf16 + - * /
  round as IEEE (as PTX's ``.rn`` ops do; a ``mul``/``add`` pair that ptxas
  contracts into an ``fma`` may differ by 1 ulp); ``math`` functions and
  ``*.approx`` PTX are computed in float64 and rounded once -- see
  :mod:`.ops.math` and :mod:`.ops.inline_asm` for the hardware's documented
  distance from that.

* **Cost** (:mod:`.profiling`). ``profile(f, *args)`` runs as ``run`` does and
  counts what Nsight Compute would -- warp-level instructions, shared-memory
  wavefronts and bank conflicts, global and TMA bytes, barrier waits, MMA
  work -- exactly, from the addresses and active threads, per source line.

WGMMA (:mod:`.ops.wgmma`) reads its SMEM matrix descriptors and register
fragments as the PTX ISA documents them. Anything not modelled -- an op, an
inline-PTX string, an intrinsic (tcgen05 included), a memory space -- raises
:class:`Unsupported` naming it and its location, when execution reaches it.
The emulator never guesses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .errors import EmulationError, Unsupported
from .profiling import Profile
from .sync.reports import (
    Access,
    BarrierDivergence,
    Deadlock,
    MBarrierOverArrival,
    OutOfBounds,
    Race,
    RaceError,
    RaceWarning,
    UninitializedRead,
    UninitializedReadWarning,
    check_policy,
)

__all__ = ["run", "run_module", "profile", "Profile", "lower", "modelled_ptx", "on_cpu",
           "set_on_cpu", "Unsupported", "EmulationError", "Race",
           "Access",
           "RaceError", "RaceWarning", "UninitializedRead", "UninitializedReadWarning",
           "OutOfBounds", "BarrierDivergence", "MBarrierOverArrival", "Deadlock"]

ON_RACE_ENV = "SMALTI_EMULATE_ON_RACE"
ON_UNINITIALIZED_ENV = "SMALTI_EMULATE_ON_UNINITIALIZED"


def modelled_ptx() -> list[tuple[str, str]]:
    """The inline-PTX forms the emulator models: (form, description) pairs,
    an exact instruction or a family's pattern (``docs/emulator.md`` lists them)."""
    from .ops.inline_asm import modelled_ptx as table

    return table()


def _policies(on_race: str | None, on_uninitialized: str | None) -> tuple[str, str]:
    import os

    race = on_race if on_race is not None else os.environ.get(ON_RACE_ENV, "raise")
    uninit = (on_uninitialized if on_uninitialized is not None
              else os.environ.get(ON_UNINITIALIZED_ENV, "warn"))
    return check_policy("on_race", race), check_policy("on_uninitialized", uninit)


def lower(f: Callable, *args: np.ndarray, arch: tuple[int, int] = (9, 0)) -> tuple[Any, list]:
    """Lowers ``f`` for CUDA on the CPU; returns (the Lane-level module, the
    output avals)."""
    module, out_avals, _ = _lower_one(f, args, arch)
    return module, out_avals


def _lower_one(f: Callable, args: Sequence[np.ndarray], arch: tuple[int, int]):
    """(module, output avals, its :class:`.capture.KernelCall` or None) of a
    function of exactly one kernel."""
    from .capture import lower_calls

    modules, out_avals, calls = lower_calls(f, args, arch)
    if len(modules) != 1:
        raise Unsupported(f"a function lowering to {len(modules)} Mosaic GPU kernels "
                          "(exactly one is modelled)")
    return modules[0], out_avals, calls[0]


def _buffers(call, args: Sequence[np.ndarray], out_avals: list):
    """(inputs, outputs, aliases, how many outputs are ``f``'s) to run the
    kernel of ``call`` on ``f``'s ``args``. Where Pallas added operands (GMEM
    scratch: semaphores), they are made here -- zeroed, as Pallas makes
    them -- and every buffer of the call is given, so none is guessed from
    the module (a scratch the kernel never touches has no type there)."""
    inputs = [np.asarray(a) for a in args]
    outs = [(tuple(a.shape), np.dtype(a.dtype)) for a in out_avals]
    if call is None or len(call.avals_in) == len(args):
        return inputs, outs, None, len(outs)
    mine = [(tuple(a.shape), np.dtype(a.dtype)) for a in call.avals_in[:len(args)]]
    theirs = [(tuple(a.shape), a.dtype) for a in inputs]
    results = [(tuple(a.shape), np.dtype(a.dtype)) for a in call.avals_out]
    if len(call.avals_in) < len(args) or mine != theirs or results[:len(outs)] != outs:
        raise Unsupported(f"a function whose arguments {theirs} and results {outs} are not "
                          f"the first operands {mine} and results {results[:len(outs)]} of its "
                          "kernel call (run a function that only calls the kernel, or use "
                          "smalti.emulate.on_cpu)")
    extra = [np.zeros(tuple(a.shape), np.dtype(a.dtype)) for a in call.avals_in[len(args):]]
    return inputs + extra, results, call.aliases, len(outs)


def run(f: Callable, *args: np.ndarray, arch: tuple[int, int] = (9, 0),
        on_race: str | None = None, on_uninitialized: str | None = None,
        sanitize: bool = True, workers: int | str | None = None) -> tuple[np.ndarray, ...]:
    """Emulates ``f(*args)``, a jax function whose body is one Mosaic GPU kernel
    call, and returns the kernel's outputs as numpy arrays.

    The synchronization checker runs beside it (``sanitize=False``: off).
    ``on_race``: ``"raise"`` (default; :class:`RaceError` listing every race
    found), ``"warn"`` (a :class:`RaceWarning` per race) or ``"ignore"``;
    ``on_uninitialized`` likewise for reads of SMEM nothing wrote
    (:class:`UninitializedRead`; default ``"warn"``). The environment
    variables ``SMALTI_EMULATE_ON_RACE`` and ``SMALTI_EMULATE_ON_UNINITIALIZED``
    set the defaults. ``workers``: how many processes may share a grid's
    clusters (default ``SMALTI_EMULATE_WORKERS``, else ``"auto"``: the
    cores; ``1``: this process only) -- the results are the same either way
    (:mod:`smalti.emulate.workers`)."""
    from .runner import run_module as _run
    from .workers import resolve

    race, uninit = _policies(on_race, on_uninitialized)
    count = resolve(workers)
    module, out_avals, call = _lower_one(f, args, arch)
    inputs, outs, aliases, keep = _buffers(call, args, out_avals)
    return _run(module, inputs, outs, aliases=aliases, on_race=race, on_uninitialized=uninit,
                sanitize=sanitize, workers=count)[:keep]


def profile(f: Callable, *args: np.ndarray, arch: tuple[int, int] = (9, 0),
            on_race: str | None = None, on_uninitialized: str | None = None,
            sanitize: bool = True) -> Profile:
    """Runs ``f(*args)`` as :func:`run` does and counts what it costs, as
    Nsight Compute would: a :class:`Profile` with ``outputs``, ``counters``
    (ncu metric names where ncu has the metric, ``smalti__...`` otherwise)
    and ``by_line`` (the counters per kernel source ``file:line``);
    ``str(profile)`` is a table. How each counter is counted:
    :mod:`smalti.emulate.profiling`. It runs in this process only (the
    counters are not merged across worker processes)."""
    from .profiling import Profiler
    from .runner import run_module as _run

    race, uninit = _policies(on_race, on_uninitialized)
    module, out_avals, call = _lower_one(f, args, arch)
    inputs, outs, aliases, keep = _buffers(call, args, out_avals)
    p = Profiler()
    outputs = _run(module, inputs, outs, aliases=aliases, on_race=race,
                   on_uninitialized=uninit, sanitize=sanitize, profiler=p)
    return Profile(outputs[:keep], p)


def run_module(module: Any, inputs, outputs=None, *, on_race: str | None = None,
               on_uninitialized: str | None = None, sanitize: bool = True,
               workers: int | str | None = None) -> tuple[np.ndarray, ...]:
    """Runs an already lowered module; ``outputs`` lists (shape, dtype) pairs
    (by default: the kernel arguments after the inputs, as typed in the IR).
    The checker's and the workers' settings are :func:`run`'s."""
    from .runner import run_module as _run
    from .workers import resolve

    race, uninit = _policies(on_race, on_uninitialized)
    return _run(module, inputs, outputs, on_race=race, on_uninitialized=uninit,
                sanitize=sanitize, workers=resolve(workers))


def on_cpu(arch: tuple[int, int] = (9, 0), *, on_race: str | None = None,
           on_uninitialized: str | None = None, sanitize: bool = True,
           workers: int | str | None = None, **kwargs: Any):
    """A context inside which every Mosaic GPU kernel a jax program launches
    on the CPU backend runs on the emulator (:mod:`.on_cpu`); the settings
    are :func:`run`'s."""
    from .cpu_mode import on_cpu as mode

    return mode(arch, on_race=on_race, on_uninitialized=on_uninitialized, sanitize=sanitize,
                workers=workers, **kwargs)


def set_on_cpu(arch: tuple[int, int] | None = (9, 0), *, on_race: str | None = None,
               on_uninitialized: str | None = None, sanitize: bool = True,
               workers: int | str | None = None, **kwargs: Any) -> None:
    """:func:`on_cpu` process-wide; ``set_on_cpu(None)`` turns it off."""
    from .cpu_mode import set_on_cpu as set_mode

    set_mode(arch, on_race=on_race, on_uninitialized=on_uninitialized, sanitize=sanitize,
             workers=workers, **kwargs)
