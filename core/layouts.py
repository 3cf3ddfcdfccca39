"""Layout constants: what a variable of the constraint language can be assigned.

Three kinds, one per memory space:

- :class:`RegisterLayout` wraps a Mosaic GPU ``FragmentedLayout`` (splat,
  strided or tiled) and is the layout of a vector value in registers;
- :class:`SmemTransforms` is the tiling and swizzle of a ref in shared memory;
- :class:`TmemLayout` wraps a ``tcgen05.TMEMLayout`` and is the layout of a
  ref in tensor memory.

This module also holds what is true of layouts regardless of ops: which
layouts fit which shapes, which relayouts exist, and how constants are encoded
as the MLIR attributes jax uses.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable
from typing import Literal, cast

import numpy as np
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import launch_context as lc
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import tcgen05
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.caching import per_context
from smalti.records import HashedRecord
from smalti.registry import installed_jax


class MemorySpace(enum.Enum):
    """Where a variable's value lives, which decides the kind of its layout."""

    REG = "registers"
    SMEM = "smem"
    TMEM = "tmem"

    # Members are singletons compared by identity: hash them by identity too
    # (Enum's own __hash__ runs Python code, and inference hashes them often).
    __hash__ = object.__hash__


#: The attributes holding the layouts of an op's operands and results, by
#: memory space: ``(operands' attribute, results' attribute)``.
ATTRIBUTE_NAMES: dict[MemorySpace, tuple[str, str]] = {
    MemorySpace.REG: ("in_layouts", "out_layouts"),
    MemorySpace.SMEM: ("in_transforms", "out_transforms"),
    MemorySpace.TMEM: ("in_tmem_layouts", "out_tmem_layouts"),
}

Swizzle = Literal[32, 64, 128] | None
SWIZZLES = (128, 64, 32)


class RegisterLayout(HashedRecord):  # the solver hashes them often
    """A known register layout for a vector value."""

    __slots__ = ("layout",)
    layout: fa.FragmentedLayout

    def __init__(self, layout: fa.FragmentedLayout) -> None:
        self._set(layout)

    @classmethod
    def of(cls, layout: fa.FragmentedLayout) -> RegisterLayout:
        """The one ``RegisterLayout`` of ``layout`` in this process. Rules that
        pin layouts should use it: the solver and its caches compare
        constants by identity first, and equal but distinct layouts cost a
        deep comparison each time they meet."""
        return _shared_register_layout(layout)

    @classmethod
    def splat(cls, shape: tuple[int, ...]) -> RegisterLayout:
        """``RegisterLayout.of(fa.WGSplatFragLayout(shape))``, memoized by
        the shape: rules pin splat constants and scalar broadcasts op after
        op, and making and hashing the layout each time is slow."""
        return _shared_splat_layout(shape)

    def fits(self, shape: tuple[int, ...]) -> bool:
        """Whether a vector of ``shape`` can be held in this layout (memoized
        by the constant, which hashes once; see :func:`register_layout_fits`)."""
        return _constant_fits(self, shape)

    @property
    def is_splat(self) -> bool:
        return isinstance(self.layout, fa.WGSplatFragLayout)

    @property
    def is_tiled(self) -> bool:
        return isinstance(self.layout, fa.TiledLayout)

    def __str__(self) -> str:
        return describe_register_layout(self.layout)


@functools.lru_cache(maxsize=1024)
def _shared_register_layout(layout: fa.FragmentedLayout) -> RegisterLayout:
    return RegisterLayout(layout)


@functools.lru_cache(maxsize=1024)
def _shared_splat_layout(shape: tuple[int, ...]) -> RegisterLayout:
    return RegisterLayout.of(fa.WGSplatFragLayout(shape))


class SmemTransforms(HashedRecord):  # the solver hashes them often
    """Known transforms of a ref in shared memory.

    ``tiling`` is ``None`` for an untiled ref. ``swizzle`` is the swizzle
    pattern length in bytes (32, 64 or 128), ``None`` for no swizzle. The
    swizzle is not permuted when a tiling is transposed.
    """

    __slots__ = ("tiling", "swizzle")
    tiling: tuple[int, ...] | None
    swizzle: Swizzle

    def __init__(self, tiling: Iterable[int] | None, swizzle: Swizzle = None) -> None:
        if swizzle is not None and swizzle not in SWIZZLES:
            raise ValueError(f"swizzle must be one of {SWIZZLES} or None, got {swizzle}")
        if tiling is not None:
            tiling = tuple(tiling)
            if not tiling:
                raise ValueError("an empty tiling is not supported; use tiling=None")
        self._set(tiling, swizzle)

    def __str__(self) -> str:
        parts = []
        if self.tiling is not None:
            parts.append(f"tile{self.tiling}")
        if self.swizzle is not None:
            parts.append(f"swizzle{self.swizzle}")
        return "transforms(" + ", ".join(parts) + ")"


class TmemLayout(HashedRecord):  # the solver hashes them often
    """A known layout of a ref in tensor memory."""

    __slots__ = ("layout",)
    layout: tcgen05.TMEMLayout

    def __init__(self, layout: tcgen05.TMEMLayout) -> None:
        self._set(layout)

    def __str__(self) -> str:
        if self.layout == tcgen05.tmem_default_layout(self.layout.vector_length):
            return f"TMEM_DEFAULT(packing={self.layout.vector_length})"
        return f"TMEM({self.layout})"


Constant = RegisterLayout | SmemTransforms | TmemLayout
CONSTANT_TYPES = (RegisterLayout, SmemTransforms, TmemLayout)

_NAMED_LAYOUTS = {
    "WGMMA": fa.WGMMA_LAYOUT,
    "WGMMA_ROW": fa.WGMMA_ROW_LAYOUT,
    "WGMMA_COL": fa.WGMMA_COL_LAYOUT,
    "WGMMA_TRANSPOSED": fa.WGMMA_TRANSPOSED_LAYOUT,
    "WGMMA_8BIT": fa.WGMMA_LAYOUT_8BIT,
    "WGMMA_UPCAST_2X": fa.WGMMA_LAYOUT_UPCAST_2X,
    "WGMMA_UPCAST_4X": fa.WGMMA_LAYOUT_UPCAST_4X,
    "TCGEN05": fa.TCGEN05_LAYOUT,
    "TCGEN05_TRANSPOSED": fa.TCGEN05_TRANSPOSED_LAYOUT,
    "TCGEN05_ROW": fa.TCGEN05_ROW_LAYOUT,
    "TCGEN05_COL": fa.TCGEN05_COL_LAYOUT,
    "TMEM_NATIVE": fa.TMEM_NATIVE_LAYOUT,
}


def describe_register_layout(layout: fa.FragmentedLayout) -> str:
    """A short human name for a register layout (``WGMMA``, ``strided[128,128]x2``...)."""
    match layout:
        case fa.WGSplatFragLayout(shape=shape):
            return f"splat{list(shape)}"
        case fa.WGStridedFragLayout(shape=shape, vec_size=vec):
            return f"strided{list(shape)}x{vec}"
    for name, named in _NAMED_LAYOUTS.items():
        if layout == named:
            return name
    return str(layout)


# --- validity: which constants fit which values ---------------------------------


@functools.lru_cache(maxsize=4096)
def register_layout_fits(shape: tuple[int, ...], layout: fa.FragmentedLayout) -> bool:
    """Whether a vector of ``shape`` can be held in registers with ``layout``."""
    match layout:
        case fa.WGSplatFragLayout() | fa.WGStridedFragLayout():
            return tuple(layout.shape) == tuple(shape)
        case fa.TiledLayout():
            try:
                layout.tiling.tile_shape(tuple(shape))
            except ValueError:
                return False
            return True
    return False


@functools.lru_cache(maxsize=4096)
def _constant_fits(constant: RegisterLayout, shape: tuple[int, ...]) -> bool:
    return register_layout_fits(tuple(shape), constant.layout)


def tmem_layout_fits(shape: tuple[int, ...], layout: tcgen05.TMEMLayout) -> bool:
    try:
        layout.tiling.tile_shape(tuple(shape))
    except ValueError:
        return False
    return True


def tiled_strides(strides: tuple[int, ...], tiling: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a ref after tiling its trailing dims by ``tiling``.

    The result has the untiled leading strides, then one stride per tile index
    dimension, then one per in-tile dimension. Raises ``ValueError`` when the
    tiled dimensions are not the minor ones or the strides are not tileable.
    """
    n = len(tiling)
    if len(strides) < n:
        raise ValueError(f"strides {strides} have lower rank than tiling {tiling}")
    lead, tail = list(strides[:-n]), list(strides[-n:])
    if lead and min(lead) < max(tail):
        raise ValueError(f"tiled dimensions of {strides} are not the minor ones")
    # Order tiled dims from major to minor by stride (stable for equal strides).
    order = sorted(range(n), key=lambda i: (-tail[i], i))
    in_tile = [0] * n
    running = 1
    for i in reversed(order):
        in_tile[i] = running
        running *= tiling[i]
    tile_size = running
    tile_index = [0] * n
    running = tile_size
    previous: tuple[int, int] | None = None  # the stride and tile of the last dim seen
    for i in reversed(order):
        stride = tail[i]
        if previous is not None:
            prev_stride, prev_tile = previous
            needed = prev_stride * prev_tile
            if stride % needed:
                raise ValueError(f"stride {stride} is not divisible by {needed}")
            running *= stride // needed
        tile_index[i] = running
        previous = stride, tiling[i]
    return (*lead, *tile_index, *in_tile)


def smem_transforms_fit(ref_type: ir.MemRefType, transforms: SmemTransforms) -> bool:
    """Whether an SMEM ref of ``ref_type`` can carry ``transforms``."""
    shape = tuple(ref_type.shape)
    tiling, swizzle = transforms.tiling, transforms.swizzle
    if not shape:
        return tiling is None and swizzle is None
    ref_strides, _ = ref_type.get_strides_and_offset()
    strides = tuple(ref_strides)
    if min(strides) != 1:
        # Swizzles and tilings assume a contiguous minor dimension.
        return tiling is None and swizzle is None
    bitwidth = mgpu_utils.bitwidth(ref_type.element_type)
    swizzle_elems = None if swizzle is None else 8 * swizzle // bitwidth
    several_unit_strides = strides.count(1) > 1
    if tiling is None:
        if swizzle_elems is None:
            return True
        if several_unit_strides:
            return False
        return shape[int(np.argmin(strides))] % swizzle_elems == 0
    if len(tiling) > len(shape):
        return False
    if any(s % t for s, t in zip(shape[-len(tiling):], tiling)):
        return False
    if several_unit_strides:
        return swizzle_elems is None
    try:
        new_strides = tiled_strides(strides, tiling)
    except ValueError:
        return False
    if swizzle_elems is None:
        return True
    minor = int(np.argmin(new_strides[-len(tiling):]))
    return tiling[minor] % swizzle_elems == 0


# --- size-1 dimensions in tiled layouts ------------------------------------------


def _insert_unit_dim(layout: fa.TiledLayout, axis: int) -> fa.TiledLayout:
    tiles = layout.tiling.tiles
    rank = len(tiles[0])
    new_tiles = []
    for tile in tiles:
        covered_from = rank - len(tile)  # tiles cover the trailing dims of the base tile
        if axis >= covered_from:
            at = axis - covered_from
            tile = (*tile[:at], 1, *tile[at:])
        new_tiles.append(tile)
    tiling = fa.Tiling(tuple(new_tiles))
    # The new tiled dims are the old ones, in order, plus those from `axis`.
    from_axis = tiling.tile_dimension(axis)
    old_positions = [i for i, new in enumerate(from_axis) if not new]
    old_len, new_len = len(old_positions), len(from_axis)

    def moved_dim(dim: int) -> int:
        return old_positions[old_len + dim] - new_len

    def moved(dim: int | fa.Replicated) -> int | fa.Replicated:
        return dim if isinstance(dim, fa.Replicated) else moved_dim(dim)

    return fa.TiledLayout(
        tiling,
        tuple(map(moved, layout.warp_dims)),
        tuple(map(moved, layout.lane_dims)),
        moved_dim(layout.vector_dim),
        _check_canonical=False,
    ).canonicalize()


def insert_unit_dims(layout: fa.TiledLayout, axes: tuple[int, ...]) -> fa.TiledLayout:
    """``layout`` with size-1 dims inserted into its tiling at ``axes`` (sorted
    positions in the new base tile). A size-1 dim moves no element, so the
    registers keep their order: only unit axes are added to their array."""
    for axis in sorted(axes):
        layout = _insert_unit_dim(layout, axis)
    return layout


def remove_unit_dims(layout: fa.TiledLayout, axes: tuple[int, ...]) -> fa.TiledLayout:
    """The inverse of :func:`insert_unit_dims`: drops tiled size-1 dims ``axes``."""
    for axis in sorted(axes, reverse=True):
        layout = layout.remove_dimension(axis)
    return layout


# --- relayouts ----------------------------------------------------------------


#: jax 0.12's code generators also convert WGMMA registers back to the 2x
#: upcast layout (and layout inference allows that cast); 0.11's do not. A
#: fact of the installed jax, resolved once at import.
_WGMMA_TO_UPCAST_2X = installed_jax() >= (0, 12)


def _tiled_relayout_supported(src: fa.TiledLayout, dst: fa.TiledLayout, bitwidth: int) -> bool:
    transposes = {
        (fa.WGMMA_LAYOUT, fa.WGMMA_TRANSPOSED_LAYOUT),
        (fa.TCGEN05_LAYOUT, fa.TCGEN05_TRANSPOSED_LAYOUT),
    }
    if (src, dst) in transposes or (dst, src) in transposes:
        return True
    if (src, dst) == (fa.WGMMA_LAYOUT_UPCAST_2X, fa.WGMMA_LAYOUT) or (
            _WGMMA_TO_UPCAST_2X and (src, dst) == (fa.WGMMA_LAYOUT, fa.WGMMA_LAYOUT_UPCAST_2X)):
        return fa.can_relayout_wgmma_2x_to_wgmma(bitwidth)
    if (src, dst) == (fa.WGMMA_LAYOUT_UPCAST_4X, fa.WGMMA_LAYOUT_UPCAST_2X):
        return fa.can_relayout_wgmma_4x_to_wgmma_2x(bitwidth)
    if (src, dst) == (fa.WGMMA_LAYOUT_UPCAST_4X, fa.WGMMA_LAYOUT):
        return fa.can_relayout_wgmma_4x_to_wgmma_2x(bitwidth) and fa.can_relayout_wgmma_2x_to_wgmma(
            bitwidth
        )
    # TMEM-native layouts differ only in vector length: registers move freely.
    return src == fa.tmem_native_layout(src.vector_length) and dst == fa.tmem_native_layout(
        dst.vector_length
    )


def can_relayout(
    src: fa.FragmentedLayout, dst: fa.FragmentedLayout, *, bitwidth: int, strict: bool
) -> bool:
    """Whether registers in ``src`` can be converted to ``dst``.

    Splat values broadcast to any layout that fits their shape. A strict
    relayout allows nothing else; a non-strict one (an explicit layout cast)
    also allows the tiled-to-tiled conversions Mosaic GPU implements.
    """
    if src == dst:
        return True
    match src, dst:
        case fa.WGSplatFragLayout(), fa.WGStridedFragLayout():
            return tuple(src.shape) == tuple(dst.shape)
        case fa.WGSplatFragLayout(), fa.TiledLayout():
            return mgpu_layouts.splat_is_compatible_with_tiled(src, dst)
        case fa.TiledLayout(), fa.TiledLayout() if not strict:
            return _tiled_relayout_supported(src, dst, bitwidth)
    return False


# --- attribute encoding (the one jax uses) ---------------------------------------


def to_attribute(constant: Constant) -> ir.Attribute:
    """Encodes a constant as jax encodes it in ``*_layouts`` / ``*_transforms``."""
    match constant:
        case RegisterLayout(layout=layout):
            return mgpu_layouts.to_layout_attr(layout)
        case TmemLayout(layout=layout):
            return mgpu_layouts.to_layout_attr(layout)
        case SmemTransforms(tiling=tiling, swizzle=swizzle):
            parts = []
            if tiling is not None:
                parts.append(mgpu_layouts.to_transform_attr(lc.TileTransform(tiling)))
            if swizzle is not None:
                parts.append(mgpu_layouts.to_transform_attr(mgpu.SwizzlingMode(swizzle)))
            return ir.ArrayAttr.get(parts)
    raise TypeError(f"not a layout constant: {constant!r}")


@per_context  # lowering decodes the same few attributes for every SMEM op
def smem_transforms_from_attribute(attr: ir.Attribute) -> SmemTransforms:
    tiling, swizzle = None, None
    for transform in ir.ArrayAttr(attr):
        decoded = mgpu_layouts.from_transform_attr(transform)
        if isinstance(decoded, lc.TileTransform):
            tiling = tuple(decoded.tiling)
        elif isinstance(decoded, mgpu.SwizzlingMode):
            swizzle = (cast(Swizzle, int(decoded.value))
                       if decoded != mgpu.SwizzlingMode.kNoSwizzle else None)
        else:
            raise ValueError(f"unsupported SMEM transform {transform}")
    return SmemTransforms(tiling, swizzle)
