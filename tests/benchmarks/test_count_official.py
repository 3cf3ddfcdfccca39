"""benchmarks/count_official.py: the official kernels' phases, counted."""

import ctypes
import os
import shutil

import pytest

from benchmarks.count_official import compile_client_requests, count_phases, read_counts


def test_only_the_second_compilation_of_each_is_bracketed_phase_by_phase():
    events = []
    count_phases(["hopper_matmul_mgpu"],
                 (lambda: events.append("start"), lambda label: events.append(label)))
    labels = [f"hopper_matmul_mgpu|{compiler}|{phase}"
              for compiler in ("smalti", "jax") for phase in ("infer", "lower")]
    assert events == [e for label in labels for e in ("start", label)]


def test_the_phase_functions_are_restored_after_counting():
    from jax.experimental.mosaic.gpu import dialect_lowering, layout_inference

    import smalti.jax

    before = (smalti.jax.infer_layouts, smalti.jax.lower, layout_inference.infer_layout,
              dialect_lowering.lower_mgpu_dialect)
    count_phases(["hopper_matmul_mgpu"], (lambda: None, lambda label: None))
    assert before == (smalti.jax.infer_layouts, smalti.jax.lower,
                      layout_inference.infer_layout, dialect_lowering.lower_mgpu_dialect)


def _dump(path, trigger: str, summary: int) -> None:
    path.write_text(f"version: 1\ncreator: callgrind-3.22.0\ncmd: python\n"
                    f"desc: Trigger: {trigger}\n\nevents: Ir\nsummary: {summary}\n"
                    f"totals: {summary + 5}\n")


def test_dumps_are_summed_by_label_and_the_final_dump_left_out(tmp_path):
    _dump(tmp_path / "cg.out", "Program termination", 10_000)
    _dump(tmp_path / "cg.out.1", "Client Request: k|smalti|infer", 300)
    _dump(tmp_path / "cg.out.2", "Client Request: k|smalti|infer", 200)
    _dump(tmp_path / "cg.out.3", "Client Request: k|jax|lower", 7)
    _dump(tmp_path / "other.1", "Client Request: k|jax|infer", 1)
    counts = read_counts(tmp_path, "cg.out")
    assert counts == {("k", "smalti", "infer"): 500, ("k", "jax", "lower"): 7}
    assert list(counts) == [("k", "smalti", "infer"), ("k", "jax", "lower")]


def test_dumps_come_in_the_order_they_were_made(tmp_path):
    for number in range(1, 12):
        _dump(tmp_path / f"cg.out.{number}", f"Client Request: k{number}|jax|infer", number)
    assert [kernel for kernel, _, _ in read_counts(tmp_path, "cg.out")] == [
        f"k{number}" for number in range(1, 12)]


def test_a_missing_compiler_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "false")
    with pytest.raises(RuntimeError, match="a C compiler"):
        compile_client_requests(tmp_path)


@pytest.mark.skipif(shutil.which("cc") is None or
                    not os.path.exists("/usr/include/valgrind/callgrind.h"),
                    reason="needs a C compiler and valgrind's headers")
def test_the_client_requests_are_no_ops_outside_valgrind(tmp_path):
    library = ctypes.CDLL(str(compile_client_requests(tmp_path)))
    library.smalti_count_start()
    library.smalti_count_stop(b"k|smalti|infer")
