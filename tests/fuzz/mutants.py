"""Mutation fuzzing: real Mosaic GPU modules, mutated so they still verify,
run through jax's middle-end and smalti's.

A *seed* is the textual module (with locations) that layout inference would
see: an official Pallas kernel's module captured inside
``mgpu_core.lower_mgpu_module``, a kernel built with the dialect bindings
(``smalti.kernels``, ``tests.fuzz.kernels``), a kernel using jax's profiler.
A *mutant* is a seed plus ``random.Random(number)`` driving one to three
mutations (:data:`MUTATIONS`); it is rebuilt from text in a fresh context,
with a fresh launch context, every time it is run, so jax and smalti each
get their own copy. :func:`run_mutant` classifies what happens
(:class:`Outcome`); the classes in :data:`BUGS` are smalti's bugs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
import re
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import memref
from jax.experimental.mosaic.gpu import core as mgpu_core
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import launch_context as lc
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import utils as mgpu_utils

import smalti
from smalti import codes, kernels
from tests.differential import normalized

#: Codes a raising call may leave the module changed with: none, since
#: lowering puts the module back when rewriting fails (docs/robustness.md,
#: fix 6); before that, SM005, SM006 and SM203 raised mid-rewrite did.
REWRITE_TIME_CODES: frozenset[str] = frozenset()
#: A call slower than this is a bug.
SLOW_SECONDS = 10.0
#: Outcome classes that are smalti's bugs.
BUGS = frozenset({"BUG non-smalti exception", "BUG module changed by a raising call",
                  "BUG slow call", "BUG malformed error", "BUG both accept, output differs"})
#: Both accept, with different attributes: a parity note, not a robustness bug.
PARITY = "both accept, attributes differ"
ARCHS = ((8, 0), (9, 0), (10, 0), (10, 3), (12, 0))


@dataclass(frozen=True)
class Seed:
    name: str
    text: str  # the module before layout inference, with locations


# --- building modules ------------------------------------------------------------------


def module_text(module: ir.Module) -> str:
    return module.operation.get_asm(enable_debug_info=True)


def _launch(module: ir.Module) -> ir.OpView:
    for op in module.body.operations:
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    if inner.operation.name == "gpu.launch":
                        return inner
    raise ValueError("no gpu.launch")


def _cluster(launch: ir.OpView) -> tuple[int, int, int]:
    sizes = [getattr(launch, f"clusterSize{d}", None) for d in "XYZ"]
    if any(s is None for s in sizes):
        return (1, 1, 1)
    return tuple(ir.IntegerAttr(s.owner.opview.value).value for s in sizes)  # type: ignore


def instantiate(text: str) -> kernels.Kernel:
    """The module of ``text`` in a fresh context, with a fresh launch context
    (what ``mgpu_core._launch`` makes: the kernel's buffers argument, its
    scratch and cluster; no profiler, which lowering does not use)."""
    context = kernels.make_context()
    with context, ir.Location.unknown(context):
        module = ir.Module.parse(text)
        launch = _launch(module)
        func = launch.operation.parent.opview
        buffers = func.regions[0].blocks[0].arguments[1]
        launch_context = lc.LaunchContext(module, lc.Scratch(launch), _cluster(launch), buffers)
    return kernels.Kernel(context, module, launch_context)


def recorded_arch(module: ir.Module) -> tuple[int, int]:
    attributes = module.operation.attributes
    return (ir.IntegerAttr(attributes["mosaic_gpu.arch_major"]).value,
            ir.IntegerAttr(attributes["mosaic_gpu.arch_minor"]).value)


# --- seeds -------------------------------------------------------------------------------


@contextlib.contextmanager
def gpu_facts(arch: tuple[int, int]) -> Iterator[None]:
    """What Pallas asks of the (absent) GPU, as tests.official does with monkeypatch."""
    from jax.extend import backend

    device = types.SimpleNamespace(core_count=132)
    saved = backend.get_default_device, mgpu_utils._infer_arch, jax.local_devices
    backend.get_default_device = lambda: device
    mgpu_utils._infer_arch = lambda: arch
    jax.local_devices = lambda *a, **k: [device]
    try:
        yield
    finally:
        backend.get_default_device, mgpu_utils._infer_arch, jax.local_devices = saved


def capture_before_inference(fn: Callable, *args, arch: tuple[int, int] = (9, 0)) -> list[str]:
    """Lowers ``fn`` for CUDA on the CPU (jax's own pipeline); returns each
    Warpgroup module as layout inference receives it."""
    captured: list[str] = []
    current = mgpu_core.lower_mgpu_module

    def spy(module, launch_ctx, semantics, **kwargs):
        if semantics == mgpu_core.LoweringSemantics.Warpgroup:
            kernels.canonicalize(module)  # what lower_mgpu_module does first
            captured.append(module_text(module))
        current(module, launch_ctx, semantics, **kwargs)

    mgpu_core.lower_mgpu_module = spy
    jax.clear_caches()
    try:
        with gpu_facts(arch):
            jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    except ValueError:
        # A profiled kernel's trace dump is a host callback, which cannot be
        # lowered for CUDA on the CPU: its Mosaic GPU module came before.
        if not captured:
            raise
    finally:
        mgpu_core.lower_mgpu_module = current
    return captured


def _sds(shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def official_seeds() -> list[Seed]:
    """The official Pallas kernels (hopper and blackwell matmuls, mixed-type
    matmul, attention) in a few configurations."""
    from jax.experimental.pallas.ops.gpu import attention_mgpu as attention
    from jax.experimental.pallas.ops.gpu import blackwell_matmul_mgpu as bw
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm
    from jax.experimental.pallas.ops.gpu import hopper_mixed_type_matmul_mgpu as mixed

    f16 = jnp.float16
    a, b = _sds((512, 256), f16), _sds((256, 512), f16)
    cases: list[tuple[str, Callable, tuple, tuple[int, int]]] = [
        ("hopper_matmul", lambda a, b: hm.matmul(a, b, None, hm.TuningConfig(
            tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)), (a, b), (9, 0)),
        ("hopper_matmul_64", lambda a, b: hm.matmul(a, b, None, hm.TuningConfig(
            tile_m=64, tile_n=64, tile_k=64, max_concurrent_steps=4,
            grid_minor_dim=hm.MatmulDimension.N, grid_tile_width=4)), (a, b), (9, 0)),
        ("mixed_matmul", lambda a, b: mixed.mixed_matmul_kernel(
            a, b, out_dtype=f16, config=mixed.TuningConfig(
                tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)),
         (_sds((256, 256), jnp.int8), _sds((256, 512), f16)), (9, 0)),
        ("attention", lambda q, k, v: attention.attention_with_pipeline_emitter(
            q, k, v, attention.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2)),
         (_sds((1, 256, 2, 64), f16),) * 3, (9, 0)),
        ("blackwell_matmul", lambda a, b: bw.matmul_kernel(a, b, bw.TuningConfig(
            tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2, collective=False)),
         (a, _sds((256, 1024), f16)), (10, 0)),
        ("blackwell_matmul_collective", lambda a, b: bw.matmul_kernel(a, b, bw.TuningConfig(
            tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2, collective=True)),
         (a, _sds((256, 1024), f16)), (10, 0)),
    ]
    seeds = []
    for name, fn, args, arch in cases:
        for i, text in enumerate(capture_before_inference(fn, *args, arch=arch)):
            seeds.append(Seed(f"{name}#{i}" if i else name, text))
    return seeds


def profiled_kernel(prof: bool = True, smem_transforms: bool = True) -> str:
    """A kernel built like ``mgpu.as_gpu_kernel(..., prof_spec=...)`` with
    Warpgroup semantics: named regions become profiler custom primitives."""
    from jax.experimental.mosaic.gpu import profiler

    context = kernels.make_context()
    f16 = _sds((128, 128), jnp.float16)
    spec = profiler.ProfilerSpec(entries_per_warpgroup=256) if prof else None

    def body(ctx, x, out, smem):
        [scratch] = smem
        if smem_transforms:
            scratch = mgpu.with_transforms(scratch, ir.ArrayAttr.get([
                mgpu_layouts.to_transform_attr(lc.TileTransform((64, 64))),
                mgpu_layouts.to_transform_attr(mgpu.SwizzlingMode.k128ByteSwizzle)]))
        with ctx.named_region("load"):
            value = mgpu.vector_load(x)
        with ctx.named_region("store"):
            mgpu.vector_store(value, scratch)
            mgpu.vector_store(mgpu.vector_load(scratch), out)

    with context, ir.Location.file("profiled.py", 1, 1):
        module, _, _, _ = mgpu_core._lower_as_gpu_kernel(
            body, (1, 1, 1), (1, 1, 1), (128, 1, 1), (f16,), (f16,), (), (f16,),
            mgpu_core.LoweringSemantics.Warpgroup, "profiled", "profiled", prof_spec=spec)
        kernels.canonicalize(module)
    return module_text(module)


def pallas_profiled_seed() -> str:
    """A Pallas kernel compiled with a profile space (``plgpu.CompilerParams``)."""
    import tempfile

    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    del pl

    def kernel(x_ref, o_ref):
        with jax.named_scope("scale"):
            o_ref[...] = x_ref[...] * 2 + 1

    params = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup,
                                  profile_space=16, profile_dir=tempfile.gettempdir())
    fn = plgpu.kernel(kernel, out_type=_sds((128, 128), jnp.float32), compiler_params=params)
    [text] = capture_before_inference(fn, _sds((128, 128), jnp.float32))
    return text


def built_seeds(count: int = 12) -> list[Seed]:
    """Kernels built with the dialect bindings: the example, random kernels of
    tests.fuzz.kernels, and profiled ones."""
    from tests.fuzz.kernels import well_formed

    seeds = [Seed("example", module_text(kernels.example_kernel().module)),
             Seed("profiled", profiled_kernel()),
             Seed("profiled_untransformed", profiled_kernel(smem_transforms=False)),
             Seed("transformed", profiled_kernel(prof=False))]
    seeds += [Seed(f"random{s}", module_text(well_formed(s).build().module))
              for s in range(count)]
    return seeds


@functools.cache
def default_seeds(official: bool = True) -> tuple[Seed, ...]:
    seeds = built_seeds()
    seeds.append(Seed("pallas_profiled", pallas_profiled_seed()))
    if official:
        seeds += official_seeds()
    return tuple(seeds)


# --- mutations ---------------------------------------------------------------------------

SMEM = "#gpu.address_space<workgroup>"
#: Other spellings of memory spaces the dialect accepts (3 is workgroup).
SPACES = ("3", "#gpu.address_space<private>", "5", "#gpu.address_space<global>", "1",
          "#mosaic_gpu.smem_cluster")


def _body_ops(module: ir.Module) -> list[ir.Operation]:
    """Every op inside the gpu.launch, pre-order."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> None:
        for region in op.regions:
            for block in region.blocks:
                for child in block.operations:
                    found.append(child.operation)
                    visit(child.operation)

    visit(_launch(module).operation)
    return found


def _refs(module: ir.Module, smem_only: bool = False) -> list[ir.Value]:
    refs = []
    for op in _body_ops(module):
        for value in op.results:
            if isinstance(value.type, ir.MemRefType) and (
                    not smem_only or mgpu_utils.is_smem_ref(value.type)):
                refs.append(value)
    return refs


def _rewire(value: ir.Value, new: ir.Value, new_op: ir.Operation, rnd: random.Random) -> None:
    """All uses of ``value`` (but ``new_op``'s), or one of them, now use ``new``."""
    uses = [u for u in value.uses if u.owner != new_op]
    if uses and rnd.random() < 0.4:
        use = rnd.choice(uses)
        use.owner.operands[use.operand_number] = new
    else:
        value.replace_all_uses_except(new, new_op)


def _after(value: ir.Value) -> ir.InsertionPoint:
    owner = value.owner
    if isinstance(owner, ir.Block):
        return ir.InsertionPoint.at_block_begin(owner)
    return ir.InsertionPoint.after(owner)


def _ref_type(ty: ir.MemRefType, space: str | None = "", offset: str | None = None) -> ir.Type:
    """``ty`` in another memory space (``None``: none; ``""``: its own) or with a
    strided layout of offset ``offset``."""
    shape = "x".join(str(d) for d in ty.shape)
    parts = [f"{shape}x{ty.element_type}" if shape else str(ty.element_type)]
    if offset is not None:
        strides, _ = ty.get_strides_and_offset()
        parts.append(f"strided<[{', '.join(str(s) for s in strides)}], offset: {offset}>")
    elif str(ty.layout) != str(ir.MemRefType.get(ty.shape, ty.element_type).layout):
        parts.append(str(ty.layout))  # not the identity
    space = (str(ty.memory_space) if ty.memory_space is not None else None) if space == "" \
        else space
    if space is not None:
        parts.append(space)
    return ir.Type.parse(f"memref<{', '.join(parts)}>")


def respell_smem_everywhere(module: ir.Module, rnd: random.Random) -> str | None:
    """Every ``#gpu.address_space<workgroup>`` of the module spelled ``3``
    (or another space), in text."""
    text = module_text(module)
    if SMEM not in text:
        return None
    space = rnd.choice(("3", "3", "#gpu.address_space<private>", "5"))
    return _replace_text(module, text.replace(SMEM, space), f"smem spelled {space}")


def space_cast(module: ir.Module, rnd: random.Random) -> str | None:
    """A ref cast to another memory space, some or all uses rewired."""
    refs = _refs(module)
    if not refs:
        return None
    ref = rnd.choice(refs)
    space = rnd.choice(SPACES + (None,))
    with _after(ref):
        new = memref.memory_space_cast(_ref_type(ir.MemRefType(ref.type), space), ref)
    _rewire(ref, new, new.owner.operation, rnd)
    return f"memory_space_cast to {space}"


def extra_with_transforms(module: ir.Module, rnd: random.Random) -> str | None:
    """A ``mosaic_gpu.with_transforms`` on some ref, some or all uses rewired."""
    refs = _refs(module, smem_only=rnd.random() < 0.7) or _refs(module)
    if not refs:
        return None
    ref = rnd.choice(refs)
    ty = ir.MemRefType(ref.type)
    choices: list[list[object]] = [[]]
    if len(ty.shape) >= 2:
        choices += [[lc.TileTransform((64, 64))],
                    [lc.TileTransform((8, 64)), mgpu.SwizzlingMode.k128ByteSwizzle],
                    [lc.TileTransform((8, 32)), mgpu.SwizzlingMode.k64ByteSwizzle],
                    [mgpu.SwizzlingMode.k128ByteSwizzle]]
    transforms = rnd.choice(choices)
    attr = ir.ArrayAttr.get([mgpu_layouts.to_transform_attr(t) for t in transforms])
    with _after(ref):
        new = mgpu.with_transforms(ref, attr)
    _rewire(ref, new, new.owner.operation, rnd)
    return f"with_transforms {[str(t) for t in transforms]} on {ty}"


def cast_to_dynamic_offset(module: ir.Module, rnd: random.Random) -> str | None:
    """A ``memref.cast`` of some ref to a dynamic offset, some or all uses rewired."""
    refs = [r for r in _refs(module) if ir.MemRefType(r.type).has_static_shape]
    if not refs:
        return None
    ref = rnd.choice(refs)
    with _after(ref):
        new = memref.cast(_ref_type(ir.MemRefType(ref.type), offset="?"), ref)
    _rewire(ref, new, new.owner.operation, rnd)
    return f"memref.cast of {ref.type} to a dynamic offset"


def _replace_text(module: ir.Module, text: str, what: str) -> str | None:
    """Replaces the body of ``module`` by the module of ``text`` (None if it
    does not parse)."""
    try:
        new = ir.Module.parse(text, context=module.context)
    except ir.MLIRError:
        return None
    for op in list(module.body.operations):
        op.operation.erase()
    for op in list(new.body.operations):
        module.body.append(op.operation)
    attributes = new.operation.attributes
    for name in list(attributes):
        module.operation.attributes[name] = attributes[name]
    return what


_VECTOR_OR_REF = re.compile(r"\b(vector|memref)<((?:\d+x)+)(f32|f16|bf16|i8|i32)")


def change_shape(module: ir.Module, rnd: random.Random) -> str | None:
    """One shape of vectors (or refs) changed everywhere it is written."""
    text = module_text(module)
    found = sorted({m.group(0) for m in _VECTOR_OR_REF.finditer(text)})
    if not found:
        return None
    old = rnd.choice(found)
    kind, dims, element = _VECTOR_OR_REF.match(old).groups()  # type: ignore[union-attr]
    shape = [int(d) for d in dims.rstrip("x").split("x")]
    i = rnd.randrange(len(shape))
    shape[i] = rnd.choice([d for d in (1, 2, 8, 32, 64, 128, 256, 192) if d != shape[i]])
    new = f"{kind}<{'x'.join(map(str, shape))}x{element}"
    return _replace_text(module, re.sub(re.escape(old) + r"(?=[x,>])", new, text),
                         f"{old} -> {new}")


def change_element_type(module: ir.Module, rnd: random.Random) -> str | None:
    """One element type of vectors and refs changed everywhere it is written."""
    text = module_text(module)
    present = sorted({m.group(3) for m in _VECTOR_OR_REF.finditer(text)})
    if not present:
        return None
    old = rnd.choice(present)
    new = rnd.choice([t for t in ("f32", "f16", "bf16", "i8", "i32") if t != old])
    changed = _VECTOR_OR_REF.sub(
        lambda m: m.group(0)[:-len(old)] + new if m.group(3) == old else m.group(0), text)
    return _replace_text(module, changed, f"{old} -> {new}")


def rewire_operand(module: ir.Module, rnd: random.Random) -> str | None:
    """An operand replaced by another value of its type defined before it in its block."""
    ops = [op for op in _body_ops(module) if len(op.operands)]
    rnd.shuffle(ops)
    for op in ops[:20]:
        index = rnd.randrange(len(op.operands))
        old = op.operands[index]
        candidates = []
        for other in op.block.operations:
            if other.operation == op:
                break
            candidates += [r for r in other.results if r.type == old.type and r != old]
        candidates += [a for a in op.block.arguments if a.type == old.type and a != old]
        if candidates:
            op.operands[index] = rnd.choice(candidates)
            return f"operand {index} of {op.name} rewired"
    return None


def extra_layout_cast(module: ir.Module, rnd: random.Random) -> str | None:
    """A ``mosaic_gpu.layout_cast`` on some vector, some or all uses rewired."""
    vectors = [r for op in _body_ops(module) for r in op.results
               if isinstance(r.type, ir.VectorType)]
    if not vectors:
        return None
    value = rnd.choice(vectors)
    shape = tuple(ir.VectorType(value.type).shape)
    options: list[fa.FragmentedLayout] = [fa.WGStridedFragLayout(shape, v) for v in (1, 2, 4)
                                          if len(shape) and shape[-1] % v == 0]
    if len(shape) == 2:
        options += [fa.WGMMA_LAYOUT, fa.TCGEN05_LAYOUT, fa.WGMMA_TRANSPOSED_LAYOUT]
    elif len(shape) == 1:
        options += [fa.WGMMA_ROW_LAYOUT, fa.WGMMA_COL_LAYOUT]
    if not options:
        return None
    layout = rnd.choice(options)
    try:
        attr = mgpu_layouts.to_layout_attr(layout)
    except Exception:  # noqa: BLE001 - a layout this shape cannot have
        return None
    with _after(value):
        new = mgpu.layout_cast(value, attr)
    _rewire(value, new, new.owner.operation, rnd)
    return f"layout_cast to {attr}"


def drop_op(module: ir.Module, rnd: random.Random) -> str | None:
    """An op whose results are unused (a store, a barrier...) erased."""
    ops = [op for op in _body_ops(module)
           if not len(op.regions) and all(not list(r.uses) for r in op.results)
           and op.name not in ("gpu.terminator", "scf.yield", "mosaic_gpu.return")]
    if not ops:
        return None
    op = rnd.choice(ops)
    name = op.name
    op.erase()
    return f"{name} erased"


def other_arch(module: ir.Module, rnd: random.Random) -> str | None:
    """The module recorded (and inferred) for another architecture."""
    arch = rnd.choice([a for a in ARCHS if a != recorded_arch(module)])
    i32 = ir.IntegerType.get_signless(32)
    module.operation.attributes["mosaic_gpu.arch_major"] = ir.IntegerAttr.get(i32, arch[0])
    module.operation.attributes["mosaic_gpu.arch_minor"] = ir.IntegerAttr.get(i32, arch[1])
    return f"arch {arch}"


MUTATIONS: dict[str, Callable[[ir.Module, random.Random], str | None]] = {
    "respell_smem": respell_smem_everywhere,
    "space_cast": space_cast,
    "with_transforms": extra_with_transforms,
    "dynamic_offset": cast_to_dynamic_offset,
    "shape": change_shape,
    "element_type": change_element_type,
    "rewire": rewire_operand,
    "layout_cast": extra_layout_cast,
    "drop_op": drop_op,
    "arch": other_arch,
}


@dataclass(frozen=True)
class Mutant:
    seed: str
    number: int
    text: str | None  # None: no verifiable mutant came out
    mutations: tuple[str, ...]


def mutate(seed: Seed, number: int) -> Mutant:
    """Seed ``seed`` mutated by ``Random(number)``: one to three mutations,
    the result verified (``text`` is None if it does not verify)."""
    rnd = random.Random(number)
    context = kernels.make_context()
    applied: list[str] = []
    with context, ir.Location.file("mutation", number % 100000, 1):
        module = ir.Module.parse(seed.text)
        for _ in range(rnd.choice((1, 1, 2, 3))):
            name = rnd.choice(list(MUTATIONS))
            try:
                what = MUTATIONS[name](module, rnd)
            except (ValueError, ir.MLIRError):  # e.g. a type the bindings refuse to build
                what = None
            if what is not None:
                applied.append(f"{name}: {what}")
        if not applied:
            return Mutant(seed.name, number, None, ())
        try:
            module.operation.verify()
        except ir.MLIRError:
            return Mutant(seed.name, number, None, tuple(applied))
        return Mutant(seed.name, number, module_text(module), tuple(applied))


# --- running a mutant --------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    kind: str  # the class (see classify)
    detail: str  # codes, exception types
    seconds: float  # slowest smalti call
    jax_error: str = ""
    smalti_error: str = ""


def _timed(step: Callable[[], object]) -> tuple[BaseException | None, float]:
    start = time.perf_counter()
    try:
        step()
        error = None
    except Exception as e:  # noqa: BLE001 - classified by the caller
        error = e
    return error, time.perf_counter() - start


def _jax_run(text: str) -> tuple[str, BaseException | None, str | None]:
    """jax's inference then lowering: (the step that failed or "", its error,
    the module text after inference, if it succeeded)."""
    from jax.experimental.mosaic import gpu as jax_mgpu

    kernel = instantiate(text)
    arch = recorded_arch(kernel.module)
    with kernel.context, ir.Location.unknown(kernel.context):
        error, _ = _timed(lambda: jax_mgpu.infer_layout(kernel.module, arch=arch))
        if error is not None:
            return "infer", error, None
        inferred = normalized(kernel.module)
        error, _ = _timed(lambda: jax_mgpu.lower_mgpu_dialect(kernel.module,
                                                              kernel.launch_context))
        if error is not None:
            return "lower", error, inferred
        return "", None, inferred + "\n//--\n" + normalized(kernel.module)


def error_problem(error: smalti.SmaltiError) -> str | None:
    """What is wrong with a smalti error, if anything: a code, a message, a
    fix and (for op codes) the op."""
    if error.code not in codes.CATALOGUE:
        return f"unknown code {error.code}"
    if not error.message or not error.fixes:
        return f"{error.code} without message or fix"
    if error.code[2] in "12" and error.code != "SM202" and not error.op:
        return f"{error.code} names no op"
    return None


def _smalti_run(text: str) -> tuple[str, Outcome | None, str | None, float]:
    """smalti's inference then lowering; an Outcome if it misbehaved or
    refused, else the module text after inference and after lowering."""
    kernel = instantiate(text)
    arch = recorded_arch(kernel.module)
    slowest = 0.0
    inferred = None
    steps = (("infer_layouts", lambda: smalti.infer_layouts(kernel.module, arch=arch)),
             ("lower", lambda: smalti.lower(kernel.module, kernel.launch_context)))
    for what, step in steps:
        before = module_text(kernel.module)
        error, seconds = _timed(step)
        slowest = max(slowest, seconds)
        if seconds > SLOW_SECONDS:
            return what, Outcome("BUG slow call", f"{what} {seconds:.1f} s", slowest), None, slowest
        if error is not None:
            if not isinstance(error, smalti.SmaltiError):
                return what, Outcome("BUG non-smalti exception",
                                     f"{what}: {type(error).__name__}: {error}", slowest,
                                     smalti_error=repr(error)), None, slowest
            problem = error_problem(error)
            if problem is not None:
                return what, Outcome("BUG malformed error", problem, slowest,
                                     smalti_error=str(error)), None, slowest
            changed = module_text(kernel.module) != before
            if changed and (what == "infer_layouts" or error.code not in REWRITE_TIME_CODES):
                return what, Outcome("BUG module changed by a raising call",
                                     f"{what} {error.code}", slowest,
                                     smalti_error=str(error)), None, slowest
            kind = "rewrite-time" if changed else "refused"
            return what, Outcome(kind, error.code, slowest, smalti_error=str(error)), None, slowest
        if what == "infer_layouts":
            inferred = normalized(kernel.module)
    return "", None, f"{inferred}\n//--\n{normalized(kernel.module)}", slowest


def _arch_of_text(text: str) -> tuple[int, int]:
    found = re.search(r"mosaic_gpu.arch_major = (\d+) : i32, mosaic_gpu.arch_minor = (\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def _jax_label(step: str, error: BaseException | None) -> str:
    return "ok" if error is None else f"{step} {type(error).__name__}"


def run_mutant(text: str) -> Outcome:
    """Runs a mutant through jax and smalti and classifies the outcome:

    - ``ok``: both accept, same attributes and IR;
    - ``both refuse``, ``smalti refuses, jax accepts``, ``jax refuses, smalti
      accepts``: with the codes and jax's exception;
    - ``BUG ...`` (:data:`BUGS`): a non-smalti exception, a module changed
      by a raising call (other than a rewrite-time code), a call over 10 s,
      an error without code/op/fix, or different output where both accept.
    """
    jax_step, jax_error, jax_text = _jax_run(text)
    arch = _arch_of_text(text)
    step, ours, our_text, seconds = _smalti_run(text)
    theirs = _jax_label(jax_step, jax_error)
    jax_message = "" if jax_error is None else f"{type(jax_error).__name__}: {jax_error}"[:300]
    if ours is not None and ours.kind.startswith("BUG"):
        return dataclasses.replace(ours, detail=f"{ours.detail} (jax: {theirs})",
                                   jax_error=jax_message)
    if ours is not None:
        code = f"{step} {ours.detail}"
        what = "refuse" if ours.kind == "refused" else "refuse (rewrite-time)"
        if jax_error is None:
            return Outcome(f"smalti {what}s, jax accepts", code, seconds, jax_message,
                           ours.smalti_error)
        return Outcome(f"both {what}", f"{code} / jax {theirs}", seconds, jax_message,
                       ours.smalti_error)
    if jax_error is not None:
        if jax_text is not None and jax_step == "lower":
            inferred = our_text.split("\n//--\n")[0]
            if inferred != jax_text:
                return Outcome("jax refuses, smalti accepts", f"jax {theirs}; attributes differ",
                               seconds, jax_message)
        return Outcome("jax refuses, smalti accepts", f"jax {theirs}", seconds, jax_message)
    if our_text != jax_text:
        ours_inferred = our_text.split("\n//--\n")[0]
        theirs_inferred = jax_text.split("\n//--\n")[0]
        if ours_inferred != theirs_inferred:
            # Inference's choices differ from jax's: a parity note (the
            # lowered IR then differs too), reported, not a robustness bug.
            return Outcome(PARITY, f"attributes differ at sm_{arch[0]}{arch[1]}", seconds)
        return Outcome("BUG both accept, output differs", "lowered IR", seconds)
    return Outcome("ok", "", seconds)


def run_smalti_only(text: str) -> Outcome:
    """:func:`run_mutant` without jax: only smalti's robustness classes
    (``smalti accepts``, ``smalti refuses``, ``rewrite-time`` and the bugs)."""
    step, ours, _, seconds = _smalti_run(text)
    if ours is None:
        return Outcome("smalti accepts", "", seconds)
    if ours.kind.startswith("BUG"):
        return ours
    return dataclasses.replace(ours, kind=f"smalti {ours.kind}", detail=f"{step} {ours.detail}")
