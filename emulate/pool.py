"""Worker processes for :mod:`.workers`: started once, kept, sent jobs.

A worker is a fresh interpreter (``python -c``, started by
:mod:`subprocess`, which execs at once: the jax process is never forked
into a child that runs Python, so jax's threads cannot deadlock it -- what
``multiprocessing``'s spawn does, without re-importing the caller's
``__main__``) running :func:`.worker.serve`. Parent and worker talk over
the worker's stdin and stdout: each message a pickled object after its
length (8 bytes). The worker moves its own stdout to stderr first, so
nothing printed there mixes with the messages.

The pool keeps its workers between launches (their start -- importing jax
and smalti -- costs about a second each) and ends them at exit. A worker
whose job was abandoned (the parent failed or ran past its deadline
meanwhile) is killed: its reply would be out of step.
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO, Any

_HEADER = struct.Struct("<Q")


def send(stream: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)))
    stream.write(data)
    stream.flush()


def receive(stream: IO[bytes]) -> Any:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError("the other side closed the pipe")
    (n,) = _HEADER.unpack(head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError("the other side closed the pipe mid-message")
    return pickle.loads(data)


def pack_error(e: BaseException) -> tuple:
    """An exception as (class, args, attributes): pickling an exception
    calls its class with ``args``, which the emulator's reports (built from
    an :class:`.sync.reports.Access`, a list of races) do not take back."""
    return type(e), e.args, dict(getattr(e, "__dict__", {}))


def unpack_error(packed: tuple) -> BaseException:
    cls, args, attrs = packed
    e = cls.__new__(cls)
    e.args = args
    e.__dict__.update(attrs)
    return e


class Worker:
    """One worker process and its pipes."""

    def __init__(self) -> None:
        boot = (f"import sys; sys.path[:0] = {[p for p in sys.path if p]!r}; "
                "from smalti.emulate.worker import serve; serve()")
        env = dict(os.environ, SMALTI_EMULATE_WORKERS="1")
        self.proc = subprocess.Popen([sys.executable, "-c", boot], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
        self.busy = False
        self._sender: threading.Thread | None = None
        self._send_error: BaseException | None = None

    def submit(self, job: Any) -> None:
        """Sends ``job`` from a thread: a worker still starting reads it only
        once it has imported jax, and the parent has its own share to run."""
        def send_it() -> None:
            try:
                assert self.proc.stdin is not None
                send(self.proc.stdin, job)
            except (OSError, ValueError) as e:  # the worker died (a broken pipe)
                self._send_error = e
        self.busy = True
        self._sender = threading.Thread(target=send_it, daemon=True)
        self._sender.start()

    def fileno(self) -> int:
        """The reply pipe's (what ``select`` waits on)."""
        assert self.proc.stdout is not None
        return self.proc.stdout.fileno()

    def result(self) -> Any:
        assert self.proc.stdout is not None
        try:
            if self._sender is not None:
                self._sender.join()
            if self._send_error is not None:
                raise EOFError(f"the job could not be sent: {self._send_error}")
            return receive(self.proc.stdout)
        finally:
            self.busy = False

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


class Pool:
    """Workers kept between launches; :meth:`take` gives ``n`` of them."""

    def __init__(self) -> None:
        self.idle: list[Worker] = []
        self.lock = threading.Lock()  # launches from several threads take in turn

    def warm(self, n: int) -> int:
        """How many of ``n`` workers are started already."""
        return min(n, len(self.idle))

    def take(self, n: int) -> list[Worker]:
        with self.lock:
            alive = [w for w in self.idle if w.proc.poll() is None]
            for w in self.idle:
                if w not in alive:
                    w.kill()
            taken, self.idle = alive[:n], alive[n:]
        return taken + [Worker() for _ in range(n - len(taken))]

    def give_back(self, workers: list[Worker]) -> None:
        for w in workers:
            if w.busy or w.proc.poll() is not None:
                w.kill()
            else:
                with self.lock:
                    self.idle.append(w)

    def close(self) -> None:
        for w in self.idle:
            if w.proc.stdin is not None:
                w.proc.stdin.close()  # the worker's loop ends at end of input
        for w in self.idle:
            try:
                w.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            w.kill()
        self.idle = []


def gather(workers: list[Worker], check: Callable[[], None], poll_s: float = 0.1) -> list:
    """Each worker's reply, in order; ``check`` runs at least every
    ``poll_s`` (it raises to give up: the deadline). A worker that died
    answers ``EOFError``."""
    replies: list = [None] * len(workers)
    waiting = set(range(len(workers)))
    while waiting:
        check()
        ready = select.select([workers[i] for i in waiting], [], [], poll_s)[0]
        for i in [workers.index(w) for w in ready] + [i for i in waiting
                                                      if workers[i].proc.poll() is not None]:
            if i not in waiting:
                continue
            try:
                replies[i] = workers[i].result()
            except EOFError as e:
                replies[i] = e
            waiting.discard(i)
    return replies


POOL = Pool()
atexit.register(POOL.close)
