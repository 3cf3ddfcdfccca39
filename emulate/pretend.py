"""A CPU-only process that jax's test utilities take for one with an NVIDIA GPU.

GPU test suites ask before they run a kernel: ``jtu.test_device_matches(["cuda"])``,
``jtu.is_cuda_compute_capability_at_least/equal``, the
``jtu.CudaArchSpecificTest.skip_unless_*`` checks, ``jax.devices()[0].core_count``
and ``shared_memory_per_block_optin``, ``mgpu.utils._infer_arch()``, whether
``jax._src.lib.mosaic_gpu`` (the CUDA runtime extension) imports, and the CUDA
runtime's version (``jax._src.lib.cuda_versions``). :func:`pretend_gpu`
answers all of them as the emulated GPU and turns on
:func:`smalti.emulate.set_on_cpu` for the process, so the kernels the tests
launch run on the emulator and their numeric assertions hold or fail on
what it computes:

- the device under test is ``"gpu"`` with the ``"cuda"`` tag (a test skipped
  on GPUs is skipped here too), ``xla_bridge.local_devices(backend="gpu")``
  gives the CPU devices, which answer ``compute_capability``, ``core_count``
  and ``shared_memory_per_block_optin`` as the GPU (:mod:`.device`);
- ``jax._src.lib.mosaic_gpu`` is a stand-in whose ``_mosaic_gpu_ext`` offers
  ``_sync_all_devices`` (nothing to wait for) and raises
  :class:`~smalti.emulate.Unsupported` for anything else it is asked (CUPTI
  timing: a kernel's time on the emulator says nothing of the GPU's);
- ``cuda_versions.cuda_runtime_get_version()`` answers
  :data:`CUDA_RUNTIME_VERSION` where jax holds ``None`` for it.

Everything is put back by the returned function (or on leaving the context).
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .errors import Unsupported

#: The CUDA runtime the emulated GPU reports (13.0): the version attention's
#: causal variant checks against a ptxas bug of 12.8-12.9.0.
CUDA_RUNTIME_VERSION = 13000
MOSAIC_GPU_LIB = "jax._src.lib.mosaic_gpu"


class _Extension(types.ModuleType):
    """Mosaic GPU's CUDA extension, as far as the emulated GPU has one."""

    def __init__(self) -> None:
        super().__init__("smalti.emulate.pretend._mosaic_gpu_ext")

    @staticmethod
    def _sync_all_devices() -> None:
        return None  # kernels have finished when their callback returns

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise Unsupported(f"jax._src.lib.mosaic_gpu._mosaic_gpu_ext.{name} (the CUDA runtime "
                          "extension of Mosaic GPU: CUPTI timing and the CUDA runtime are not "
                          "emulated)")


class _CudaVersions(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("smalti.emulate.pretend.cuda_versions")

    @staticmethod
    def cuda_runtime_get_version() -> int:
        return CUDA_RUNTIME_VERSION

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise Unsupported(f"jax._src.lib.cuda_versions.{name} (only the runtime's version is "
                          "emulated)")


def start(arch: Sequence[int] = (9, 0), *, on_race: str | None = None,
          on_uninitialized: str | None = None) -> Callable[[], None]:
    """Pretends the process has the GPU ``arch`` whose kernels run on the
    emulator; returns the function that puts everything back."""
    import jax
    import jax._src.lib as jax_lib

    # Imported without the stand-in: it would take it for the CUDA extension and
    # look for the runtime beside it.
    import jax.experimental.mosaic.gpu  # noqa: F401
    from jax._src import test_util as jtu
    from jax._src import xla_bridge

    from . import set_on_cpu

    undo: list[Callable[[], None]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        missing = object()
        saved = getattr(owner, name, missing)
        setattr(owner, name, value)
        undo.append(lambda: delattr(owner, name) if saved is missing
                    else setattr(owner, name, saved))

    original_local_devices = xla_bridge.local_devices

    def local_devices(process_index: int | None = None, backend: Any = None,
                      host_id: int | None = None) -> list:
        if backend in ("gpu", "cuda"):
            return jax.local_devices(backend="cpu")
        return original_local_devices(process_index, backend, host_id)

    patch(xla_bridge, "local_devices", local_devices)
    patch(jtu, "device_under_test", lambda: "gpu")
    patch(jtu, "is_device_cuda", lambda: True)
    patch(jtu, "is_device_rocm", lambda: False)

    extension = _Extension()
    stand_in = types.ModuleType(MOSAIC_GPU_LIB)
    stand_in._mosaic_gpu_ext = extension  # type: ignore[attr-defined]
    saved_module = sys.modules.get(MOSAIC_GPU_LIB)
    sys.modules[MOSAIC_GPU_LIB] = stand_in
    undo.append(lambda: _restore_module(MOSAIC_GPU_LIB, saved_module))
    patch(jax_lib, "mosaic_gpu", stand_in)

    versions = _CudaVersions()
    for module in [m for name, m in list(sys.modules.items())
                   if name.split(".")[0] == "jax" and m is not None]:
        if "cuda_versions" in getattr(module, "__dict__", {}) and module.cuda_versions is None:
            patch(module, "cuda_versions", versions)

    set_on_cpu(arch, on_race=on_race, on_uninitialized=on_uninitialized)
    undo.append(lambda: set_on_cpu(None))

    def stop() -> None:
        while undo:
            undo.pop()()

    return stop


def _restore_module(name: str, saved: Any) -> None:
    if saved is None:
        sys.modules.pop(name, None)
    else:
        sys.modules[name] = saved


@contextlib.contextmanager
def pretend_gpu(arch: Sequence[int] = (9, 0), *, on_race: str | None = None,
                on_uninitialized: str | None = None) -> Iterator[None]:
    """:func:`start` for the duration of a ``with`` block."""
    stop = start(arch, on_race=on_race, on_uninitialized=on_uninitialized)
    try:
        yield
    finally:
        stop()
