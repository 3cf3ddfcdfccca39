"""The catalogue of smalti's error codes: what each means and how to fix it.

Codes are stable: once published, a code keeps its meaning. ``SM0xx`` are
plugin and pipeline errors, ``SM1xx`` layout inference, ``SM2xx`` lowering,
``SM3xx`` the command line and settings.
"""

from __future__ import annotations

from smalti.records import Record


class Code(Record):
    """One error code: its title, what it means and how to fix it, with an
    example that fails (``before``) and its fix (``after``)."""

    __slots__ = ("code", "title", "explanation", "before", "after")
    code: str
    title: str
    explanation: str
    before: str
    after: str

    def __init__(self, code: str, title: str, explanation: str, before: str = "",
                 after: str = "") -> None:
        self._set(code, title, explanation, before, after)

    def long_form(self) -> str:
        parts = [f"{self.code}: {self.title}", "", self.explanation.strip()]
        if self.before:
            parts += ["", "Before (fails):", "", _indent(self.before)]
        if self.after:
            parts += ["", "After (works):", "", _indent(self.after)]
        return "\n".join(parts) + "\n"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.strip("\n").splitlines())


_CODES = [
    Code(
        "SM001",
        "Two plugins claim the same op",
        """
Two installed plugins register a rule of the same kind (constraint or
lowering) for the same op and for overlapping architectures, and neither
declares that it overrides the other. smalti refuses to pick one silently.
Either uninstall or block one plugin (`SMALTI_BLOCK_PLUGINS=name` or
`build_pipeline(block=[name])`), or have the plugin that should win declare
`overrides="<other plugin>"` when it registers the rule.
""",
        before="""
registry.constraint_rule("arith.addf")(my_rule)      # in plugin "mine"
""",
        after="""
registry.constraint_rule("arith.addf", overrides="smalti.plugins")(my_rule)
""",
    ),
    Code(
        "SM002",
        "Op not supported on the target architecture",
        """
A rule exists for the op, but none of the registered rules supports the
architecture the pipeline targets (for example a Blackwell-only op compiled
for Hopper, sm_90a). jax does not check the architecture, and neither does
smalti by default: it uses the rule whose architecture range comes nearest
and warns with this code (`smalti.ArchitectureWarning`; the inference and
lowering reports list it in `arch_fallbacks`). With the strict setting
(`strict_arch=True`, or `SMALTI_STRICT_ARCH=1`) it is an error. Compile for
an architecture the rule supports, or install a plugin that provides the op
for your architecture.
""",
        before="""
smalti.infer_layouts(module_with_tcgen05_mma, arch=(9, 0), strict_arch=True)
""",
        after="""
smalti.infer_layouts(module_with_tcgen05_mma, arch=(10, 0), strict_arch=True)
""",
    ),
    Code(
        "SM003",
        "No constraint rule for an op",
        """
The kernel contains an op with vector, SMEM or TMEM operands or results, but
no installed plugin registers a constraint (layout inference) rule for it.
Install or write a plugin that does (see docs/writing-plugins.md), check that
the plugin providing it is not blocked, or rewrite the kernel without the op.
""",
        before="""
%y = "mydialect.fancy"(%x) : (vector<128xf32>) -> vector<128xf32>
""",
        after="""
# a plugin registers: registry.constraint_rule("mydialect.fancy")(rule)
""",
    ),
    Code(
        "SM004",
        "No lowering rule for an op",
        """
The kernel contains an op that must be lowered (it carries vector, SMEM or
TMEM values, or belongs to a dialect a plugin declared must be lowered), but
no installed plugin registers a lowering rule for it.
""",
        before="""
"mosaic_gpu.some_new_op"(...)   # no plugin lowers it
""",
        after="""
# a plugin registers: registry.lowering_rule("mosaic_gpu.some_new_op")(rule)
""",
    ),
    Code(
        "SM005",
        "A plugin's rule raised an unexpected exception",
        """
A rule registered by a plugin raised an exception that is not a smalti error.
This is a bug in that plugin; the message names the plugin, the rule and the
op it was applied to. Report it to the plugin's authors, or block the plugin
(`SMALTI_BLOCK_PLUGINS=name`) to fall back to the other installed rules.
""",
    ),
    Code(
        "SM006",
        "A plugin registered or returned something malformed",
        """
A plugin registered a rule that is not callable, for an op name that is not a
string, with an invalid architecture, or a rule returned a value of the wrong
shape (for example a lowering rule returning fewer values than the op has
results, or a constraint rule leaving an operand without a layout variable).
This is a bug in the plugin named in the message.
""",
    ),
    Code(
        "SM007",
        "A plugin could not be loaded",
        """
An entry point in the `smalti` group could not be imported, its
registration hooks raised, or it implements a hook this smalti does not
define or with parameters smalti does not pass (a typo, or a plugin written
for another version of the hook specification; the message names the hook).
The other plugins keep working; block the broken one with
`SMALTI_BLOCK_PLUGINS=name` to silence the error, or fix its installation.
""",
        before="""
@smalti.hookimpl
def smalti_register_lowering_rule(registry): ...   # no such hook
""",
        after="""
@smalti.hookimpl
def smalti_register_lowering_rules(registry): ...
""",
    ),
    Code(
        "SM008",
        "An override names a plugin that does not register that op",
        """
A rule declares `overrides="<plugin>"`, but that plugin is installed and
registers no rule of this kind for the op. The override is stale: the other
plugin probably renamed or dropped the rule. Remove the `overrides=` argument
or point it at the right plugin.
""",
    ),
    Code(
        "SM009",
        "Plugin written for an unsupported hook version",
        """
The plugin declares `SMALTI_HOOK_VERSION` for a version of smalti's hook
specification that this smalti does not support. Upgrade the plugin (or
smalti) so that the two agree.
""",
    ),
    Code(
        "SM010",
        "A rule supports no target architecture",
        """
`smalti plugins --check` found a rule whose architecture range contains no
GPU architecture Mosaic GPU targets: an empty range (`minimum` above
`maximum`) or one outside every known target. Such a rule can never be used,
which is almost always a mistake in its `archs=` argument.
""",
        before="""
registry.lowering_rule("my_ops.mma", archs=Architectures(minimum=(10, 0), maximum=(9, 0)))
""",
        after="""
registry.lowering_rule("my_ops.mma", archs=Architectures(minimum=(9, 0), maximum=(10, 0)))
""",
    ),
    Code(
        "SM011",
        "A rule names an op its dialect does not define",
        """
`smalti plugins --check` found a rule for an op whose dialect is registered
with MLIR (for example `arith` or `mosaic_gpu`) but which that dialect does
not define, so no kernel can contain it: a misspelt op name, or an op the
installed jax does not have. Ops of dialects MLIR does not know (a plugin's
own dialect) are not checked.
""",
        before="""
registry.constraint_rule("arith.add_f")(same_layout)
""",
        after="""
registry.constraint_rule("arith.addf")(same_layout)
""",
    ),
    Code(
        "SM012",
        "No installed plugin has that name",
        """
A plugin was asked for by name — for example `smalti_pipeline("my_plugin")`
in a test using smalti's test kit (`smalti.testing`) — but no entry point of
the `smalti` group has that name. The name of an installed plugin is its
entry-point name (`smalti plugins` lists them). Install the distribution
that provides it, or pass the plugin module itself.
""",
        before="""
pipeline = smalti_pipeline("smalti.plugins", "my_plugin")   # my_plugin not installed
""",
        after="""
import my_plugin
pipeline = smalti_pipeline("smalti.plugins", my_plugin)
""",
    ),
    Code(
        "SM013",
        "A rule's reference does not resolve",
        """
`smalti plugins --check` found a rule that names what it needs by a
`"module:attribute"` reference that cannot be imported: the Pallas primitive
of a Pallas lowering or resource estimator, or the function of a rule
registered as `smalti.registry.deferred("module:function")` (whose module
is imported only when the rule first runs, because it imports Pallas).
Nothing else imports these before a kernel needs them, so a misspelt module
or name would otherwise surface only there. References of a rule registered
for other jax versions only (`jax=`) are not checked.
""",
        before="""
registry.pallas_lowering("jax._src.lax.lax:floor_p")(deferred("my_pkg.lowerings:lower_flor"))
""",
        after="""
registry.pallas_lowering("jax._src.lax.lax:floor_p")(deferred("my_pkg.lowerings:lower_floor"))
""",
    ),
    Code(
        "SM101",
        "No layout assignment satisfies the kernel",
        """
Layout inference found no assignment of register layouts, SMEM transforms
and TMEM layouts that satisfies every op's requirements (jax: "Failed to
infer a possible set of layouts. This should only happen if user-provided
layout casts are unsatisfiable"). The message lists
the requirements that conflict and the op (with its source line) each came
from. Typical causes: a layout cast to a layout the value cannot be converted
to (only splat values can be relaid out freely; tiled layouts only to a few
others), or two ops that need different layouts for the same value. Insert a
`mosaic_gpu.layout_cast` to a layout both sides accept, or remove the cast.
""",
        before="""
%x = mosaic_gpu.vector_load %ref : vector<128x128xf32>
%y = mosaic_gpu.layout_cast %x {new_layout = #mosaic_gpu.WGSplatFragLayout<[128, 128]>}
""",
        after="""
%x = mosaic_gpu.vector_load %ref : vector<128x128xf32>
%y = mosaic_gpu.layout_cast %x {new_layout = #mosaic_gpu.WGStridedFragLayout<[128, 128], 2>}
""",
    ),
    Code(
        "SM102",
        "Layout incompatible with the value's shape",
        """
An op asks for a layout (for example through `mosaic_gpu.layout_cast`) that
cannot represent a value of this shape: a splat or strided layout whose shape
differs from the value's, or a tiled layout whose tile does not divide the
shape. Choose a layout whose shape or tile fits the value.
""",
        before="""
mosaic_gpu.layout_cast %x {new_layout = #mosaic_gpu.WGSplatFragLayout<[64]>} : vector<128xf32>
""",
        after="""
mosaic_gpu.layout_cast %x {new_layout = #mosaic_gpu.WGSplatFragLayout<[128]>} : vector<128xf32>
""",
    ),
    Code(
        "SM103",
        "A ref's producer has no layout variable",
        """
An op uses an SMEM or TMEM ref whose producer is neither an op with a
constraint rule nor a block argument whose owner's rule assigns it a layout.
Layout inference cannot tell which transforms or TMEM layout the ref has.
Produce the ref with an op smalti understands (e.g. `mosaic_gpu.slice_smem`,
`mosaic_gpu.tmem_alloc`), or install a plugin with a rule for its producer.
""",
        before="""
func.func @f(%ref: memref<128xf32, #gpu.address_space<workgroup>>) {
  %x = mosaic_gpu.vector_load %ref   # who decided %ref's transforms?
""",
        after="""
%ref = "mosaic_gpu.slice_smem"() <{offset = 0 : i32}> : () -> memref<128xf32, #gpu.address_space<workgroup>>
%x = mosaic_gpu.vector_load %ref
""",  # noqa: E501 -- MLIR and prose as smalti explain prints them
    ),
    Code(
        "SM104",
        "Layout inference did not converge within its search budget",
        """
The layouts of part of the kernel are ambiguous and the search for a
consistent assignment tried more candidates than its budget allows, or the
solver needed more than the `fuel=` given to `infer_layouts` (which, like
jax's, counts every layout the solver assigns: those propagation implies and
those the search tries; it must be a non-negative int). Add
`mosaic_gpu.layout_cast` ops on the values named in the message to pin their
layouts, which removes the ambiguity, or pass a larger `fuel`.
""",
        before="""
%y = arith.addf %x, %x : vector<128x128xf32>   # thousands of values, no layout pinned
""",
        after="""
%x1 = mosaic_gpu.layout_cast %x {new_layout = #mosaic_gpu.WGStridedFragLayout<[128, 128], 1>}
%y = arith.addf %x1, %x1 : vector<128x128xf32>
""",
    ),
    Code(
        "SM105",
        "Unsupported access to or view of a shared memory ref",
        """
The op reads, writes or re-views an SMEM ref in a way layout inference does
not support: `memref.load` / `memref.store` of a ref that is not a scalar
(shape `[]` or `[1]`), a `memref.subview` with non-unit strides, a
`memref.expand_shape` of a transposed ref, a `memref.collapse_shape` of a
non-contiguous ref or with an empty reassociation, a `memref.cast` that
changes the shape, or a `mosaic_gpu.with_transforms` whose transforms are not
a tiling and/or a swizzle, in that order. Index down to a scalar ref with a
`memref.subview` before loading or storing a single element, move whole tiles
with `mosaic_gpu.vector_load` / `mosaic_gpu.vector_store`, or take the view
on a contiguous ref.
""",
        before="""
%x = memref.load %smem[%i] : memref<64xf32, #gpu.address_space<workgroup>>
""",
        after="""
%s = memref.subview %smem[%i] [1] [1] : memref<64xf32, #gpu.address_space<workgroup>>
       to memref<1xf32, strided<[1], offset: ?>, #gpu.address_space<workgroup>>
%x = memref.load %s[%c0] : memref<1xf32, strided<[1], offset: ?>, #gpu.address_space<workgroup>>
""",
    ),
    Code(
        "SM106",
        "SMEM slices with one alias id disagree",
        """
`mosaic_gpu.slice_smem` ops that carry the same `alias_id` are one ref for
layout inference: they share their transforms, so they must have the same
shape. Give slices of different shapes different alias ids, or make them
the same shape.
""",
        before="""
%a = "mosaic_gpu.slice_smem"() <{alias_id = 0 : i64, offset = 0 : i32}> : () -> memref<128x64xf16, ...>
%b = "mosaic_gpu.slice_smem"() <{alias_id = 0 : i64, offset = 0 : i32}> : () -> memref<64x64xf16, ...>
""",  # noqa: E501 -- MLIR and prose as smalti explain prints them
        after="""
%a = "mosaic_gpu.slice_smem"() <{alias_id = 0 : i64, offset = 0 : i32}> : () -> memref<128x64xf16, ...>
%b = "mosaic_gpu.slice_smem"() <{alias_id = 1 : i64, offset = 0 : i32}> : () -> memref<64x64xf16, ...>
""",  # noqa: E501 -- MLIR and prose as smalti explain prints them
    ),
    Code(
        "SM107",
        "An op's declared layouts or operands do not fit the op",
        """
Some ops declare the layouts of their values themselves, or accept only some
kinds of operands, and layout inference checks them: a
`mosaic_gpu.custom_primitive` needs one `in_layouts` entry per vector
operand, one `in_transforms` entry (a tiling, then a swizzle) per SMEM ref
operand and one `out_layouts` entry per vector result, and cannot take TMEM
refs; a `mosaic_gpu.warp_map` body runs per warp and can only capture
scalars and refs, not vectors. Fix the attributes so that they match the
operands, or pass the values differently (e.g. store a vector to SMEM and
capture the ref).
""",
        before="""
%r = mosaic_gpu.custom_primitive (%x, %y) {in_layouts = [#WGMMA], in_transforms = [],
       out_layouts = [#WGMMA]} : (vector<128x128xf32>, vector<128x128xf32>) -> ...
""",
        after="""
%r = mosaic_gpu.custom_primitive (%x, %y) {in_layouts = [#WGMMA, #WGMMA], in_transforms = [],
       out_layouts = [#WGMMA]} : (vector<128x128xf32>, vector<128x128xf32>) -> ...
""",
    ),
    Code(
        "SM108",
        "An op does not have the operands or attributes its rule expects",
        """
A rule reads the op's operands and attributes and relies on how they fit
together: one GMEM index and one slice length per dimension of the GMEM ref
of a TMA copy, a result per operand of an optimization barrier, 2-D
operands for an MMA, a vector result and valid dims for a reduction. This op
breaks one of those rules. Most such ops also fail the MLIR verifier
(`module.operation.verify()`), which layout inference does not run: verify
the module after building it, and fix the op so that its operands, result
types and attributes agree.
""",
        before="""
mosaic_gpu.async_load %gmem[%i] ... slice_lengths = [64]   # %gmem: memref<64x64xf32>
""",
        after="""
mosaic_gpu.async_load %gmem[%i, %j] ... slice_lengths = [64, 64]
""",
    ),
    Code(
        "SM120",
        "A TMA gather or scatter cannot be expressed",
        """
TMA gathers and scatters move whole rows, chosen by a vector of row indices
for the leading dimension of a global ref, 4 rows at a time, each row 256-bit
aligned in shared memory. A GMEM ref of rank above 2 works when every
gathered row is one contiguous run of memory (full trailing dimensions):
smalti folds it to 2-D. This copy breaks one of those rules: a vector index
on another dimension, rows that are not contiguous, fewer indices than the
GMEM ref has dimensions, a GMEM ref that is not a kernel argument (needed to
fold it), an index vector that is not 1-D or whose length is not a multiple of 4, or a minor slice length that is not a multiple of 256 bits.
Reshape the GMEM ref so that the gathered rows come first and are
contiguous, pad the index vector, or widen the copied rows.
""",  # noqa: E501 -- MLIR and prose as smalti explain prints them
        before="""
mosaic_gpu.async_load %gmem[%rows_vector, %c0] ... slice_lengths = [8, 12] : f32
""",
        after="""
mosaic_gpu.async_load %gmem[%rows_vector, %c0] ... slice_lengths = [8, 64] : f32
""",
    ),
    Code(
        "SM121",
        "An MMA operand's shape does not fit the instruction",
        """
WGMMA (and tcgen05 MMA) read SMEM operands tiled in (8, swizzle-wide) tiles
and keep register operands in the WGMMA layout, which needs 64-row multiples.
An operand's shape is not a multiple of the narrowest tile. Pad the operand,
or choose block sizes that are multiples of the tile (e.g. 64 x 64 for f16).
""",
        before="""
mosaic_gpu.wgmma %acc, %a, %b : memref<64x24xf16, smem> ...
""",
        after="""
mosaic_gpu.wgmma %acc, %a, %b : memref<64x64xf16, smem> ...
""",
    ),
    Code(
        "SM122",
        "A scalar async_store_smem that st.async cannot do",
        """
`plgpu.async_store_smem` of a scalar (jax refuses every scalar: "Scalars are
not supported in async_store_smem") works with smalti installed: one thread
stores the element into the peer's SMEM with `st.async`, and the peer's
barrier expects its bytes. `st.async` stores single 32- or 64-bit values and
cannot reduce, so a scalar of another width (e.g. f16, int8) or an atomic
scalar store cannot be done this way. Store the scalar with a plain SMEM
store and synchronize with a barrier, or store a 1-D value instead.
""",
        before="""
plgpu.async_store_smem(x_f16_scalar, ref.at[0], barrier, cluster_idx=peer, cluster_dim="x")
""",
        after="""
plgpu.async_store_smem(x_f32_scalar, ref.at[0], barrier, cluster_idx=peer, cluster_dim="x")
""",
    ),
    Code(
        "SM130",
        "A vector op's form is not supported",
        """
The op changes the shape of a vector in a way no rule supports, or its
attributes do not describe a valid shape change: a strided slice
(`vector.extract_strided_slice`, `vector.insert_strided_slice`) with strides
other than 1, a `vector.extract` of a sub-vector at a dynamic position, a
`vector.multi_reduction` to a scalar or along no dims, or a
`mosaic_gpu.broadcast_in_dim` whose `broadcast_dimensions` are not one
increasing result dim per source dim (each source dim of size 1 or of the
size of its result dim). Slice with unit strides, index with constants,
reduce to a scalar with `vector.reduction`, or fix the broadcast dimensions.
""",
        before="""
%s = vector.extract_strided_slice %x {offsets = [0, 0], sizes = [64, 64], strides = [2, 1]}
       : vector<128x128xf32> to vector<64x64xf32>
""",
        after="""
%s = vector.extract_strided_slice %x {offsets = [0, 0], sizes = [64, 64], strides = [1, 1]}
       : vector<128x128xf32> to vector<64x64xf32>
""",
    ),
    Code(
        "SM140",
        "A TMEM ref is required, but the value is not a memref",
        """
A tcgen05 or TMEM op (`tcgen05_mma`'s accumulator, TMEM `a`, scales or
sparse metadata; `async_load_tmem`, `async_store_tmem`, the SMEM-to-TMEM
copies, `slice_tmem`, `tmem_layout_cast`, `tmem_dealloc`) takes a value that
is not a memref at all: a vector, a scalar, a pointer. Those operands must be
refs in tensor memory. Allocate the TMEM with `mosaic_gpu.tmem_alloc` (in
Pallas: a `plgpu.TMEM(...)` scratch buffer) and pass that ref, or a
`mosaic_gpu.slice_tmem` of the allocation; move a vector into TMEM with
`async_store_tmem` first.
""",
        before="""
%acc = mosaic_gpu.vector_load %smem : vector<128x128xf32>
mosaic_gpu.tcgen05_mma %acc, %a, %b, %accumulate ...
""",
        after="""
%acc = mosaic_gpu.tmem_alloc smem_ptr(%addr) -> memref<128x128xf32, #mosaic_gpu.tmem>
mosaic_gpu.tcgen05_mma %acc, %a, %b, %accumulate ...
""",
    ),
    Code(
        "SM141",
        "A TMEM ref is required, but the ref is in another memory space",
        """
A tcgen05 or TMEM op takes a memref in global or shared memory where it needs
one in tensor memory (`#mosaic_gpu.tmem`). The tcgen05 instructions read
their accumulator, scales and sparse metadata (and optionally `a`) from TMEM
only. Allocate the buffer in TMEM (`mosaic_gpu.tmem_alloc`; in Pallas a
`plgpu.TMEM(...)` scratch buffer instead of `plgpu.SMEM(...)`), or copy SMEM
data into TMEM with `async_store_smem_to_tmem` first.
""",
        before="""
mosaic_gpu.tcgen05_mma %acc_smem, %a, %b ... : memref<128x128xf32, #gpu.address_space<workgroup>>, ...
""",  # noqa: E501 -- MLIR and prose as smalti explain prints them
        after="""
mosaic_gpu.tcgen05_mma %acc_tmem, %a, %b ... : memref<128x128xf32, #mosaic_gpu.tmem>, ...
""",
    ),
    Code(
        "SM142",
        "A TMEM ref's layout does not match the layout its user expects",
        """
During lowering, a TMEM ref arrives with a layout (recorded by the op that
produced it: `tmem_alloc`, `slice_tmem`, a view) different from the layout
written in its user's `in_tmem_layouts`. TMEM cannot be relaid out, so
producer and user must agree. This happens when the attributes were edited
by hand or inference ran on part of the module only: re-run layout inference
on the whole module, or pin the layout once with `mosaic_gpu.tmem_layout_cast`
right after the allocation.
""",
        before="""
%t = mosaic_gpu.tmem_alloc ... {out_tmem_layouts = [#TMEM_DEFAULT]}
mosaic_gpu.async_load_tmem %t {in_tmem_layouts = [#TMEM_HALF_LANE]} ...
""",
        after="""
smalti.infer_layouts(module)   # producer and users get one layout
""",
    ),
    Code(
        "SM143",
        "A TMEM layout does not fit the TMEM ref",
        """
A TMEM ref's shape cannot hold the layout an op requires: tcgen05 MMA
accumulators and TMEM `a` operands have 128 rows (64 for M=64 MMAs), scales
and sparse metadata have the shapes tcgen05 defines for them, a
`tmem_layout_cast` asks for a layout whose tile does not divide the ref, or
an SMEM-to-TMEM copy targets a ref the default TMEM layout does not fit.
Allocate TMEM of 128 (or 64) rows with a column count that is a multiple of
the layout's tile, or cast to a layout that fits.
""",
        before="""
%acc = mosaic_gpu.tmem_alloc ... -> memref<96x128xf32, #mosaic_gpu.tmem>
""",
        after="""
%acc = mosaic_gpu.tmem_alloc ... -> memref<128x128xf32, #mosaic_gpu.tmem>
""",
    ),
    Code(
        "SM144",
        "Collective and non-collective tcgen05 ops in one kernel",
        """
tcgen05 ops (`tmem_alloc`, `tmem_relinquish_alloc_permit`, `tcgen05_mma`,
`tcgen05_commit_arrive`, the SMEM-to-TMEM copies) have a `collective`
attribute: collective ops work on a pair of CTAs (2-CTA MMA). A kernel runs
either collective tcgen05 ops or single-CTA ones, never both. Make every
tcgen05 op of the kernel agree (in Pallas: pass `collective_axis=` to all of
them and `collective=True` to the `plgpu.TMEM` scratch, or to none).
""",
        before="""
%acc = mosaic_gpu.tmem_alloc ... {collective = true}
mosaic_gpu.tcgen05_mma %acc, %a, %b ... {collective = false}
""",
        after="""
%acc = mosaic_gpu.tmem_alloc ... {collective = true}
mosaic_gpu.tcgen05_mma %acc, %a, %b ... {collective = true}
""",
    ),
    Code(
        "SM145",
        "A block-scaled tcgen05 MMA needs both scales",
        """
A block-scaled `tcgen05_mma` takes a scale ref for `a` and one for `b`, both
in TMEM. Only one of them was given. Pass both (`a_scale` and `b_scale`,
copied to TMEM with `async_store_scales_smem_to_tmem`), or neither for an
unscaled MMA.
""",
        before="""
mosaic_gpu.tcgen05_mma %acc, %a, %b, %accumulate a_scale(%sa) ...
""",
        after="""
mosaic_gpu.tcgen05_mma %acc, %a, %b, %accumulate a_scale(%sa) b_scale(%sb) ...
""",
    ),
    Code(
        "SM146",
        "tmem_dealloc of something other than a TMEM allocation",
        """
`mosaic_gpu.tmem_dealloc` frees the TMEM columns of an allocation, and reads
how many from what `mosaic_gpu.tmem_alloc` returned. It was given a view of
the allocation instead (a `slice_tmem`, a `tmem_layout_cast`, a subview).
Pass the allocation itself.
""",
        before="""
%t = mosaic_gpu.tmem_alloc smem_ptr(%addr) -> memref<128x256xi32, #mosaic_gpu.tmem>
%s = mosaic_gpu.slice_tmem %t offset 0 -> memref<128x256xf32, #mosaic_gpu.tmem>
mosaic_gpu.tmem_dealloc tmem_ref(%s)
""",
        after="""
mosaic_gpu.tmem_dealloc tmem_ref(%t)
""",
    ),
    Code(
        "SM201",
        "An op reached lowering without its layouts",
        """
An op that carries vector values, SMEM refs or TMEM refs has no `in_layouts`
/ `out_layouts` (or transforms, or TMEM layouts) attribute, has the wrong
number of them, or has a register layout made for another shape (a strided
or splat layout of another shape, a tiled layout whose tile does not divide
the vector). Run layout inference first (`smalti.infer_layouts(module)`),
or fix the hand-written attributes so that there is one entry per vector
operand and result.
""",
        before="""
smalti.lower(module, launch_ctx)
""",
        after="""
smalti.infer_layouts(module)
smalti.lower(module, launch_ctx)
""",
    ),
    Code(
        "SM202",
        "No kernel launch in the module",
        """
Lowering works on a Mosaic GPU kernel module: a module whose functions
contain a `gpu.launch` op. Build the module with
`jax.experimental.mosaic.gpu` (e.g. `as_gpu_kernel`) or Pallas.
""",
        before="""
module { func.func @f() { return } }   # a module without gpu.launch
smalti.lower(module, launch_ctx)
""",
        after="""
kernel = smalti.kernels.build_kernel(body, in_shapes, out_shapes)
smalti.infer_layouts(kernel.module)
smalti.lower(kernel.module, kernel.launch_context)
""",
    ),
    Code(
        "SM203",
        "An op cannot be lowered with its layouts",
        """
The op's lowering rule rejected the op as annotated: a layout the lowering
does not support for this op, mismatched operand and result layouts, or an
unsupported attribute value. The message names the layouts involved. Change
the layouts (for example with a `mosaic_gpu.layout_cast`) or let layout
inference choose them.
""",
        before="""
%y = arith.addf %a, %b {in_layouts = [#WGMMA, #WGMMA_ROW], out_layouts = [#WGMMA]}
""",
        after="""
%y = arith.addf %a, %b {in_layouts = [#WGMMA, #WGMMA], out_layouts = [#WGMMA]}
""",
    ),
    Code(
        "SM204",
        "An op inside a warp_map cannot be lowered with warp semantics",
        """
The body of a `mosaic_gpu.warp_map` runs once per warp, not once per
warpgroup ("warp semantics"), and only some lowering rules know how to
lower their op there: barriers, async copies, SMEM/TMEM ref manipulation,
control flow, custom primitives. Ops that work on whole-warpgroup vectors
(vector loads and stores, arithmetic on vectors, MMAs) do not. Move the op
out of the warp_map body, or, if you wrote the rule, handle
`ctx.thread_semantics == WARP` and register it with `warp_semantics=True`.
""",
        before="""
mosaic_gpu.warp_map {
  %x = mosaic_gpu.vector_load %ref : vector<128xf32>
  ...
}
""",
        after="""
%x = mosaic_gpu.vector_load %ref : vector<128xf32>
mosaic_gpu.warp_map {
  mosaic_gpu.arrive %barrier {orders_tensor_core = false}
}
""",
    ),
    Code(
        "SM205",
        "An op does not have the operands or attributes its lowering rule expects",
        """
The op passed layout inference, but its lowering rule cannot lower the form
it has: for example an `arith.select` on vectors whose condition is a single
`i1` rather than a vector of them. MLIR accepts such ops, Mosaic GPU's
code generators do not. Rewrite the op in the form the message names (here:
broadcast the condition to a vector with `vector.broadcast`).
""",
        before="""
%r = arith.select %flag, %x, %y : vector<128xf32>   # %flag : i1
""",
        after="""
%f = vector.broadcast %flag : i1 to vector<128xi1>
%r = arith.select %f, %x, %y : vector<128xi1>, vector<128xf32>
""",
    ),
    Code(
        "SM206",
        "A Pallas primitive cannot be lowered with these operands or parameters",
        """
A plugin lowers this Pallas primitive for Warpgroup semantics (jax has no
such lowering), but not in the form the kernel uses: an operand dtype it
does not cover, a parameter it does not support (for example `accuracy=` on
a transcendental function), or a function body it cannot trace. Or neither
jax nor any installed plugin lowers the primitive at all (jax's phrase
"Unimplemented primitive in Pallas Mosaic GPU lowering"). The message
names the primitive, its operand types, the kernel's source line and what to
write instead.
""",
        before="""
o_ref[...] = jnp.tan(x_ref[...].astype(jnp.float64))
""",
        after="""
o_ref[...] = jnp.tan(x_ref[...]).astype(o_ref.dtype)   # f32, f16 or bf16
""",
    ),
    Code(
        "SM207",
        "A jax error escaped Pallas' lowering of a primitive",
        """
While smalti is installed, an exception that Pallas' rule for a primitive
(jax's own, or a plugin's) or Mosaic GPU's code generators under it raised
-- an `AssertionError`, a `ValueError`, a `TypeError` of the MLIR bindings
-- is reported with this code, the primitive, its operand types, the
kernel's line and jax's message; so is a rule that returns a value of the
wrong kind (a 0-D vector for a scalar, a vector of another shape), which
Pallas would refuse with a bare `AssertionError` and no line. The error is
still an instance of the class jax raised. Rewrite the line with functions
that lower, or lower the primitive in a plugin.
""",
        before="""
o_ref[...] = lax.bitcast_convert_type(x_ref[0, 0], jnp.int32) + y  # jax: a 0-D vector
""",
        after="""
o_ref[...] = lax.bitcast_convert_type(x_ref[...], jnp.int32) + y   # on the array
""",
    ),
    Code(
        "SM301",
        "The command-line input could not be read",
        """
`smalti infer FILE` reads textual MLIR. The file does not exist or does not
parse as MLIR with the Mosaic GPU dialects loaded: check the path, and that
the file was printed by MLIR (e.g. `print(module)`). `smalti lower FILE` is
refused with this code too: lowering needs the kernel's launch context
(buffers, scratch memory), which textual MLIR does not carry; `smalti lower`
without a file lowers the built-in example end to end.
""",
    ),
    Code(
        "SM302",
        "Unknown error code",
        """
`smalti explain CODE` was given a code smalti does not define. Run
`smalti explain` without an argument to list every code.
""",
    ),
    Code(
        "SM303",
        "A bad worker count for the emulator",
        """
The emulator runs a grid's clusters on several processes when the grid is
big enough (`smalti.emulate.run(..., workers=N)`, `run_module`, `on_cpu`,
or the environment variable `SMALTI_EMULATE_WORKERS`). The value must be a
whole number of processes, at least 1 (1: every cluster in the calling
process, one after another), or `auto`, the default: as many as the cores
the process may use. Anything else -- 0, a negative number, a fraction, a
word -- is refused with this code, naming where the value came from.
""",
    ),
]

CATALOGUE: dict[str, Code] = {c.code: c for c in _CODES}
