"""``pytest --smalti-emulate[=ARCH]`` and ``smalti conformance --emulate``:
GPU tests written the way jax's are, run on the CPU with their kernels on
the emulator and their assertions live."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import pytest
from jax._src import test_util as jtu
from jax._src import xla_bridge

from smalti.emulate import cpu_mode, pretend

#: A kernel library's GPU tests, in jax's style: they skip without an sm_90
#: CUDA device, size a grid by the SM count, and check numbers with numpy.
GPU_TESTS = '''
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from jax._src import test_util as jtu
from jax.experimental import pallas as pl
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

try:
    import jax._src.lib.mosaic_gpu as mosaic_gpu_lib
    HAS_MOSAIC_GPU = True
except ImportError:
    HAS_MOSAIC_GPU = False


def doubler(n_blocks):
    def body(x, o):
        i = jax.lax.axis_index("i")
        o[pl.ds(i * 128, 128)] = x[pl.ds(i * 128, 128)] * 2
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((n_blocks * 128,), jnp.float32),
                        grid=(n_blocks,), grid_names=("i",))


class KernelTest(jtu.JaxTestCase, jtu.CudaArchSpecificTest):
    def setUp(self):
        if not HAS_MOSAIC_GPU:
            self.skipTest("jaxlib built without Mosaic GPU")
        if (not jtu.test_device_matches(["cuda"])
                or not jtu.is_cuda_compute_capability_at_least("9.0")):
            self.skipTest("Only works on GPU with capability >= sm90")
        super().setUp()

    def test_doubles(self):
        n = jax.devices()[0].core_count // 66
        x = np.arange(n * 128, dtype=np.float32)
        np.testing.assert_array_equal(doubler(n)(x), x * 2)

    def test_wrong_expectation_fails(self):
        x = np.arange(128, dtype=np.float32)
        self.assertAllClose(doubler(1)(x), x * 3)

    def test_hopper_only(self):
        self.skip_unless_sm90a()
        self.assertEqual(mgpu_utils._infer_arch(), (9, 0))

    def test_device_facts(self):
        [device] = jax.local_devices()
        self.assertEqual(device.shared_memory_per_block_optin, 227 * 1024)
        self.assertTrue(jtu.is_cuda_compute_capability_equal(device.compute_capability))


if __name__ == "__main__":
    absltest.main()
'''


def run_pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_kernels.py").write_text(GPU_TESTS)
    return subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider",
                           str(tmp_path / "test_kernels.py"), *args],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)


def outcomes(done: subprocess.CompletedProcess) -> dict[str, str]:
    found = {}
    for line in done.stdout.splitlines():
        for word in ("PASSED", "FAILED", "SKIPPED"):
            if line.startswith(word) and "::" in line:
                found[line.split("::")[-1].split()[0]] = word
    return found


def test_without_the_switch_the_gpu_tests_skip(tmp_path):
    done = run_pytest(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 skipped" in done.stdout and "emulator" not in done.stdout


def test_with_the_switch_kernels_run_and_assertions_are_live(tmp_path):
    done = run_pytest(tmp_path, "--smalti-emulate=9.0")
    assert outcomes(done) == {"test_doubles": "PASSED", "test_wrong_expectation_fails": "FAILED",
                              "test_hopper_only": "PASSED", "test_device_facts": "PASSED"}, (
        done.stdout[-3000:])
    assert "Mosaic GPU kernels run on the emulator, as sm_90" in done.stdout
    assert "Mismatched elements: 127 / 128" in done.stdout  # x[0] == 0 both ways


def test_the_architecture_decides_the_arch_specific_skips(tmp_path):
    done = run_pytest(tmp_path, "--smalti-emulate=sm_100a", "-k", "hopper or facts")
    assert outcomes(done) == {"test_device_facts": "PASSED"}, done.stdout[-3000:]
    assert "1 passed, 1 skipped" in done.stdout
    assert "Only works on GPU with capability sm90a" in done.stdout


def test_a_path_taken_for_the_architecture_is_a_usage_error(tmp_path):
    (tmp_path / "test_kernels.py").write_text(GPU_TESTS)
    done = subprocess.run([sys.executable, "-m", "pytest", "--smalti-emulate",
                           str(tmp_path / "test_kernels.py")], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 4  # pytest's usage error
    assert "--smalti-emulate=ARCH" in done.stderr


def test_pretending_puts_everything_back():
    cpu = jax.devices()[0]
    before = (jtu.device_under_test, jtu.is_device_cuda, xla_bridge.local_devices,
              sys.modules.get(pretend.MOSAIC_GPU_LIB), jtu.cuda_versions)
    with pretend.pretend_gpu((9, 0)):
        assert jtu.test_device_matches(["cuda"]) and jtu.test_device_matches(["gpu"])
        assert jtu.is_cuda_compute_capability_equal("9.0")
        assert cpu.core_count == 132
        assert cpu_mode.current() is not None
        import jax._src.lib.mosaic_gpu as lib
        lib._mosaic_gpu_ext._sync_all_devices()
        with pytest.raises(pretend.Unsupported, match="CUPTI"):
            lib._mosaic_gpu_ext._cupti_init()
        assert jtu.cuda_versions.cuda_runtime_get_version() == pretend.CUDA_RUNTIME_VERSION
    after = (jtu.device_under_test, jtu.is_device_cuda, xla_bridge.local_devices,
             sys.modules.get(pretend.MOSAIC_GPU_LIB), jtu.cuda_versions)
    assert after == before
    assert cpu_mode.current() is None and not hasattr(cpu, "core_count")
    assert not jtu.test_device_matches(["cuda"])


def test_conformance_counts_jax_style_gpu_tests_per_file(tmp_path):
    (tmp_path / "kernels_test.py").write_text(GPU_TESTS + textwrap.dedent('''
        class SlowTest(KernelTest):
            def test_sleeps(self):
                import time
                time.sleep(60)
        '''))
    expected = tmp_path / "expected.txt"
    expected.write_text("kernels_test.py::KernelTest::test_doubles\n"
                        "kernels_test.py::KernelTest::test_wrong_expectation_fails\n")
    done = subprocess.run(
        [sys.executable, "-m", "smalti.cli", "conformance", str(tmp_path / "kernels_test.py"),
         "--emulate=9.0", "--jax", "--timeout", "3", "--expected", str(expected),
         "--require", "1", "--pytest-args", "-k 'not test_hopper_only and not test_device'"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "on the CPU: kernels run on smalti's emulator as sm_90" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.startswith("kernels_test.py"))
    # expected, passed (of those), failed, skipped, passed but not listed: SlowTest
    # inherits KernelTest's two tests and adds one that runs past the timeout
    assert row.split()[1:] == ["2", "1", "3", "0", "1"], done.stdout[-3000:]
    assert "ok: 1 of 2 expected tests pass (required: 1)" in done.stdout
    assert ("kernels_test.py::KernelTest::test_wrong_expectation_fails\n      failed: "
            "AssertionError" in done.stdout)  # why the expected one failed
    assert "timed out after 3 s" not in done.stdout  # not expected: not listed


#: Two blocks write one output range: a write-after-write race between
#: blocks, whose lockstep result (the last block's values) the test expects.
RACY_TEST = '''
class RacyTest(KernelTest):
    def test_blocks_write_one_range(self):
        def body(x, o):
            i = jax.lax.axis_index("i")
            o[...] = x[pl.ds(i * 128, 128)]
        racy = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                            grid=(2,), grid_names=("i",))
        x = np.arange(256, dtype=np.float32)
        np.testing.assert_array_equal(racy(x), x[128:])
'''


def _conformance_on(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "racy_test.py").write_text(GPU_TESTS + textwrap.dedent(RACY_TEST))
    return subprocess.run(
        [sys.executable, "-m", "smalti.cli", "conformance", str(tmp_path / "racy_test.py"),
         *args, "--pytest-args", "-k 'test_doubles or test_blocks'"],
        capture_output=True, text=True, timeout=600)


def test_conformance_fails_a_racy_test_by_default(tmp_path):
    done = _conformance_on(tmp_path, "--emulate=9.0")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "RaceError: 1 data race(s) found" in done.stdout  # why it failed
    assert "tests' kernels have data races" not in done.stdout


def test_conformance_on_race_warn_lists_the_races_beside_the_outcomes(tmp_path):
    outcomes_file = tmp_path / "outcomes.tsv"
    done = _conformance_on(tmp_path, "--emulate=9.0", "--on-race", "warn",
                           "--write-outcomes", str(outcomes_file))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {r[0].split("::")[-1]: r for r in
            (line.split("\t") for line in outcomes_file.read_text().splitlines())}
    # test, outcome, seconds, why, races reported
    assert rows["test_blocks_write_one_range"][1] == "passed"
    assert int(rows["test_blocks_write_one_range"][4]) >= 1
    assert [r[4] for name, r in rows.items() if name != "test_blocks_write_one_range"] == \
        ["0"] * (len(rows) - 1)
    assert "1 tests' kernels have data races (1 of them passed" in done.stdout
    assert "racy_test.py::RacyTest::test_blocks_write_one_range (passed" in done.stdout
    assert "data race (write-after-write, gmem)" in done.stdout


def test_conformance_on_race_needs_emulate(tmp_path):
    done = _conformance_on(tmp_path, "--on-race", "warn")
    assert done.returncode == 2
    assert "[SM301] --on-race warn without --emulate" in done.stderr
