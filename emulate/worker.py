"""The worker process's side of :mod:`.workers`: a loop over jobs.

:func:`serve` reads a :class:`.workers.Job` from stdin, runs it and writes
a :class:`.workers.Reply` to stdout, until stdin ends. A job is a whole
kernel run -- the module's text, re-parsed and compiled here (the last few
kept, by text), the launch's inputs, the host code run again -- in which
the launch runs only the job's clusters (:class:`.workers.Share`). The
checker runs with ``on_race="ignore"``: the parent applies the policy to
the merged reports. Reads of uninitialized SMEM are recorded, not warned
about here: the parent warns, in the sequential run's order. A worker whose
parent is gone ends itself."""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import warnings
from typing import Any

import numpy as np

from .deadline import deadline
from .pool import pack_error, receive, send
from .runner import Program
from .workers import Job, Reply, Share, touched

_KEEP = 4  # compiled modules kept


def _program(text: str, cache: dict[str, Any]) -> Program:
    prog = cache.get(text)
    if prog is None:
        from jax._src.lib.mlir import ir

        from smalti.kernels import make_context

        context = make_context()
        context.allow_unregistered_dialects = True
        prog = Program(ir.Module.parse(text, context), sanitize=True)
        if len(cache) >= _KEEP:
            cache.pop(next(iter(cache)))
        cache[text] = prog
    return prog


def run_job(job: Job, cache: dict[str, Any]) -> Reply:
    start = time.perf_counter()
    share = Share(job.clusters)
    error = None
    launch = None
    try:
        prog = _program(job.text, cache)
        prog.warp_split = job.warp_split
        with deadline(job.seconds), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the parent warns, in order
            started = prog.start(job.inputs, job.outputs, aliases=job.aliases,
                                 on_race="ignore", on_uninitialized=job.on_uninitialized)
            launch = started.launch
            launch.share = share
            try:
                prog.execute(started)
            finally:
                share.close(launch.sync)
    except Exception as e:  # sent to the parent, which raises it
        error = (share.current, pack_error(e))
    sync = launch.sync if launch is not None else None
    races = [] if sync is None else [(k, r, share.tags[k]) for k, r in sync.races.items()]
    uninit = [] if sync is None else [(k, pack_error(u), share.tags[k])
                                      for k, u in sync.uninitialized.items()]
    return Reply(races, uninit, [] if launch is None else touched(launch), error,
                 time.perf_counter() - start)


def _plain(reply: Reply) -> Reply:
    """``reply`` with its error as a plain one when the error's attributes
    do not pickle (an MLIR object, say): the class kept if its args do."""
    index, (cls, args, _) = reply.error or (-1, (RuntimeError, (), {}))
    try:
        pickle.dumps((cls, args))
        packed: tuple = (cls, args, {})
    except (pickle.PicklingError, TypeError, AttributeError):
        text = str(args[0]) if len(args) == 1 else str(args)
        packed = (RuntimeError, (f"{cls.__name__}: {text}",), {})
    return Reply(reply.races, reply.uninitialized, reply.touched, (index, packed),
                 reply.seconds)


def _orphaned(parent: int) -> None:
    """Ends the process once its parent is gone (killed mid-job: nobody
    would read the reply, and the job may run for minutes)."""
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)


def serve() -> None:
    """Answers jobs from stdin until it closes."""
    threading.Thread(target=_orphaned, args=(os.getppid(),), daemon=True).start()
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # prints go to stderr
    stdin = sys.stdin.buffer
    cache: dict[str, Any] = {}
    with np.errstate(all="ignore"):
        while True:
            try:
                job = receive(stdin)
            except EOFError:
                return
            reply = run_job(job, cache)
            try:
                send(out, reply)
            except (pickle.PicklingError, TypeError, AttributeError):
                send(out, _plain(reply))
