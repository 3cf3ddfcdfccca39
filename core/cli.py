"""The ``smalti`` command line.

- ``smalti plugins``: the plugins taking part, what they provide, overrides
  between them, and the plugins that could not take part; with ``--check``,
  a validation of the installed plugins that exits 1 on any problem;
- ``smalti infer FILE``: layout inference on a textual MLIR module;
- ``smalti lower``: inference and lowering of the built-in example kernel;
- ``smalti conformance PATH...``: jax's own Mosaic GPU tests run with smalti
  in place of jax's inference and lowering, counted against a list of the
  tests expected to pass (:mod:`smalti.conformance`); exit 1 below the target;
  with ``--emulate[=ARCH]``, jax's GPU tests on the CPU, their kernels on
  smalti's emulator;
- ``smalti explain [CODE]``: the long form of an error code.

Exit status: 0 on success, 1 when smalti reports an error in the input kernel
or in a plugin (or ``plugins --check`` finds a problem), 2 for a usage error
(bad arguments, unreadable file, unknown code).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import sys
import textwrap
import warnings
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from pathlib import Path

from jax._src.lib.mlir import ir

from smalti import __version__, arch_policy, check, codes, hookspec
from smalti import pipeline as pipeline_module
from smalti.diagnostics import SmaltiError, SmaltiValueError
from smalti.inference import InferenceReport, TraceEntry, infer_layouts
from smalti.kernels import example_kernel, make_context
from smalti.lowering import LoweringReport, lower, module_arch, recorded_arch
from smalti.pipeline import Pipeline, default_pipeline, discover
from smalti.registry import Architectures, RuleKind, RuleRecord

Arch = tuple[int, int]

DEFAULT_ARCH: Arch = (9, 0)
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2

_ARCH = re.compile(r"^(?:(\d+)\.(\d+)|sm_(\d+)(\d)a?)$")


# --- formatting helpers ------------------------------------------------------------------


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart; the last column is not padded."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]

    def line(row: Sequence[str]) -> str:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)] + [row[-1]]
        return "  ".join(cells).rstrip()

    return [line(header), *(line(r) for r in rows)]


def _error(error: SmaltiError) -> None:
    print(f"smalti: error: {error}", file=sys.stderr)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def parse_arch(text: str) -> Arch:
    """``9.0``, ``10.0``, ``sm_90a`` or ``sm_100`` -> ``(major, minor)``."""
    match = _ARCH.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"invalid architecture {text!r}: write MAJOR.MINOR (e.g. 9.0) or sm_NN (e.g. sm_90a)")
    major, minor = (match[1], match[2]) if match[1] is not None else (match[3], match[4])
    return int(major), int(minor)


def _shard(text: str) -> tuple[int, int]:
    """``--shard K/N`` as the runner's (index, count); argparse's error otherwise."""
    from smalti.conformance.runner import parse_shard  # (imports pytest)

    try:
        return parse_shard(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# --- smalti plugins ----------------------------------------------------------------------


def describe_archs(archs: Sequence[Architectures]) -> str:
    """The union of architecture ranges, e.g. ``any`` or ``>=sm_90``; ``-`` if empty."""
    if not archs:
        return "-"
    if any(a.minimum is None and a.maximum is None for a in archs):
        return "any"
    merged: list[Architectures] = []
    for a in sorted(set(archs), key=lambda a: a.minimum or (0, 0)):
        last = merged[-1] if merged else None
        if last is not None and last.overlaps(a):
            top = (None if last.maximum is None or a.maximum is None
                   else max(last.maximum, a.maximum))
            merged[-1] = Architectures(last.minimum, top)
        else:
            merged.append(a)
    return ", ".join(str(a) for a in merged)


def _op_counts(by_kind: dict[RuleKind, list[RuleRecord]]) -> str:
    parts = [f"{len({r.key for r in records})} {kind.value}"
             for kind, records in by_kind.items() if records]
    return ", ".join(parts) or "none"


def _op_names(name: str, by_kind: dict[RuleKind, list[RuleRecord]]) -> list[str]:
    """A plugin's ops, by rule kind and architecture range."""
    lines = []
    for kind, records in by_kind.items():
        by_archs: dict[Architectures, set[str]] = {}
        for record in records:
            by_archs.setdefault(record.archs, set()).add(record.key)
        for archs in sorted(by_archs, key=lambda a: (a.minimum or (0, 0), a.maximum or (99, 99))):
            keys = sorted(by_archs[archs])
            body = textwrap.fill(", ".join(keys), width=88, initial_indent="    ",
                                 subsequent_indent="    ")
            lines += [f"  {name}: {kind.value} rules for {archs} ({len(keys)}):", body]
    return lines


def _not_loaded(pipeline: Pipeline) -> list[str]:
    """Installed entry points absent from the pipeline by the user's choice
    (failures are listed as problems instead)."""
    taking_part = {p.name for p in pipeline.plugins} | {p.plugin for p in pipeline.problems}
    blocked = set(pipeline.blocked)
    autoload_off = not pipeline.autoload
    lines = []
    for ep in sorted(metadata.entry_points(group=hookspec.ENTRY_POINT_GROUP), key=lambda e: e.name):
        if ep.name in taking_part:
            continue
        if ep.name in blocked:
            lines.append(f"  {ep.name}: blocked by {pipeline_module.BLOCK_ENV}")
        elif autoload_off:
            lines.append(f"  {ep.name}: autoload is off ({pipeline_module.AUTOLOAD_ENV})")
    return lines


def _arch_policy_line() -> str:
    if arch_policy.strict(None):
        return (f"architecture policy: strict ({arch_policy.STRICT_ARCH_ENV} is set): an op "
                "whose rules do not support the target architecture is an error (SM002)")
    return ("architecture policy: lenient: an op whose rules do not support the target "
            "architecture uses the nearest rule and warns (SM002), as jax does not check; "
            f"{arch_policy.STRICT_ARCH_ENV}=1 makes it an error")


def plugins_report(pipeline: Pipeline, *, verbose: bool = False) -> list[str]:
    """The lines printed by ``smalti plugins``."""
    rows, details = [], []
    for info in pipeline.plugins:
        by_kind = pipeline.ops(info.name)
        # Pallas rules have no architectures: the op rules of what they emit decide.
        archs = [r.archs for kind in (RuleKind.CONSTRAINT, RuleKind.LOWERING)
                 for r in by_kind[kind]]
        rows.append([info.name, info.version, _op_counts(by_kind), describe_archs(archs),
                     info.source])
        details += _op_names(info.name, by_kind)
    lines = _table(["plugin", "version", "ops", "architectures", "source"], rows)
    if not pipeline.plugins:
        lines.append("(no plugins)")
    if verbose and details:
        lines += ["", "ops:", *details]
    if pipeline.overridden:
        lines += ["", "overrides:"]
        lines += [f"  {winner.plugin} overrides {loser.plugin} for {winner.key} "
                  f"({winner.kind.value} rule)" for winner, loser in pipeline.overridden]
    not_loaded = _not_loaded(pipeline)
    if not_loaded:
        lines += ["", "not loaded:", *not_loaded]
    if pipeline.other_jax:
        version = ".".join(map(str, pipeline.jax))
        lines += ["", f"left out, for other jax versions than the installed {version}:"]
        lines += [f"  {r.plugin}: {r.kind.value} rule {r.name} for {r.key} ({r.jax})"
                  for r in pipeline.other_jax]
    lines += ["", _arch_policy_line()]
    if pipeline.problems:
        lines += ["", "problems (these plugins were skipped):"]
        for problem in pipeline.problems:
            lines += [f"  {problem.plugin}:", textwrap.indent(str(problem.error), "    ")]
    return lines


def _quiet_default_pipeline() -> Pipeline:
    # `smalti plugins` lists skipped plugins itself: no need for the warnings too.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return default_pipeline()


def check_report(findings: Sequence[check.Finding], plugins: int, rules: int) -> list[str]:
    """The lines printed by ``smalti plugins --check``."""
    checked = f"checked {plugins} plugin{'s' * (plugins != 1)} ({rules} rules)"
    if not findings:
        return [f"{checked}: no problems"]
    lines = [f"{checked}: {len(findings)} problem{'s' * (len(findings) != 1)}"]
    for finding in findings:
        lines += ["", f"{finding.plugin or 'plugins'}:", textwrap.indent(str(finding.error), "  ")]
    return lines


def cmd_plugins(args: argparse.Namespace) -> int:
    if args.check:
        discovery = discover()
        findings = check.check(discovery)
        names = {p.name for p in discovery.plugins} | {p.plugin for p in discovery.problems}
        for line in check_report(findings, len(names), len(discovery.records)):
            print(line)
        return EXIT_ERROR if findings else EXIT_OK
    for line in plugins_report(_quiet_default_pipeline(), verbose=args.verbose):
        print(line)
    return EXIT_OK


# --- smalti infer ------------------------------------------------------------------------


@contextlib.contextmanager
def _unregistered_dialects(context: ir.Context, allow: bool) -> Iterator[None]:
    """Allows unregistered ops while the command runs; the context may be
    jax's shared one, so the setting is restored afterwards."""
    previous = context.allow_unregistered_dialects
    context.allow_unregistered_dialects = previous or allow
    try:
        yield
    finally:
        context.allow_unregistered_dialects = previous


def read_module(file: str, context: ir.Context) -> ir.Module:
    """Parses textual MLIR from ``file`` (``-`` for stdin); SM301 if it cannot."""
    fixes = ["check the path, and that the file holds MLIR printed by `print(module)`",
             "pass --allow-unregistered-dialect if the module uses ops of an unregistered "
             "dialect"]
    try:
        if file == "-":
            return ir.Module.parse(sys.stdin.read(), context)
        path = Path(file)
        if not path.is_file():
            what = "is a directory" if path.is_dir() else "does not exist"
            raise SmaltiValueError("SM301", f"cannot read {file}: it {what}", fix=fixes[0])
        # parseFile (not parse) so that op locations name the file.
        return ir.Module.parseFile(str(path), context)
    except ir.MLIRError as e:
        diagnostics = str(e).splitlines()[1:] or [str(e)]
        shown = "\n    ".join(["", *diagnostics] if len(diagnostics) > 1 else diagnostics)
        name = "stdin" if file == "-" else file
        raise SmaltiValueError("SM301", f"cannot parse {name} as MLIR",
                               values={"parser": shown}, fix=fixes) from None
    except (OSError, UnicodeDecodeError) as e:
        raise SmaltiValueError("SM301", f"cannot read {file}: {e}", fix=fixes[0]) from None


def _layouts(entry: TraceEntry) -> str:
    return " ".join(f"{name}={value}" for name, value in sorted(entry.summary.items()))


def trace_lines(report: InferenceReport, arch: Arch) -> list[str]:
    """The ``--explain`` trace, as MLIR comments so the output still parses."""
    summary = (f"inference on sm_{arch[0]}{arch[1]}: {report.ops} ops, {report.variables} "
               f"variables, {report.constraints} constraints, {_ms(report.seconds)}")
    rows = [[e.op, e.location or "?", e.plugin, e.rule, _layouts(e)] for e in report.trace]
    table = _table(["op", "location", "plugin", "rule", "layouts"], rows)
    reasons = ["", "why each layout was chosen:"]
    for e in report.trace:
        for name, whys in sorted(e.why.items()):
            reasons.append(f"  {e.op} {name}: " + "; ".join(dict.fromkeys(whys)))
    return [f"// {line}" for line in [summary, *table, *reasons]]


def cmd_infer(args: argparse.Namespace) -> int:
    context = make_context()
    with _unregistered_dialects(context, args.allow_unregistered_dialect):
        try:
            module = read_module(args.file, context)
        except SmaltiError as e:
            _error(e)
            return EXIT_USAGE
        arch = args.arch or recorded_arch(module) or DEFAULT_ARCH
        try:
            report = infer_layouts(module, arch=arch, trace=True)
        except SmaltiError as e:
            _error(e)
            return EXIT_ERROR
        print(module)
        if args.explain:
            print("\n".join(trace_lines(report, arch)))
    return EXIT_OK


# --- smalti lower ------------------------------------------------------------------------


def _per_plugin(title: str, count: int, seconds: float, per_plugin: dict[str, int]) -> list[str]:
    lines = [f"{title}: {count} ops in {_ms(seconds)}"]
    rows = [[f"  {plugin}", str(n)] for plugin, n in sorted(per_plugin.items())]
    lines += _table(["  plugin", "ops"], rows)
    return lines


def lower_summary(inference: InferenceReport, lowering: LoweringReport, arch: Arch) -> list[str]:
    """The summary printed by ``smalti lower``."""
    on = f"on sm_{arch[0]}{arch[1]}"
    lines = _per_plugin(f"layout inference {on}", inference.ops, inference.seconds,
                        inference.ops_per_plugin)
    lines += _per_plugin(f"lowering {on}", lowering.ops, lowering.seconds,
                         lowering.ops_per_plugin)
    lines += ["", "layouts chosen:"]
    lines += _table(["  op", "layouts"], [[f"  {e.op}", _layouts(e)] for e in inference.trace])
    return lines


def _lower_file_error(file: str) -> SmaltiValueError:
    return SmaltiValueError(
        "SM301",
        f"cannot lower {file}: lowering needs the kernel's launch context (its "
        "arguments, TMA descriptors and scratch memory), which textual MLIR does not carry",
        fix=[f"run `smalti infer {file}` to infer the layouts of a file",
             "run `smalti lower` without a file to infer and lower the built-in example",
             "from Python, call smalti.lower(module, launch_context) on a module built with "
             "jax.experimental.mosaic.gpu or smalti.kernels.build_kernel"],
    )


def cmd_lower(args: argparse.Namespace) -> int:
    if args.file is not None:
        _error(_lower_file_error(args.file))
        return EXIT_USAGE
    kernel = example_kernel()
    arch = module_arch(kernel.module)  # what jax built the example for
    try:
        inference = infer_layouts(kernel.module, arch=arch, trace=True)
        lowering = lower(kernel.module, kernel.launch_context, arch=arch)
    except SmaltiError as e:
        _error(e)
        return EXIT_ERROR
    print("built-in example: out = exp(x) * 2 + y on 128x128 f32 (smalti.kernels.example_kernel)")
    print()
    print("\n".join(lower_summary(inference, lowering, arch)))
    if args.print_ir:
        print()
        print(kernel.module)
    return EXIT_OK


# --- smalti conformance ------------------------------------------------------------------


def cmd_conformance(args: argparse.Namespace) -> int:
    from smalti import conformance  # imports jax's test machinery: only when asked

    if args.on_race is not None and args.emulate is None:
        _error(SmaltiValueError(
            "SM301", f"--on-race {args.on_race} without --emulate: only emulated kernels race",
            fix="add --emulate[=ARCH], or drop --on-race"))
        return EXIT_USAGE
    missing = [p for p in [*args.paths, args.expected] if p and not os.path.exists(p)]
    if missing:
        _error(SmaltiValueError(
            "SM301", f"no such file or directory: {missing[0]}",
            fix=_unquoted_pytest_args(args, missing[0], "the paths")
            or "give jax's test files or their directory, and the list of expected tests"))
        return EXIT_USAGE
    return conformance.main(args.paths, args.expected, args.require,
                            shlex.split(args.pytest_args), sys.stdout, reference=args.jax,
                            write_passing=args.write_passing, emulate=args.emulate,
                            timeout=args.timeout, shard=args.shard,
                            write_outcomes=args.write_outcomes, on_race=args.on_race)


def _unquoted_pytest_args(args: argparse.Namespace, first: str, taken_by: str) -> str | None:
    """The fix for ``--pytest-args=-k not slow`` unquoted, where the shell split
    the option's value off (into the paths, or into arguments nobody takes),
    ``first`` being the first word split off: ``None`` where ``--pytest-args``
    does not end with an option, or ``first`` is an option itself."""
    pytest_args = shlex.split(getattr(args, "pytest_args", "") or "")
    if not pytest_args or not pytest_args[-1].startswith("-") or first.startswith("-"):
        return None
    return (f"quote --pytest-args's whole value, option and value together (here "
            f"{pytest_args[-1]} lost its value to {taken_by}): --pytest-args=\"-k 'not slow'\"")


# --- smalti explain ----------------------------------------------------------------------


def cmd_explain(args: argparse.Namespace) -> int:
    if args.code is None:
        rows = [[c.code, c.title] for c in codes.CATALOGUE.values()]
        print("\n".join(_table(["code", "title"], rows)))
        print("\nRun `smalti explain CODE` for the long form of one.")
        return EXIT_OK
    code = args.code.strip().upper()
    if code not in codes.CATALOGUE:
        _error(SmaltiValueError(
            "SM302", f"unknown error code {args.code!r}",
            fix="run `smalti explain` without an argument to list every code"))
        return EXIT_USAGE
    print(codes.CATALOGUE[code].long_form(), end="")
    return EXIT_OK


# --- the parser --------------------------------------------------------------------------


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="smalti", description="A plugin-based middle-end for JAX's Mosaic GPU.")
    parser.add_argument("--version", action="version", version=f"smalti {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    plugins = sub.add_parser("plugins", help="list the plugins, their ops, overrides and problems")
    plugins.add_argument("-v", "--verbose", action="store_true", help="list each plugin's ops")
    plugins.add_argument("--check", action="store_true",
                         help="validate the installed plugins (conflicts, unknown hooks and "
                         "ops, empty architecture ranges); exit 1 on any problem")
    plugins.set_defaults(run=cmd_plugins)

    infer = sub.add_parser("infer", help="infer the layouts of a textual MLIR module")
    infer.add_argument("file", metavar="FILE", help="textual MLIR ('-' reads stdin)")
    infer.add_argument("--arch", type=parse_arch, default=None,
                       help="target architecture, e.g. 9.0 or sm_100a (default: the module's "
                       "mosaic_gpu.arch_* attributes, else 9.0)")
    infer.add_argument("--explain", action="store_true",
                       help="after the module, print which plugin and rule described each op "
                       "and the layouts chosen")
    infer.add_argument("--allow-unregistered-dialect", action="store_true",
                       help="accept ops of dialects MLIR does not know (plugins may handle them)")
    infer.set_defaults(run=cmd_infer)

    lower_ = sub.add_parser("lower", help="infer and lower the built-in example kernel")
    lower_.add_argument("file", metavar="FILE", nargs="?",
                        help="not supported: textual MLIR lacks the launch context lowering needs")
    lower_.add_argument("--print-ir", action="store_true", help="print the lowered module")
    lower_.set_defaults(run=cmd_lower)

    conformance = sub.add_parser(
        "conformance", help="run jax's own Mosaic GPU tests with smalti in place of jax's "
        "inference and lowering, and count them against a list")
    conformance.add_argument("paths", metavar="PATH", nargs="+",
                             help="jax test files or directories (e.g. a jax checkout's "
                             "tests/mosaic)")
    conformance.add_argument("--expected", metavar="FILE",
                             help="the test ids expected to pass, one per line")
    conformance.add_argument("--require", metavar="N", type=int,
                             help="exit 1 if fewer than N expected tests pass (default: all)")
    conformance.add_argument("--jax", action="store_true",
                             help="run under jax's own inference and lowering (the reference), "
                             "to see which tests that jax passes")
    conformance.add_argument("--write-passing", metavar="FILE",
                             help="write the ids of the tests that passed to FILE (with --jax: "
                             "the list to check smalti against)")
    conformance.add_argument("--emulate", metavar="ARCH", nargs="?", const=DEFAULT_ARCH,
                             type=parse_arch, default=None,
                             help="run jax's GPU tests on the CPU: the process answers as an "
                             "NVIDIA GPU of ARCH (default 9.0) and the tests' kernels run on "
                             "smalti's emulator (write --emulate=ARCH, or put it after the "
                             "paths)")
    conformance.add_argument("--on-race", choices=("raise", "warn", "ignore"), default=None,
                             help="with --emulate: what a kernel's data race does -- raise "
                             "(fail the test; the default, or SMALTI_EMULATE_ON_RACE), warn "
                             "(list the test's races and let its assertions decide) or ignore")
    conformance.add_argument("--timeout", metavar="SECONDS", type=float, default=None,
                             help="stop (and fail) a test that runs longer than this")
    conformance.add_argument("--shard", metavar="K/N", type=_shard, default=None,
                             help="run only every N-th test from the K-th (collection order; "
                             "N runs with K = 1..N run each test once: on several cores, or "
                             "as a sample of a long suite)")
    conformance.add_argument("--write-outcomes", metavar="FILE",
                             help="write every test's outcome, seconds, first line of why "
                             "and number of races reported to FILE, tab-separated")
    conformance.add_argument("--pytest-args", metavar="ARGS", default="",
                             help="more pytest options, as one string (e.g. '-x -k tmem')")
    conformance.set_defaults(run=cmd_conformance)

    explain = sub.add_parser("explain", help="explain an error code (no code: list them all)")
    explain.add_argument("code", metavar="CODE", nargs="?", help="an error code, e.g. SM101")
    explain.set_defaults(run=cmd_explain)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = make_parser()
    try:
        args, stray = parser.parse_known_args(argv)
        if stray:
            fix = _unquoted_pytest_args(args, stray[0], "arguments nobody takes")
            if fix is None:
                parser.error(f"unrecognized arguments: {' '.join(stray)}")
            _error(SmaltiValueError("SM301", f"unrecognized arguments: {' '.join(stray)}",
                                    fix=fix))
            return EXIT_USAGE
    except SystemExit as e:  # --help, --version and usage errors: return, don't exit
        return EXIT_OK if e.code is None else e.code if isinstance(e.code, int) else EXIT_USAGE
    run: Callable[[argparse.Namespace], int] | None = getattr(args, "run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return run(args)
    except SmaltiError as e:  # e.g. two plugins claiming one op while building the pipeline
        _error(e)
        return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
