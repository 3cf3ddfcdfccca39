"""benchmarks/count.py: a deterministic measure of smalti's own work."""

import gc
import sys

import pytest

from benchmarks import count
from benchmarks.count import count_instructions, machine_instructions, module_maker
from benchmarks.run import SHAPE, reductions
from smalti import kernels


def _kernel(steps: int):
    return lambda: kernels.build_kernel(reductions(5 * steps), [SHAPE], [SHAPE]).module


def test_counts_are_the_same_for_the_same_kernel_and_grow_with_it():
    first, per_function = count_instructions(_kernel(10))
    second, _ = count_instructions(_kernel(10))
    assert first == second == sum(per_function.values())
    larger, _ = count_instructions(_kernel(20))
    assert first < larger < 3 * first


def test_counts_name_the_driver_the_rules_and_the_solver_but_not_the_counter():
    _, per_function = count_instructions(_kernel(10))
    names = set(per_function)
    assert "inference.py:infer_layouts" in names
    assert "vector_ops.py:multi_reduction" in names
    assert "solver.py:Solver.solve_in_order" in names
    assert not [name for name in names if name.startswith("count.py:")]


def test_the_counted_module_gets_its_layouts():
    modules = []

    def make():
        modules.append(_kernel(10)())
        return modules[-1]

    count_instructions(make)
    assert len(modules) == 2 and "out_layouts" in str(modules[1])


def test_the_unrolled_pipeline_is_counted_on_copies_in_one_context():
    make = module_maker("unrolled_wgmma", 2)
    first, second = make(), make()
    assert first is not second and first.context == second.context
    assert str(first) == str(second)
    total, per_function = count_instructions(make)
    assert total == sum(per_function.values())
    assert "wgmma.py:wgmma" in per_function


def _fake_valgrind(tmp_path, exit_code: int = 0):
    """A stand-in for valgrind: runs the command it is given (the kernel
    built and inferred for real), records it in ``commands.txt`` (and the
    BLAS threads it was given in ``blas_threads.txt``) and reports
    a count that grows by 7 per inference, the way callgrind reports its
    total."""
    fake = tmp_path / "valgrind.py"
    fake.write_text(
        "import os, subprocess, sys\n"
        "command = [a for a in sys.argv[1:]\n"
        "           if not a.startswith(('--tool=', '--callgrind-out-file='))]\n"
        "done = subprocess.run(command)\n"
        "infer = int(command[command.index('--infer') + 1])\n"
        f"open({str(tmp_path / 'commands.txt')!r}, 'a').write(' '.join(command) + '\\n')\n"
        f"open({str(tmp_path / 'blas_threads.txt')!r}, 'a').write("
        "os.environ.get('OPENBLAS_NUM_THREADS', '-') + '\\n')\n"
        "print(f'==1== Collected : {1_000_000 + 7 * infer}', file=sys.stderr)\n"
        f"sys.exit(done.returncode or {exit_code})\n")
    return (sys.executable, str(fake))


def test_machine_counts_are_the_difference_per_inference(tmp_path):
    count = machine_instructions("reductions", 25, inferences=2, valgrind=_fake_valgrind(tmp_path))
    assert count == 7
    # numpy's BLAS runs one thread: idle BLAS threads would spin under
    # callgrind and be counted, more the longer a run takes.
    assert (tmp_path / "blas_threads.txt").read_text().split() == ["1", "1"]


@pytest.mark.parametrize("kernel, size", [("reductions", 25), ("unrolled_wgmma", 2)])
def test_a_read_walk_is_counted_in_the_processes_that_would_infer(tmp_path, kernel, size):
    instructions = machine_instructions(kernel, size, inferences=2,
                                        valgrind=_fake_valgrind(tmp_path), read_walk=True)
    assert instructions == 7
    commands = (tmp_path / "commands.txt").read_text().splitlines()
    assert len(commands) == 2 and all("--read-walk" in command for command in commands)


def test_the_read_walk_process_walks_and_does_not_infer(monkeypatch):
    walked = []
    monkeypatch.setattr(count, "read_ops", lambda module: walked.append(module))
    monkeypatch.setattr(count.smalti, "infer_layouts",
                        lambda module: pytest.fail("a read walk process inferred"))
    count._build_and_infer("reductions", 25, build=3, infer=2, read_walk=True)
    # One walk to warm up, then the first two of the three copies built.
    assert len(walked) == 3 and len(set(map(id, walked))) == 3
    assert all("out_layouts" not in str(module) for module in walked)
    # the collector is back on: the suite's later tests share this process
    assert gc.isenabled()


def test_the_unrolled_pipeline_is_traced_once_and_handed_to_the_counted_processes(tmp_path):
    # The fake runs the children for real: they parse the text they are given.
    count = machine_instructions("unrolled_wgmma", 2, inferences=2,
                                 valgrind=_fake_valgrind(tmp_path))
    assert count == 7
    commands = (tmp_path / "commands.txt").read_text().splitlines()
    assert len(commands) == 2 and all("--text " in command for command in commands)


def test_a_failing_machine_count_says_which_command(tmp_path):
    with pytest.raises(RuntimeError, match="--build 2 --infer 2 failed"):
        machine_instructions("reductions", 25, inferences=2,
                             valgrind=_fake_valgrind(tmp_path, exit_code=3))


@pytest.mark.parametrize("compiler", ["smalti", "jax"])
def test_a_lowering_is_counted_by_the_compiler_asked_for(tmp_path, compiler):
    # The fake runs the children for real: they build, infer and lower.
    count = machine_instructions("chain", 5, inferences=2, valgrind=_fake_valgrind(tmp_path),
                                 lower_with=compiler)
    assert count == 7
    commands = (tmp_path / "commands.txt").read_text().splitlines()
    assert len(commands) == 2
    assert all(f"--lower-with {compiler}" in command for command in commands)


def test_the_unrolled_pipeline_has_no_lowering_to_count(tmp_path):
    with pytest.raises(ValueError, match="launch context"):
        machine_instructions("unrolled_wgmma", 2, lower_with="smalti",
                             valgrind=_fake_valgrind(tmp_path))


@pytest.mark.parametrize("flag", ["--against-read", "--lowering"])
def test_the_machine_only_flags_ask_for_machine(monkeypatch, capsys, flag):
    monkeypatch.setattr(sys, "argv", ["count", flag])
    with pytest.raises(SystemExit):
        count.main()
    assert "add --machine" in capsys.readouterr().err
