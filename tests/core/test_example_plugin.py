"""The example third-party plugin (examples/smalti-example-plugin), installed
as a real distribution by ``scripts/venv.sh test``: found through its entry
point, listed with its override by ``smalti plugins``, blockable; its own
tests (new op, constraint, override, Pallas) run with the suite (testpaths)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir.dialects import arith

import smalti
import smalti.jax
from smalti import cli
from smalti.pipeline import BLOCK_ENV, default_pipeline
from smalti.registry import RuleKind
from tests.official import capture_modules

NAME = "smalti_example_plugin"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smalti-example-plugin"
F32 = jax.ShapeDtypeStruct((128, 128), jnp.float32)


@pytest.fixture(autouse=True)
def installed_pipeline(monkeypatch):
    """The pipeline of the installed plugins, whatever the environment says."""
    monkeypatch.delenv(BLOCK_ENV, raising=False)
    monkeypatch.delenv("SMALTI_DISABLE_PLUGIN_AUTOLOAD", raising=False)


def test_the_example_is_installed_like_a_third_party_plugin():
    [ep] = [e for e in metadata.entry_points(group="smalti") if e.name == NAME]
    assert ep.dist is not None and ep.dist.name == "smalti-example-plugin", (
        "install it: pip install ./examples/smalti-example-plugin (scripts/venv.sh test does)")
    module = ep.load()
    # A real (non-editable) install: the code comes from site-packages.
    assert EXAMPLE not in Path(module.__file__).resolve().parents
    info = {p.name: p for p in smalti.build_pipeline().plugins}[NAME]
    assert info.source == "entry point (smalti-example-plugin)"
    assert info.version == "0.1.0"


def test_smalti_plugins_lists_the_example_and_its_override(capsys):
    assert cli.main(["plugins", "-v"]) == 0
    out = capsys.readouterr().out
    [row] = [line for line in out.splitlines() if line.startswith(NAME + " ")]
    assert "1 constraint, 2 lowering, 1 pallas" in row
    assert "smalti-example-plugin" in row
    assert f"{NAME} overrides smalti.plugins for arith.cmpf (lowering rule)" in out
    assert "smalti_example.fma" in out


def _cmpf_kernel(predicate):
    def body(ctx, x_ref, y_ref, out_ref, smem):
        x, y = mgpu.vector_load(x_ref), mgpu.vector_load(y_ref)
        mgpu.vector_store(arith.select(arith.cmpf(predicate, x, y), x, y), out_ref)

    return smalti.kernels.build_kernel(body, [F32, F32], [F32])


def test_blocking_the_example_restores_the_builtin_cmpf_lowering(monkeypatch):
    assert default_pipeline().table(RuleKind.LOWERING, (9, 0))["arith.cmpf"].plugin == NAME
    kernel = _cmpf_kernel(arith.CmpFPredicate.ULT)
    smalti.infer_layouts(kernel.module)
    assert smalti.lower(kernel.module, kernel.launch_context).ops_per_plugin[NAME] == 1

    monkeypatch.setenv(BLOCK_ENV, NAME)
    pipeline = default_pipeline()
    assert pipeline.table(RuleKind.LOWERING, (9, 0))["arith.cmpf"].plugin == "smalti.plugins"
    assert not [o for o in pipeline.overridden if o[0].plugin == NAME]
    kernel = _cmpf_kernel(arith.CmpFPredicate.ULT)
    smalti.infer_layouts(kernel.module)
    with pytest.raises(smalti.SmaltiError) as error:
        smalti.lower(kernel.module, kernel.launch_context)
    assert error.value.code == "SM203"


def test_a_pallas_kernel_calling_the_examples_fma_lowers_through_smalti():
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from smalti_example_plugin import fma

    def body(a_ref, b_ref, c_ref, out_ref):
        out_ref[...] = fma(a_ref[...], b_ref[...], c_ref[...])

    kernel = plgpu.kernel(body, out_type=F32, compiler_params=plgpu.CompilerParams(
        lowering_semantics=plgpu.LoweringSemantics.Warpgroup))
    with smalti.jax.installed():
        [module] = capture_modules(kernel, F32, F32, F32)
    assert "math.fma" in module and "smalti_example.fma" not in module


def test_the_suite_runs_the_examples_own_tests(pytestconfig):
    # They use the test kit (smalti.testing), loaded through pytest11.
    assert "examples/smalti-example-plugin/tests" in pytestconfig.getini("testpaths")
    assert pytestconfig.pluginmanager.has_plugin("smalti")
