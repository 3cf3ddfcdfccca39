"""The inline-PTX templates of jax's Mosaic GPU code generators, read from
the source of the installed jax (``jax/experimental/mosaic/gpu/*.py``).

Every call of ``llvm.inline_asm`` (the asm string, its third argument) and of
``utils.inline_ptx`` (its first) is a *site*. Its string expression is
resolved to templates, over the source text only (``ast``):

* a literal is itself; an f-string keeps ``{expr}`` for each placeholder;
* ``a + b`` and ``x if c else y`` give every combination / both branches;
* a local name gives what each assignment to it in the enclosing functions
  gives; a parameter gives what the literal arguments of the calls of its
  function in the same file give (``_lift_fast_instr("max.NaN.f32")``);
* ``"sep".join(lines)`` gives one *block* template whose lines are what the
  ``lines.append(...)`` calls give (each checked as an instruction).

:func:`expand` then substitutes each placeholder by the values the code can
give it (:data:`VALUES`, keyed by the placeholder's source text); a
placeholder the code around it does not settle stays as ``«source»`` (the
brackets keep it apart from PTX's own braces). :func:`problems` judges a
template with such placeholders by its instruction: it looks the string up
with each remaining placeholder read as one operand ``$9`` (the table looks
one-instruction strings up by opcode), so a placeholder inside an opcode
leaves it unmodelled unless listed."""

from __future__ import annotations

import ast
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

#: values a placeholder can take, by its source text (what the code around it
#: can give; checked by reading the code each time jax changes)
VALUES: dict[str, list[str]] = {
    "ptx_round": ["rn", "rz", "rp"],
    "name_8": ["e4m3", "e5m2", "ue8m0"],
    "name_16": ["f16", "bf16"],
    "f16_ptx_names[new_dtype]": ["f16", "bf16"],
    "f16_ptx_names[cur_dtype]": ["f16", "bf16"],
    "part": ["0", "1", "2", "3"],
    "part + 4": ["4", "5", "6", "7"],
    "lut[0]": ["1145059328"], "lut[1]": ["1313622600"],
    "lut[2]": ["3402419920"], "lut[3]": ["3091252424"],
    "0x4342 if high else 0x4140": ["17218", "16704"],
    "low_prmt": ["5140", "6251", "7362", "7473"],
    "high_prmt": ["7362", "7473", "7777"],
    "WARPGROUP_SIZE": ["128"],
    "memory_scope": ["gpu", "sys", "cta", "cluster"],
    "rank": ["1", "2", "3", "4", "5"],
    "ptx_scope": ["cta", "cluster"],
    "self._ptx_scope": ["cta", "cluster"],
}


#: f-strings whose placeholders vary together, by their source text: what
#: ``FragmentedArray.astype``'s f8 conversions can give (ue8m0 rounds rz/rp,
#: only to and from bf16; e4m3/e5m2 round rn)
TEMPLATES: dict[str, list[str]] = {
    "cvt.{ptx_round}.satfinite.{name_8}x2.f32": [
        "cvt.rn.satfinite.e4m3x2.f32", "cvt.rn.satfinite.e5m2x2.f32",
        "cvt.rz.satfinite.ue8m0x2.f32", "cvt.rp.satfinite.ue8m0x2.f32"],
    "cvt.{ptx_round}.satfinite.{name_8}x2.{name_16}x2": [
        f"cvt.rn.satfinite.{n8}x2.{n16}x2" for n8 in ("e4m3", "e5m2") for n16 in ("f16", "bf16")
    ] + ["cvt.rz.satfinite.ue8m0x2.bf16x2", "cvt.rp.satfinite.ue8m0x2.bf16x2"],
    "cvt.rn.{name_16}x2.{name_8}x2": [
        f"cvt.rn.{n16}x2.{n8}x2" for n8 in ("e4m3", "e5m2") for n16 in ("f16", "bf16")
    ] + ["cvt.rn.bf16x2.ue8m0x2"],
}


@dataclass
class Site:
    """One call that emits inline PTX: file, line, and its templates."""

    file: str
    line: int
    templates: list[str] = field(default_factory=list)
    blocks: list[list[str]] = field(default_factory=list)  # line templates of joined blocks


def _functions(tree: ast.AST) -> dict[ast.AST, list[ast.AST]]:
    """For every node, the chain of function definitions enclosing it, innermost first."""
    chains: dict[ast.AST, list[ast.AST]] = {}

    def visit(node, chain):
        for child in ast.iter_child_nodes(node):
            inner = [child, *chain] if isinstance(child, (ast.FunctionDef, ast.Lambda)) else chain
            chains[child] = chain
            visit(child, inner)
    visit(tree, [])
    return chains


class _Resolver:
    def __init__(self, tree: ast.Module, source: str) -> None:
        self.tree, self.source = tree, source
        self.lines = [line.encode() for line in source.splitlines(keepends=True)]
        self.chains = _functions(tree)
        self.calls: dict[str, list[ast.Call]] = {}
        for n in ast.walk(tree):
            if isinstance(n, ast.Call):
                f = n.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(
                    f, ast.Attribute) else None
                self.calls.setdefault(name, []).append(n)
        self._assigns: dict[int, dict[str, list[ast.AST]]] = {}
        self._memo: dict[tuple, list[str]] = {}

    def text(self, node: ast.AST) -> str:
        """The source of ``node`` (ast.get_source_segment, without re-splitting the file)."""
        if getattr(node, "end_lineno", None) is None:
            return ast.dump(node)
        l0, l1 = node.lineno - 1, node.end_lineno - 1
        if l0 == l1:
            return self.lines[l0][node.col_offset:node.end_col_offset].decode()
        parts = [self.lines[l0][node.col_offset:], *self.lines[l0 + 1:l1],
                 self.lines[l1][:node.end_col_offset]]
        return b"".join(parts).decode()

    def assigns(self, fn: ast.FunctionDef) -> dict[str, list[ast.AST]]:
        """name -> the values assigned to it anywhere in ``fn`` (computed once)."""
        if id(fn) not in self._assigns:
            table: dict[str, list[ast.AST]] = {}
            for n in ast.walk(fn):
                if isinstance(n, ast.Assign):
                    for t in n.targets:
                        if isinstance(t, ast.Name):
                            table.setdefault(t.id, []).append(n.value)
            self._assigns[id(fn)] = table
        return self._assigns[id(fn)]

    def templates(self, node: ast.AST, scope: list, depth: int = 0) -> list[str]:
        key = (id(node), id(scope[0]) if scope else None)
        if key not in self._memo:
            self._memo[key] = list(dict.fromkeys(self._templates(node, scope, depth)))
        return self._memo[key]

    def _templates(self, node: ast.AST, scope: list, depth: int) -> list[str]:
        if depth > 8:
            return ["«" + self.text(node) + "»"]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.JoinedStr):
            if self.text(node)[2:-1] in TEMPLATES:
                return TEMPLATES[self.text(node)[2:-1]]
            # a placeholder repeated in one string takes one value throughout
            names, values = [], {}
            for v in node.values:
                if not isinstance(v, ast.Constant):
                    src = self.text(v.value)
                    if src not in values:
                        names.append(src)
                        values[src] = list(dict.fromkeys(self.placeholder(v.value, scope, depth)))
            while math.prod(len(values[n]) for n in names) > 512:  # keep the widest as text
                widest = max(names, key=lambda n: len(values[n]))
                values[widest] = ["«" + widest + "»"]
            out = []
            for combo in itertools.product(*(values[n] for n in names)):
                pick = dict(zip(names, combo))
                out.append("".join(v.value if isinstance(v, ast.Constant)
                                   else pick[self.text(v.value)] for v in node.values))
            return out
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return [a + b for a in self.templates(node.left, scope, depth + 1)
                    for b in self.templates(node.right, scope, depth + 1)]
        if isinstance(node, ast.IfExp):
            return (self.templates(node.body, scope, depth + 1)
                    + self.templates(node.orelse, scope, depth + 1))
        if isinstance(node, ast.Name):
            found = self.assigned(node.id, scope, depth)
            if found is not None:
                return found
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "join" and len(node.args) == 1
                and isinstance(node.args[0], ast.Name) and self.block_lines(
                    node.args[0].id, self.chains.get(node, scope))):
            return ["«join:" + node.args[0].id + "»"]
        return ["«" + self.text(node) + "»"]

    def placeholder(self, expr: ast.AST, scope: list, depth: int) -> list[str]:
        src = self.text(expr)
        if src in VALUES:
            return VALUES[src]
        if isinstance(expr, (ast.IfExp, ast.Name)):
            found = self.templates(expr, scope, depth + 1)
            if not any("«join:" in f for f in found):
                return found
        return ["«" + src + "»"]

    def assigned(self, name: str, scope: list, depth: int) -> list[str] | None:
        """What ``name`` holds in the innermost enclosing function that binds it."""
        for fn in scope:
            if not isinstance(fn, ast.FunctionDef):
                continue
            values = self.assigns(fn).get(name)
            if values:
                return [t for v in values
                        for t in self.templates(v, self.chains.get(v, scope), depth + 1)]
            params = [a.arg for a in fn.args.args + fn.args.kwonlyargs]
            if name in params:
                return self.arguments(fn, params.index(name), depth)
        return None

    def arguments(self, fn: ast.FunctionDef, index: int, depth: int) -> list[str] | None:
        """The templates of argument ``index`` at every call of ``fn`` in the file."""
        skip_self = 1 if fn.args.args and fn.args.args[0].arg == "self" else 0
        out = []
        for call in self.calls.get(fn.name, []):
            k = index - skip_self if isinstance(call.func, ast.Attribute) and skip_self else index
            if k < len(call.args):
                out += self.templates(call.args[k], self.chains.get(call, []), depth + 1)
        return out or None

    def block_lines(self, name: str, scope: list) -> list[str]:
        """The line templates appended to list ``name`` in the innermost function."""
        out = []
        for fn in scope[:1]:
            for n in ast.walk(fn):
                if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                        and n.func.attr == "append" and n.args
                        and isinstance(n.func.value, ast.Name) and n.func.value.id == name):
                    out += self.templates(n.args[0], self.chains.get(n, scope))
        return out


def sites(directory: Path) -> list[Site]:
    """Every inline-PTX site of the ``*.py`` files of ``directory``."""
    found = []
    for path in sorted(directory.glob("*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        res = _Resolver(tree, source)
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            f = call.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(
                f, ast.Name) else None
            if name == "inline_asm" and isinstance(f, ast.Attribute) and f.value is not None \
                    and res.text(f.value) == "llvm":
                arg = call.args[2] if len(call.args) > 2 else next(
                    (k.value for k in call.keywords if k.arg == "asm_string"), None)
            elif name == "inline_ptx":
                arg = call.args[0] if call.args else next(
                    (k.value for k in call.keywords if k.arg == "ptx"), None)
            else:
                continue
            scope = res.chains.get(call, [])
            if (isinstance(arg, ast.Name) and scope and isinstance(scope[0], ast.FunctionDef)
                    and scope[0].name == "inline_ptx"):
                continue  # inline_ptx's own call: its callers are the sites
            site = Site(path.name, call.lineno)
            for t in res.templates(arg, scope):
                joined = re.search(r"«join:(\w+)»", t)
                if joined:
                    site.blocks.append(res.block_lines(joined[1], scope))
                else:
                    site.templates.append(t)
            found.append(site)
    return found


PREDICATE = re.compile(r"^@!?\$\d+\s+")


def instructions(template: str) -> list[str]:
    """The instructions of a template: its ``;``-separated statements, without
    comments, a block's own braces, declarations or predicates."""
    text = "\n".join(line.split("//")[0] for line in template.splitlines())
    out = []
    for stmt in text.split(";"):
        s = " ".join(stmt.split())
        s = re.sub(r"^(?:\{ ?)+|(?: ?\})+$", "", s).strip()  # a block's lone braces
        s = PREDICATE.sub("", s)
        if s and not s.startswith(".reg"):
            out.append(s)
    return out


def not_modelled_table(doc: str) -> list[tuple[re.Pattern, str]]:
    """(pattern, reason) of docs/emulator.md's table of the PTX not modelled."""
    start, end = "<!-- ptx-not-modelled -->\n", "\n<!-- /ptx-not-modelled -->"
    table = doc[doc.index(start) + len(start):doc.index(end)]
    rows = []
    for line in table.splitlines()[2:]:
        m = re.fullmatch(r"\| `(.+?)` \| (.+) \|", line)
        assert m, f"malformed row of the not-modelled PTX table: {line!r}"
        rows.append((re.compile(m[1].replace("\\|", "|")), m[2]))
    return rows


PLACEHOLDER = re.compile(r"«[^«»]*»")


def _in_block(instr: str) -> bool:
    from smalti.emulate.ops import ptx_block
    if instr.startswith("mov.b"):  # any width jax computes is one mov.b8-64 models
        instr = PLACEHOLDER.sub("32", instr)
    opcode = instr.split()[0]
    return bool(ptx_block.MOV.fullmatch(opcode) or ptx_block.semantics(opcode))


def problems(site: Site, listed: list[tuple[re.Pattern, str]]) -> list[str]:
    """The templates of ``site`` that are neither modelled (the emulator's
    table looks them up; a joined block: every line is an instruction its
    block interpreter models) nor hold an instruction the table lists."""
    from smalti.emulate.ops import inline_asm

    def is_listed(instrs):
        return any(p.match(i) for i in instrs for p, _ in listed)
    out = []
    for t in site.templates:
        if inline_asm.lookup(PLACEHOLDER.sub("$9", t)) is None and not is_listed(instructions(t)):
            out.append(f"{site.file}:{site.line}: {' '.join(t.split())!r}")
    for block in site.blocks:
        instrs = [i for line in block for i in instructions(line)]
        if not all(_in_block(i) for i in instrs) and not is_listed(instrs):
            bad = [i for i in instrs if not _in_block(i)]
            out.append(f"{site.file}:{site.line}: joined block with {bad!r}")
    return out


def needed_rows(found: list[Site], listed: list[tuple[re.Pattern, str]]) -> set[str]:
    """The patterns of ``listed`` that some template of ``found`` needs: one
    the emulator's table does not model (a joined block: one with a line its
    block interpreter does not model) holds an instruction it matches."""
    from smalti.emulate.ops import inline_asm

    needed: set[str] = set()

    def mark(instrs: list[str]) -> None:
        needed.update(p.pattern for i in instrs for p, _ in listed if p.match(i))
    for site in found:
        for t in site.templates:
            if inline_asm.lookup(PLACEHOLDER.sub("$9", t)) is None:
                mark(instructions(t))
        for block in site.blocks:
            instrs = [i for line in block for i in instructions(line)]
            if not all(_in_block(i) for i in instrs):
                mark(instrs)
    return needed
