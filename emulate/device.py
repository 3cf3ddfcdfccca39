"""What the emulated GPU answers when a program asks about its device.

Kernel code and kernel libraries size themselves by the device they run on:
``jax.devices()[0].core_count`` (the SM count a persistent kernel's grid is
sized by), ``shared_memory_per_block_optin`` (the SMEM budget), and
``compute_capability`` (which ``mgpu.utils._infer_arch()`` reads to choose
the architecture). A CPU device has none of these attributes.

:func:`answer_with` installs, once per process, a hook on jaxlib's device
type: attribute look-ups that the device itself does not answer go to the
``facts`` function given; while it returns :class:`GpuFacts`, a CPU device
answers those three attributes as that GPU, and while it returns ``None``
the hook passes every look-up to jaxlib unchanged, so nothing differs from
a process without it. Real GPU devices are never touched.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: An H100/H200 (and a B200): SMs, and the opt-in SMEM per block (227 KiB).
NUM_SMS = 132
SMEM_PER_BLOCK_OPTIN = 227 * 1024
#: What one SM of those holds at once (CUDA's occupancy limits for sm_90 and
#: sm_100): SMEM (of which CUDA reserves 1 KiB per block), threads, blocks.
SMEM_PER_SM = 228 * 1024
SMEM_RESERVED_PER_BLOCK = 1024
THREADS_PER_SM = 2048
BLOCKS_PER_SM = 32


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """The device facts of an emulated GPU."""

    arch: tuple[int, int] = (9, 0)
    num_sms: int = NUM_SMS
    smem_per_block_optin: int = SMEM_PER_BLOCK_OPTIN

    def attribute(self, name: str) -> Any:
        """The value of device attribute ``name``; ``AttributeError`` for any other."""
        if name == "compute_capability":
            return f"{self.arch[0]}.{self.arch[1]}"
        if name == "core_count":
            return self.num_sms
        if name == "shared_memory_per_block_optin":
            return self.smem_per_block_optin
        raise AttributeError(name)


_lock = threading.Lock()
_sources: list[Callable[[], GpuFacts | None]] = []


def current() -> GpuFacts | None:
    """The facts in force now (the first source that gives some), or ``None``."""
    for source in _sources:
        facts = source()
        if facts is not None:
            return facts
    return None


def answer_with(facts: Callable[[], GpuFacts | None]) -> None:
    """Makes CPU devices answer as the GPU ``facts()`` describes whenever it
    returns facts (idempotent per source)."""
    with _lock:
        if facts in _sources:
            return
        if not _sources:
            _install_hook()
        _sources.append(facts)


def _install_hook() -> None:
    import jax

    device_type = type(jax.devices("cpu")[0])
    original = device_type.__getattr__

    def __getattr__(self: Any, name: str) -> Any:
        if self.platform == "cpu":
            facts = current()
            if facts is not None:
                try:
                    return facts.attribute(name)
                except AttributeError:
                    pass
        return original(self, name)

    __getattr__.__wrapped__ = original  # type: ignore[attr-defined]
    device_type.__getattr__ = __getattr__


def resident_clusters(cluster_size: int, threads: int, smem: int) -> int:
    """How many clusters of ``cluster_size`` blocks of ``threads`` threads and
    ``smem`` bytes of dynamic SMEM the emulated GPU holds at once: its SMs
    (:func:`current`'s, else :data:`NUM_SMS`) times the blocks one SM holds
    by CUDA's occupancy limits (registers aside: not known before SASS), at
    least one cluster."""
    facts = current()
    sms = facts.num_sms if facts is not None else NUM_SMS
    per_sm = min(BLOCKS_PER_SM, THREADS_PER_SM // max(threads, 1),
                 SMEM_PER_SM // (smem + SMEM_RESERVED_PER_BLOCK))
    return max(1, sms * per_sm // cluster_size)

