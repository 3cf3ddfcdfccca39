"""smalti's test kit for plugin authors: a pytest plugin.

pytest loads it through the ``pytest11`` entry point smalti installs, so a
plugin's tests get these fixtures without any import or ``conftest.py``:

- ``smalti_build(body, in_shapes, out_shapes, **kwargs)``: traces a kernel
  body (as :func:`smalti.kernels.build_kernel` does) in a fresh MLIR context
  that accepts ops of unregistered dialects, such as a plugin's own;
- ``smalti_pipeline(*plugins)``: a pipeline of exactly these plugins — plugin
  modules or objects, or the names of installed plugins (``"smalti.plugins"``);
- ``smalti_lower(kernel, pipeline)``: infers and lowers a kernel, returning a
  :class:`Lowered` (reports with the trace of which plugin handled which op,
  and the module's text);
- ``smalti_compare(body, in_shapes, out_shapes, pipeline=..., reference=...)``:
  asserts that a pipeline lowers a kernel to the same IR as a reference —
  ``"jax"`` (jax's own middle-end) or another pipeline — and returns the text.
- ``smalti_emulate(f, *numpy_args, pipeline=None, arch=(9, 0), ...)``: runs
  ``f`` (one Mosaic GPU kernel call) lowered through a pipeline on smalti's
  emulator and returns its outputs, its synchronization checked (or, with
  ``profile=True``, a :class:`smalti.emulate.Profile` of what it costs).

And one command-line switch: ``pytest --smalti-emulate[=ARCH]`` (ARCH as
``9.0`` or ``sm_100a``; default 9.0) runs the session on the CPU as if it had
that NVIDIA GPU: every Mosaic GPU kernel the tests launch runs on smalti's
emulator (:func:`smalti.emulate.set_on_cpu`), and what jax's test utilities
ask of the device answers as the emulated GPU (:mod:`smalti.emulate.pretend`),
so a kernel library's GPU tests run in a CPU-only CI job::

    pytest tests/gpu --smalti-emulate=9.0

The same helpers are plain functions here, for use outside fixtures::

    def test_my_op(smalti_build, smalti_pipeline, smalti_lower):
        kernel = smalti_build(body, [f32], [f32])
        lowered = smalti_lower(kernel, smalti_pipeline("smalti.plugins", my_plugin))
        assert lowered.inference.ops_per_plugin["my_plugin"] == 1
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import pytest

from smalti import hookspec
from smalti.diagnostics import PluginError

_DUMP_NAME = re.compile(r', mosaic_gpu.dump_basename = "[^"]*"')
_DIFF_LINES = 60  # of a mismatch, shown in the assertion message

Reference = Any  # "jax", or a smalti.Pipeline


@dataclass(frozen=True, slots=True)
class Lowered:
    """A kernel after inference and lowering, with what smalti reported."""

    kernel: Any  # smalti.kernels.Kernel
    inference: Any  # smalti.InferenceReport, or None for jax's reference
    lowering: Any  # smalti.LoweringReport, or None for jax's reference

    @property
    def text(self) -> str:
        """The lowered module, without the per-process counter jax stamps on it."""
        return normalized(self.kernel.module)


def normalized(module: Any) -> str:
    return _DUMP_NAME.sub("", str(module))


def build(body: Callable[..., None], in_shapes: Sequence[Any], out_shapes: Sequence[Any],
          **kwargs: Any) -> Any:
    """:func:`smalti.kernels.build_kernel` in a fresh context that accepts ops
    of unregistered dialects (fresh, so the setting touches nothing else)."""
    from smalti import kernels

    context = kwargs.pop("context", None) or kernels.make_context()
    context.allow_unregistered_dialects = True
    return kernels.build_kernel(body, in_shapes, out_shapes, context=context, **kwargs)


def _installed(name: str) -> Any:
    entry_points = metadata.entry_points(group=hookspec.ENTRY_POINT_GROUP)
    found = [ep for ep in entry_points if ep.name == name]
    if not found:
        raise PluginError(
            "SM012", f"no installed plugin is named {name!r}",
            values={"installed": ", ".join(sorted(ep.name for ep in entry_points)) or "none"},
            fix=[f"install the distribution that provides {name!r} (pip install -e .)",
                 "or pass the plugin module itself instead of its name"])
    return found[0].load()


def pipeline_of(*plugins: Any, block: Sequence[str] = ()) -> Any:
    """A pipeline of exactly ``plugins`` and no other installed plugin.

    Each is a plugin module or object (named after its ``__name__``), or the
    name of an installed plugin (its entry point). Plugin errors (conflicts,
    broken plugins) raise rather than being skipped: a test wants to know.
    """
    from smalti.pipeline import build_pipeline

    named: dict[str, Any] = {}
    for plugin in plugins:
        if isinstance(plugin, str):
            named[plugin] = _installed(plugin)
        else:
            named[getattr(plugin, "__name__", type(plugin).__name__)] = plugin
    pipeline = build_pipeline(plugins=named, autoload=False, block=block)
    if pipeline.problems:
        raise pipeline.problems[0].error
    return pipeline


def lower_with(kernel: Any, pipeline: Any = None, *, arch: tuple[int, int] | None = None
               ) -> Lowered:
    """Infers and lowers ``kernel`` with ``pipeline`` (default: the installed
    plugins), in place; ``arch`` defaults to the one the kernel was built for."""
    import smalti
    from smalti.lowering import module_arch

    arch = arch or module_arch(kernel.module)
    inference = smalti.infer_layouts(kernel.module, arch=arch, pipeline=pipeline, trace=True)
    lowering = smalti.lower(kernel.module, kernel.launch_context, arch=arch, pipeline=pipeline)
    return Lowered(kernel, inference, lowering)


def lower_with_jax(kernel: Any, *, arch: tuple[int, int] | None = None) -> Lowered:
    """Infers and lowers ``kernel`` with jax's own middle-end: the reference a
    plugin's rules for Mosaic GPU's ops are compared against."""
    from jax._src.lib.mlir import ir
    from jax.experimental.mosaic import gpu as mgpu

    from smalti.lowering import module_arch

    arch = arch or module_arch(kernel.module)
    with kernel.context, ir.Location.unknown(kernel.context):
        mgpu.infer_layout(kernel.module, arch=arch)
        mgpu.lower_mgpu_dialect(kernel.module, kernel.launch_context)
    return Lowered(kernel, None, None)


def assert_same_lowering(body: Callable[..., None], in_shapes: Sequence[Any],
                         out_shapes: Sequence[Any], *, pipeline: Any = None,
                         reference: Reference = "jax", arch: tuple[int, int] | None = None,
                         **build_kwargs: Any) -> str:
    """Builds the kernel twice and lowers it with ``pipeline`` and with
    ``reference`` (``"jax"`` or another pipeline); asserts the same IR results
    and returns it."""
    ours = lower_with(build(body, in_shapes, out_shapes, **build_kwargs), pipeline, arch=arch)
    theirs_kernel = build(body, in_shapes, out_shapes, **build_kwargs)
    if isinstance(reference, str) and reference == "jax":
        theirs = lower_with_jax(theirs_kernel, arch=arch)
    else:
        theirs = lower_with(theirs_kernel, reference, arch=arch)
    if ours.text != theirs.text:
        diff = list(difflib.unified_diff(theirs.text.splitlines(), ours.text.splitlines(),
                                         "reference", "pipeline", lineterm=""))
        shown = "\n".join(diff[:_DIFF_LINES])
        more = f"\n... {len(diff) - _DIFF_LINES} more lines" if len(diff) > _DIFF_LINES else ""
        raise AssertionError(f"the pipeline lowers the kernel differently from the "
                             f"reference:\n{shown}{more}")
    return ours.text


# --- the pytest plugin ---------------------------------------------------------------------


EMULATE_OPTION = "--smalti-emulate"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("smalti")
    group.addoption(
        EMULATE_OPTION, nargs="?", const="9.0", default=None, metavar="ARCH",
        help="run Mosaic GPU kernels on smalti's emulator, the CPU answering jax's test "
        "utilities as an NVIDIA GPU of ARCH (e.g. 9.0, sm_100a; default 9.0)")


def emulated_arch(value: str) -> tuple[int, int]:
    """The architecture ``--smalti-emulate=VALUE`` names (a usage error if none)."""
    import argparse

    from smalti.cli import parse_arch

    try:
        return parse_arch(value)
    except argparse.ArgumentTypeError as e:
        raise pytest.UsageError(
            f"{EMULATE_OPTION}: {e} (write {EMULATE_OPTION}=ARCH with '=', or put the switch "
            "after the test paths, so that a path is not taken for it)") from None


def pytest_configure(config: pytest.Config) -> None:
    value = config.getoption("smalti_emulate", None)
    if value is None:
        return
    from smalti.emulate import pretend

    config.add_cleanup(pretend.start(emulated_arch(value)))


def pytest_report_header(config: pytest.Config) -> list[str]:
    from smalti import __version__

    lines = [f"smalti: {__version__} (test kit: smalti.testing)"]
    value = config.getoption("smalti_emulate", None)
    if value is not None:
        major, minor = emulated_arch(value)
        lines.append(f"smalti: Mosaic GPU kernels run on the emulator, as sm_{major}{minor}")
    return lines


@pytest.fixture
def smalti_build() -> Callable[..., Any]:
    """``smalti_build(body, in_shapes, out_shapes, **kwargs)`` -> a kernel (see :func:`build`)."""
    return build


@pytest.fixture
def smalti_pipeline() -> Callable[..., Any]:
    """``smalti_pipeline(*plugins, block=())`` -> a pipeline of exactly those plugins."""
    return pipeline_of


@pytest.fixture
def smalti_lower() -> Callable[..., Lowered]:
    """``smalti_lower(kernel, pipeline=None, arch=None)`` -> :class:`Lowered`."""
    return lower_with


@pytest.fixture
def smalti_compare() -> Callable[..., str]:
    """``smalti_compare(body, in_shapes, out_shapes, pipeline=..., reference="jax")``:
    see :func:`assert_same_lowering`."""
    return assert_same_lowering


@pytest.fixture
def smalti_emulate() -> Callable[..., Any]:
    """``smalti_emulate(f, *numpy_args, pipeline=None, arch=(9, 0),
    on_race="raise", on_uninitialized="warn")`` -> the outputs of ``f`` (one
    Mosaic GPU kernel call), lowered through ``pipeline`` (default: the
    installed plugins) and run on the CPU by :mod:`smalti.emulate`: what a
    plugin's lowering computes, not its text, with its synchronization
    checked (a race raises ``smalti.emulate.RaceError`` by default;
    ``SMALTI_EMULATE_ON_RACE`` sets the default policy). With ``profile=True``
    it returns a :class:`smalti.emulate.Profile` instead: the outputs and what
    the kernel costs (:func:`smalti.emulate.profile`'s counters)."""
    from smalti.emulate.testing import emulate_pipeline

    return emulate_pipeline
