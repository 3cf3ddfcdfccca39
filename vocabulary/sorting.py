"""Sorting inside Pallas Mosaic GPU kernels: ``sort`` (``jnp.sort``,
``jnp.argsort``, ``lax.sort`` of several operands with ``num_keys``) and
``top_k`` (``lax.top_k``), along either axis of a 1-D or 2-D block.

How: a bitonic sorting network along the sorted axis, written as a jax
function over :func:`smalti.vocabulary.movement.take` and lowered by Pallas'
``_lower_fun``. Each element carries a list of int32 *words* compared
lexicographically (or is one float32 word, below); a stage (``log2(P)
(log2(P) + 1) / 2`` of them for a power-of-two length ``P``) fetches every
word of the partner ``i ^ j`` with one ``take`` each and keeps the smaller
or the larger pair of words. Other
lengths are padded to the next power of two with words greater than any
element's (and cut off again by the ``take`` that reads the result).

Words (what makes the order exactly lax's):

- a float's key is its bit pattern as an integer, the magnitude bits
  flipped for negative values (``s ^ 0x7fffffff`` if ``s < 0``): integer
  order is then IEEE total order. ``sort`` first makes every zero ``+0`` and
  every NaN one NaN, as lax.sort does (so ``-0.0`` and ``0.0`` are equal
  and keep their order, NaNs sort last in their order); ``top_k`` does not,
  as lax.top_k does not (``+NaN > inf > ... > 0.0 > -0.0 > ... > -NaN``).
  Integers are their own key (unsigned ones offset by ``2**31``);
- stability (lax.sort's ``is_stable=True``, which jnp.sort and argsort use,
  and top_k's lower index first among ties) comes from a last word, the
  element's index along the axis: every pair of words then differs. A
  16-bit key (f16, bf16, integers of at most 16 bits) and the index share
  one word (``key * 65536 + index``; a bf16 key is made in the high half
  from its float32 bits, :func:`high_sort_key`), so a stage is one
  ``take``; so do
  a 32-bit integer key and its index where the block's keys span less
  than ``2**31 / P`` (ids, labels, bucketed values: one block-wide minimum
  and maximum decide at run time) as ``(key - min) * P + index``. Along
  an axis in registers a float32 key, and an integer key of a wider
  span, share one word with the index *quantized*: ``q * P + index``,
  ``q`` the block in fixed point (scaled by a power of two from its
  largest magnitude) or the keys' offsets shifted right. That word sorts
  by key but among equal ``q``: where sorted neighbours share ``q``, the
  exact keys are read at the sorted indices and those runs sorted
  (:func:`_repair`), and the two-word network takes blocks the repair
  cannot finish;
- a single operand sorted on its own needs no index word where equal keys
  are equal values (integers, and float32 blocks without zeros, subnormals
  and NaNs: one block-wide minimum screens for them at run time, a scalar
  every thread branches on alike), and a float32 block with any folds
  its index into the keys of those only (the one place where equal keys
  may be different values, ``-0.0``/``0.0`` and NaN payloads): again one
  ``take`` per stage, and one more for those elements' values. A float
  block (f32, f16, bf16) that passes the screen is its own word: float min
  and max of normal numbers and infinities are exact, and in registers an
  f16 or bf16 stage takes both halves of a register at once
  (``min.bf16x2``) wherever partners keep their halves
  (:mod:`smalti.vocabulary.lane_exchange`); an f16 or bf16 block with any
  runs the key-and-index network below. The screen's scalars, like every
  block-wide scalar here, are :mod:`smalti.vocabulary.block_reduce`'s, on
  the warpgroup's own scratch slice (Pallas' reduction to a scalar shares
  one scratch among a kernel's warpgroups, which races), so kernels of
  several Pallas warpgroups screen too; blocks loaded plainly from global
  memory (whose strided layout no reduction takes) skip it.

Along the minor axis of a 2-D block in WGMMA's registers, a full sort runs
its stages on relabelled positions (:func:`relabelling`): the network
sorts any placement of the positions as long as partners and sides are
taken on the same labels, and with the lane bits as the positions' top
two bits only 5 of 28 stages (for 128) exchange across lanes with a side
chosen by the lane; one register permutation per word (two butterfly
steps exchanging the lane bits with two register bits) puts the result
back in column order. A full sort along the rows of a block whose dims
are multiples of 64 sorts its transpose's minor axis that way, between two
of :mod:`smalti.vocabulary.smem_transpose`'s vector round trips, the
second of which stores the relabelled positions where they belong
(:func:`~smalti.vocabulary.smem_transpose.relabelled_transpose`: no
permutation at all).

top_k needs only the ``k`` smallest (of the descending keys): it sorts runs
of ``r`` (the power of two from ``k``), then halves the block each round,
keeping of each pair of runs the ``r`` smallest (the elementwise minimum of
one run and the other reversed is a bitonic sequence, which ``log2 r``
half-cleaner stages sort), so later takes move ever less.

Outputs: an operand that is an iota along the axis (``jnp.argsort``'s) is
the sorted index itself (and where nothing else reads the iota, the
``argsort`` jaxpr rewrite, :func:`fuse`, drops it before Pallas builds
it); the first operand is decoded from its sorted keys where they are
one-to-one (integers of a narrow span; floats where the screen above finds
no zero and no NaN, outside the quantized keys' path); every other operand
is read once at the sorted indices; outputs
nobody reads are not computed; top_k's values are decoded from their
(bijective) keys. Everything is exact: bit for bit
lax.sort's and lax.top_k's answer.

Cost, in ``take`` steps for ``P`` along the axis (``S = log2 P (log2 P + 1)
/ 2``, 28 for ``P = 128``), times the words per element (1 or 2):
``jnp.sort`` ``S + 1``; ``argsort`` and multi-operand sorts ``S`` plus one
per operand; ``top_k(x, 8)`` of 128 ``6`` at full size, then ``5`` per
halving round.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as jax_core
from jax._src.interpreters import mlir
from jax._src.lax import lax as lax_internal
from jax._src.lib.mlir import ir

from smalti.vocabulary import (
    block_gather,
    column_sort,
    fixed_point,
    lane_exchange,
    lanes,
    smem_transpose,
)
from smalti.vocabulary.annotations import (
    Aval,
    DTypeLike,
    EstimatorContext,
    Lowered,
    Operand,
    PallasContext,
    Resources,
)
from smalti.vocabulary.block_reduce import reduce as _reduce
from smalti.vocabulary.lanes import relabelling
from smalti.vocabulary.movement import take
from smalti.vocabulary.scans import check_block, linear, positions, stride, take_scratch

INT32_MAX = 2 ** 31 - 1
INT32_MIN = -(2 ** 31)
#: f32 sort keys of NaNs (greater than +inf's, 0x7f800000, by more than
#: the 256 indices folded into it).
NAN_BASE = 0x7FC00000
#: f32 sort keys of positive numbers are moved up by this, so that zeros can
#: take the keys 0 .. 255 (their index).
ZERO_ROOM = 255
FLOATS = tuple(np.dtype(d) for d in (jnp.float32, jnp.float16, jnp.bfloat16))
BF16 = np.dtype(jnp.bfloat16)


# --- keys -----------------------------------------------------------------------------------


def is_narrow(dtype: DTypeLike) -> bool:
    """Whether ``dtype``'s keys fit 16 bits (and so share a word with the index)."""
    return np.dtype(dtype).itemsize <= 2


def _magnitude(dtype: DTypeLike) -> int:
    return 0x7FFF if np.dtype(dtype).itemsize == 2 else 0x7FFFFFFF


def total_order_key(x: jnp.ndarray) -> jnp.ndarray:
    """An int32 key whose order is IEEE total order (floats) or the value
    order (integers); one-to-one. 16-bit types give keys in [-2**15, 2**15)."""
    dtype = np.dtype(x.dtype)
    if dtype in FLOATS:
        narrow = dtype.itemsize == 2
        s = lax.bitcast_convert_type(x, jnp.int16 if narrow else jnp.int32)
        s = s.astype(jnp.int32) if narrow else s
        return jnp.where(s < 0, s ^ _magnitude(dtype), s)
    if dtype == np.dtype(np.uint32):
        return lax.bitcast_convert_type(x, jnp.int32) ^ INT32_MIN
    if dtype.kind == "u" and dtype.itemsize == 2:
        return x.astype(jnp.int32) - 2 ** 15
    return x.astype(jnp.int32)


def from_total_order_key(key: jnp.ndarray, dtype: DTypeLike) -> jnp.ndarray:
    """The value of :func:`total_order_key` ``key`` (its inverse)."""
    dtype = np.dtype(dtype)
    if dtype in FLOATS:
        narrow = dtype.itemsize == 2
        s = jnp.where(key < 0, key ^ _magnitude(dtype), key)
        return lax.bitcast_convert_type(s.astype(jnp.int16) if narrow else s, dtype)
    if dtype == np.dtype(np.uint32):
        return lax.bitcast_convert_type(key ^ INT32_MIN, jnp.uint32)
    if dtype.kind == "u" and dtype.itemsize == 2:
        return (key + 2 ** 15).astype(dtype)
    return key.astype(dtype)


def sort_key(x: jnp.ndarray) -> jnp.ndarray:
    """lax.sort's key: total order after making zeros +0 and NaNs one NaN."""
    key = total_order_key(x)
    if np.dtype(x.dtype) in FLOATS:
        key = jnp.where(x == 0, 0, key)
        key = jnp.where(x != x, _magnitude(x.dtype), key)
    return key


def high_sort_key(x: jnp.ndarray) -> jnp.ndarray:
    """A bfloat16 block's key of lax.sort's order in the high half of an
    int32 word, the low half zero (for the index): a bfloat16's float32
    bits ``b`` are its bits shifted up; the key is ``b`` where it is
    non-negative and ``INT32_MIN - b`` (minus its magnitude) where negative,
    so ``-0`` and ``+0`` are both 0; NaNs of either sign and any payload are
    one key above +inf's. 6.5 instructions per element (an extension, a
    compare, a subtract and a select; the NaN test of two elements at
    once and its select) against 9 for :func:`sort_key`, its shift and the
    index's add. Not ``sort_key << 16``: negative keys are one higher,
    which :func:`from_high_sort_key` undoes."""
    bits = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)
    key = jnp.where(bits < 0, np.int32(INT32_MIN) - bits, bits)
    return jnp.where(x != x, 0x7FFF << 16, key)


def from_high_sort_key(word: jnp.ndarray, dtype: DTypeLike) -> jnp.ndarray:
    """The bfloat16 value of a :func:`high_sort_key` (whatever the low half
    holds); a zero's is ``+0`` and NaNs' one NaN (what the key keeps)."""
    key = word >> 16
    bits = jnp.where(key < 0, 0x8000 - key, key)  # minus the magnitude: the sign bit and it
    return lax.bitcast_convert_type(bits.astype(jnp.int16), dtype)


# --- the network ------------------------------------------------------------------------------


def network_stages(p: int, runs: int | None = None) -> Iterator[tuple[int, int]]:
    """The bitonic network sorting runs of ``runs`` (default ``p``; powers
    of two) elements, all ascending: for each merge of runs of ``k``, first
    each element against its mirror in the run (``i ^ (k - 1)``), then
    against ``i ^ j`` for ``j = k/4, ..., 1``; the element whose bit ``k/2``
    (``j``) is clear keeps the smaller. Yields (partner mask, half bit)."""
    k = 2
    while k <= (runs or p):
        yield k - 1, k // 2
        yield from _half_cleaners(k // 2)
        k *= 2


def _half_cleaners(k: int) -> Iterator[tuple[int, int]]:
    """The stages sorting bitonic runs of ``k``: ``i ^ j``, ``j = k/2, ..., 1``."""
    j = k // 2
    while j >= 1:
        yield j, j
        j //= 2


def bitonic_sort(words: list[jnp.ndarray], axis: int,
                 stages: Iterable[tuple[int, int]] | None = None) -> list[jnp.ndarray]:
    """Sort the elements (lists of int32 words, compared lexicographically)
    along ``axis``, whose length must be a power of two: a bitonic network
    (``stages``, default :func:`network_stages` of the whole axis), one ``take``
    per word and stage. Elements must differ in some word, or be equal
    values (then which one lands where does not matter). Along either axis
    of a 2-D block each stage is a
    :func:`~smalti.vocabulary.lane_exchange.compare_exchange` instead (in
    registers along the minor axis, and along the rows within a warp;
    through SMEM a vector per register for rows across warps)."""
    shape = words[0].shape
    if stages is None and axis == 1 and _registers(tuple(shape)):
        return _sort_relabelled(words, axis)
    if stages is None and axis == 0 and _transposed_in_registers(tuple(shape)):
        if len(words) == 1 and column_sort.applies(tuple(shape), words[0].dtype):
            return [column_sort.sort_columns(words[0])]
        return _sort_relabelled([w.T for w in words], axis)
    stages = network_stages(shape[axis]) if stages is None else stages
    if len(shape) == 2:
        for mask, half in stages:
            words = lane_exchange.compare_exchange(words, mask=mask, half=half, axis=axis)
        return words
    pos = positions(shape, axis)
    lin = linear(shape)
    st = stride(shape, axis)
    power_of_two = st & (st - 1) == 0
    for mask, half in stages:
        # the partner's linear index: only the bits of pos * st change
        partner = lin ^ (mask * st) if power_of_two else lin + ((pos ^ mask) - pos) * st
        theirs = [take(w, partner) for w in words]
        keep_min = (pos & half) == 0
        # distinct elements: theirs > mine is not(theirs < mine)
        swap = lane_exchange.less(theirs, words) == keep_min
        words = [jnp.where(swap, t, w) for t, w in zip(theirs, words)]
    return words


def _registers(shape: tuple[int, ...]) -> bool:
    """Whether the stages of a ``shape`` block run in WGMMA's registers (where
    relabelled positions pay off)."""
    return lanes.registers_allowed() and lanes.in_registers(shape)


def _transposed_in_registers(shape: tuple[int, ...]) -> bool:
    """Whether a sort along the rows of a ``shape`` block is cheaper as a
    sort along the minor axis of its transpose: where both transposes take
    :mod:`smalti.vocabulary.smem_transpose`'s vector round trip (about 3
    instructions per element each) and the transposed block is in WGMMA's
    registers. Along the rows, 4 of a row of 64's 6 position bits are lane
    and warp bits (every stage on them a shuffle or an SMEM exchange);
    along the transpose's minor axis 4 are a thread's own registers."""
    return (len(shape) == 2 and all(d % 64 == 0 for d in shape)
            and _registers(shape[::-1]))


def _relabel_bits(value: int, place: tuple[int, ...]) -> int:
    """The column bits of a mask or half bit over positions (``place`` of its
    bits: a bit permutation, so XOR partners and bit tests carry over)."""
    out = 0
    bit = 0
    while value >> bit:
        if value >> bit & 1:
            out |= place[1 << bit]
        bit += 1
    return out


def relabelled_stages(n: int) -> tuple[tuple[int, ...], list[tuple[int, int]]]:
    """:func:`relabelling` of a row of ``n`` and the full network's stages
    on the columns it places the positions at."""
    place = relabelling(n)
    return place, [(_relabel_bits(mask, place), _relabel_bits(half, place))
                   for mask, half in network_stages(n)]


def _sort_relabelled(words: list[jnp.ndarray], axis: int) -> list[jnp.ndarray]:
    """:func:`bitonic_sort` of 2-D blocks along their minor axis in WGMMA's
    registers on positions placed by :func:`relabelling` (the words are in
    any order to start with: a sort does not care), each word then back in
    position order along ``axis`` (:func:`_in_position_order`): the words
    are the block's own for ``axis`` 1, its transpose's for ``axis`` 0."""
    _, stages = relabelled_stages(words[0].shape[1])
    return [_in_position_order(w, axis) for w in bitonic_sort(words, 1, stages)]


def _in_position_order(word: jnp.ndarray, axis: int) -> jnp.ndarray:
    """A word sorted on :func:`relabelling`'s positions along its minor axis,
    in position order along ``axis`` of the block: a register permutation
    within each quad (:func:`smalti.vocabulary.lanes.permute`'s transpose of
    the lane bits with two register bits) for ``axis`` 1; for ``axis`` 0
    (``word`` is the block's transpose) the transpose back, whose stores put
    each position where it belongs
    (:func:`~smalti.vocabulary.smem_transpose.relabelled_transpose`)."""
    if axis == 0:
        return smem_transpose.relabelled_transpose(word)
    return lanes.permute(word, relabelling(word.shape[1]))


def smallest(words: list[jnp.ndarray], axis: int, k: int) -> list[jnp.ndarray]:
    """The ``k`` smallest elements along ``axis`` (a power of two long),
    ascending, first along the axis of a shorter result: runs of ``r`` (the
    power of two from ``k``) are sorted, then each pair of runs is replaced
    by the ``r`` smallest of the two (the elementwise minimum of one run and
    the other reversed, a bitonic sequence, sorted by half-cleaners) until
    one run is left: each round halves what the takes move."""
    r = _padded_length(k)
    length = words[0].shape[axis]
    if 2 * r > length:
        return bitonic_sort(words, axis)
    if len(words[0].shape) == 2 and axis == 1:
        return _smallest_minor(words, r)
    words = bitonic_sort(words, axis, network_stages(length, r))
    while length > r:
        length //= 2
        shape = tuple(length if d == axis else s for d, s in enumerate(words[0].shape))
        pos = positions(shape, axis)
        offset = pos & (r - 1)
        start = (pos - offset) * 2  # of the pair of runs
        first = [_gather_along(w, start + offset, axis) for w in words]
        second = [_gather_along(w, start + (2 * r - 1) - offset, axis) for w in words]
        less = lane_exchange.less(first, second)
        words = [jnp.where(less, a, b) for a, b in zip(first, second)]
        words = bitonic_sort(words, axis, _half_cleaners(r))
    return words


def _smallest_minor(words: list[jnp.ndarray], r: int) -> list[jnp.ndarray]:
    """:func:`smallest` along the minor axis in full-width
    :func:`~smalti.vocabulary.lane_exchange.compare_exchange` stages (no
    gathers): after sorting runs of ``r``, round ``t`` merges the run at
    each multiple of ``2 span`` (``span = 2**(t-1) r``) with the one
    ``span`` on, reversed (partner ``c ^ (span | (r - 1))``, which keeps the
    smaller where bit ``span`` is clear), then half-cleans it; the other
    columns hold words no later round reads. The ``r`` smallest end at the
    start of each row. Each round computes only the columns a later round
    reads (``live``): a half, a quarter, ... of the row, where whole
    registers are dead. In WGMMA's registers the positions are relabelled
    as a full sort's (:func:`relabelling`): runs of up to 32 then sort in
    each thread's registers, and only rounds merging runs across lanes
    exchange across them; the result's first ``r`` positions are permuted
    back to the first ``r`` columns."""
    length = words[0].shape[1]
    relabelled = _registers(tuple(words[0].shape))  # rows of whole registers: n >= 8
    place = relabelling(length) if relabelled else tuple(range(length))

    def column(bits: int) -> int:
        return _relabel_bits(bits, place)

    words = bitonic_sort(words, 1, [(column(m), column(h)) for m, h in network_stages(length, r)])
    span = r
    while span < length:
        # read later: the r smallest of each merged pair, at multiples of 2 span
        live = [False] * length
        for position in range(length):
            live[place[position]] = position % (2 * span) < r
        words = lane_exchange.compare_exchange(words, mask=column(span | (r - 1)),
                                               half=column(span), live=tuple(live))
        for mask, half in _half_cleaners(r):
            words = lane_exchange.compare_exchange(words, mask=column(mask), half=column(half),
                                                   live=tuple(live))
        span *= 2
    if relabelled:  # the r smallest back to the first r columns (the rest: unread)
        words = [lanes.permute(w, tuple(place[c] if c < r else -1 for c in range(length)), 0)
                 for w in words]
    return words


def _padded_length(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _pad(words: list[jnp.ndarray], axis: int, p: int) -> list[jnp.ndarray]:
    """The words on a length-``p`` axis, past the end INT32_MAX (greater
    than any element's words but an index), or +inf for a float word (no
    less than any element: equal ones are equal values)."""
    shape = words[0].shape
    n = shape[axis]
    if p == n:
        return words
    padded = tuple(p if d == axis else s for d, s in enumerate(shape))
    pos = positions(padded, axis)
    other = positions(padded, 1 - axis) if len(shape) == 2 else None
    source = jnp.minimum(pos, n - 1)
    if other is not None:
        source = source * shape[1] + other if axis == 0 else other * shape[1] + source
    return [jnp.where(pos < n, take(w, source),
                      np.inf if jnp.issubdtype(w.dtype, jnp.floating) else INT32_MAX)
            for w in words]


def _read(word: jnp.ndarray, axis: int, out_shape: tuple[int, ...]) -> jnp.ndarray:
    """``word``'s first ``out_shape[axis]`` elements along ``axis`` (a no-op
    where that is all of it)."""
    if tuple(word.shape) == tuple(out_shape):
        return word
    if axis == 1 and lanes.in_registers(tuple(word.shape)) and out_shape[1] % 8 == 0:
        return lax.slice(word, (0, 0), tuple(out_shape))  # whole registers: jax's rule
    pos = positions(out_shape, axis)
    if len(out_shape) == 1:
        return take(word, pos)
    other = positions(out_shape, 1 - axis)
    cols = word.shape[1]
    return take(word, pos * cols + other if axis == 0 else other * cols + pos)


def _gather_along(x: jnp.ndarray, index: jnp.ndarray, axis: int) -> jnp.ndarray:
    """``x`` read at ``index`` along ``axis`` (``index``'s shape; the other
    coordinate its own): where both are in WGMMA's registers, the gather
    ``take_along_axis`` writes (without its wrap of negative indices: these
    are in bounds), which :mod:`smalti.vocabulary.block_gather` loads
    element by element from a copy of ``x``; a ``take`` otherwise."""
    if x.ndim == 2 and lanes.in_registers(tuple(index.shape)) and \
            lanes.in_registers(tuple(x.shape), x.dtype):
        return lax.gather(x, index[..., None], block_gather.numbers(axis), (1, 1),
                          mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS)
    if x.ndim == 1:
        return take(x, index)
    other = positions(index.shape, 1 - axis)
    cols = x.shape[1]
    return take(x, index * cols + other if axis == 0 else other * cols + index)


def _with_index(keys: list[jnp.ndarray], narrow_last: bool, shape: tuple[int, ...], axis: int,
                padded: bool, high: bool = False) -> tuple[list[jnp.ndarray], bool]:
    """The key words with the index added: packed into the last key word
    when that is a 16-bit key, else as a word of its own. ``padded``: the
    keys end in :func:`_pad`'s INT32_MAX, which stays greatest. ``high``:
    the last key is already in its word's high half (:func:`high_sort_key`,
    at most ``0x7FFF << 16``; INT32_MAX stays itself under the index's
    bits)."""
    pos = positions(shape, axis)
    if not narrow_last:
        return [*keys, pos], False
    if high:
        return [*keys[:-1], keys[-1] | pos], True
    word = keys[-1] * 65536 + pos
    if padded:
        word = jnp.where(keys[-1] == INT32_MAX, INT32_MAX, word)
    return [*keys[:-1], word], True


def _index_of(words: list[jnp.ndarray], packed: bool) -> jnp.ndarray:
    return words[-1] & 0xFFFF if packed else words[-1]


# --- sort -------------------------------------------------------------------------------------


def sort_f(*operands: jnp.ndarray, dimension: int, num_keys: int, screen: bool = True,
           indices: tuple[tuple[int, str], ...] = (), unused: frozenset[int] = frozenset()
           ) -> list[jnp.ndarray]:
    """lax.sort(operands, dimension, is_stable=True, num_keys): stable,
    lexicographic on the first ``num_keys`` operands.

    ``screen``: the block may be reduced to scalars that choose a path at
    run time: a float block tested for zeros, subnormals and NaNs
    (:func:`_has_zero_subnormal_or_nan`; without them, a lone float
    operand sorts its own values, no index), and the first of several
    operands (f32, or 32-bit integers) measured for a one-word key
    (:func:`_sort_int32_key`, :func:`_sort_f32_key`).
    The scalars are :func:`_reduce`'s (each warpgroup's own); a reduction
    cannot take the strided layout of a block loaded plainly from global
    memory, so such blocks are not screened.
    ``indices``: (position, dtype) of lax.sort's outputs whose operands were
    iotas along ``dimension`` (``jnp.argsort``'s) and are not passed: they
    are the sorted index itself. ``unused``: positions of outputs nobody
    reads (their operand stands in, unsorted)."""
    index_at = dict(indices)
    places = [k for k in range(len(operands) + len(index_at)) if k not in index_at]
    skip = frozenset(i for i, k in enumerate(places) if k in unused)
    if not index_at and len(operands) == 1:
        return [_sort_alone(operands[0], dimension, screen)]
    out, index = _sort_several(*operands, dimension=dimension, num_keys=num_keys,
                               screen=screen, skip=skip)
    for k, dtype in sorted(index_at.items()):
        out.insert(k, index.astype(dtype))
    return out


def _sort_alone(x: jnp.ndarray, dimension: int, screen: bool) -> jnp.ndarray:
    """One operand sorted on its own (jnp.sort): integers, and float blocks
    the screen finds without zeros, subnormals and NaNs, on their own
    values (:func:`_sort_bijective`); other float blocks on keys that keep
    lax.sort's order among equal keys (f32: :func:`_sort_f32`; f16, bf16:
    the key and its index in one word)."""
    if x.shape[dimension] == 1:
        return x
    p = _padded_length(x.shape[dimension])
    if np.dtype(x.dtype).kind in "iu":  # equal keys are equal values: no index needed
        return _sort_bijective(x, dimension, p)

    def exact(v: jnp.ndarray) -> jnp.ndarray:
        if np.dtype(v.dtype) == np.dtype(np.float32):
            return _sort_f32(v, dimension, p)
        [out], _ = _sort_several(v, dimension=dimension, num_keys=1, screen=False)
        return out  # f16, bf16: the key and the index share a word
    if not screen:
        return exact(x)
    return lax.cond(_has_zero_subnormal_or_nan(x), exact,
                    partial(_sort_bijective, axis=dimension, p=p), x)


def _sort_several(*operands: jnp.ndarray, dimension: int, num_keys: int, screen: bool,
                  skip: frozenset[int] = frozenset()
                  ) -> tuple[list[jnp.ndarray], jnp.ndarray]:
    """The sorted operands (those in ``skip`` stand in for themselves) and
    the sorted index: the key words and the index through the network."""
    shape = tuple(operands[0].shape)
    n = shape[dimension]
    if n == 1:
        return list(operands), jnp.zeros(shape, jnp.int32)
    p = _padded_length(n)
    x = operands[0]
    dtype = np.dtype(x.dtype)
    if screen and num_keys == 1 and dtype.kind in "iu" and dtype.itemsize == 4:
        return _sort_int32_key(operands, dimension, skip)
    if screen and num_keys == 1 and dtype == np.dtype(np.float32) and p == n \
            and _relabelled_along(shape, dimension):
        return _sort_f32_key(operands, dimension, skip)
    last = operands[num_keys - 1]
    high = np.dtype(last.dtype) == BF16  # its key made in the word's high half
    keys = [sort_key(k) for k in operands[:num_keys - 1]]
    keys = _pad([*keys, high_sort_key(last) if high else sort_key(last)], dimension, p)
    padded = keys[0].shape
    words, packed = _with_index(keys, is_narrow(last.dtype), padded, dimension, padded=p != n,
                                high=high)
    words = bitonic_sort(words, dimension)
    index = _index_of([_read(words[-1], dimension, shape)], packed)

    def first_decoded() -> jnp.ndarray:
        """The first operand from its sorted keys (the last key word holds
        the index too where it is packed)."""
        key = _read(words[0], dimension, shape)
        if high and num_keys == 1:
            return from_high_sort_key(key, dtype)
        return from_total_order_key(key >> 16 if packed and num_keys == 1 else key, dtype)

    def first() -> jnp.ndarray:
        if dtype.kind in "iu":
            return first_decoded()
        if screen:
            return lax.cond(_has_zero_subnormal_or_nan(x),
                            lambda: _gather_along(x, index, dimension), first_decoded)
        return _gather_along(x, index, dimension)

    return _outputs(operands, skip, first, index, dimension), index


def _outputs(operands: tuple[jnp.ndarray, ...], skip: frozenset[int],
             first: Callable[[], jnp.ndarray], index: jnp.ndarray, dimension: int
             ) -> list[jnp.ndarray]:
    """lax.sort's outputs from the sorted ``index``: the first operand as
    ``first()`` gives it (decoded from the network's words, where they keep
    it), the others read at the index; those in ``skip`` (read by nobody)
    stand in for themselves, unsorted and uncomputed."""
    return [o if i in skip else first() if i == 0 else _gather_along(o, index, dimension)
            for i, o in enumerate(operands)]


def _sort_int32_key(operands: tuple[jnp.ndarray, ...], dimension: int, skip: frozenset[int]
                    ) -> tuple[list[jnp.ndarray], jnp.ndarray]:
    """lax.sort of several operands on the first, a 32-bit integer: where
    the block's keys span less than ``2**31 / P`` (``P``: the padded length;
    a block-wide minimum and maximum, tested at run time alike in every
    thread), :func:`_sort_offset_keys` moves one word through the network;
    a wider span quantizes the offsets (:func:`_sort_by_span`) where the
    axis runs in registers on relabelled positions, and takes the key and
    the index as two words otherwise (and where the quantized sort fails)."""
    key = total_order_key(operands[0])
    lo, hi = _reduce(key, "min"), _reduce(key, "max")
    span = hi - lo  # int32: negative where it wraps, a span of 2**31 or more
    n = key.shape[dimension]
    p = _padded_length(n)
    exact = partial(_sort_several, dimension=dimension, num_keys=1, screen=False, skip=skip)
    wide: Callable[..., tuple[list[jnp.ndarray], jnp.ndarray]] = exact
    if p == n and _relabelled_along(tuple(key.shape), dimension):
        def wide(*ops: jnp.ndarray) -> tuple[list[jnp.ndarray], jnp.ndarray]:
            out, index, status = _sort_by_span(key, lo, span, *ops, dimension=dimension,
                                               skip=skip)
            return lax.cond(status != SORTED, exact, lambda *_: (out, index), *ops)
    return lax.cond((span >= 0) & (span < 2 ** 31 // p),
                    partial(_sort_offset_keys, key, lo, dimension=dimension, skip=skip),
                    wide, *operands)


def _relabelled_along(shape: tuple[int, ...], axis: int) -> bool:
    """Whether a full sort along ``axis`` runs on relabelled positions in registers."""
    return (axis == 1 and _registers(shape)) or (axis == 0 and _transposed_in_registers(shape))


def _sort_f32_key(operands: tuple[jnp.ndarray, ...], dimension: int, skip: frozenset[int]
                  ) -> tuple[list[jnp.ndarray], jnp.ndarray]:
    """lax.sort of several operands on the first, a float32 block sorted
    along an axis that runs in registers on relabelled positions, through
    one word per element (:func:`_sort_quantized`): the block in fixed
    point, scaled by a power of two from its largest finite magnitude
    (infinities clamped to the ends), where :func:`_fixed_point_fits`;
    otherwise, or where that leaves too many neighbours out of order
    (:data:`CROWDED`), lax.sort's int32 keys' offsets from their minimum,
    shifted to fit (:func:`_sort_by_span`: every octave alike, as the
    float bits are); where either leaves runs the repair cannot sort, the
    index as a second key."""
    x = operands[0]
    top = _quantized_top(x.shape[dimension])
    magnitude = _reduce(jnp.abs(x), "max")  # NaN where the block has one
    infinite = magnitude == np.inf

    def finite_magnitude() -> jnp.ndarray:
        size = jnp.abs(x)
        return _reduce(jnp.where(size < np.inf, size, 0), "max")

    bound = lax.cond(infinite, finite_magnitude, lambda: magnitude)

    def fixed(*ops: jnp.ndarray) -> Quantized:
        scaled = ops[0] * _scale(bound, top)  # exact but where it underflows; monotone
        # infinities to the ends (only there: a min and a max per element)
        scaled = lax.cond(infinite, lambda v: jnp.clip(v, -top, top - 1), lambda v: v, scaled)
        q = fixed_point.truncate_in_range(scaled)  # toward zero: monotone too
        return _sort_quantized(q, lambda: sort_key(ops[0]), *ops, dimension=dimension,
                               skip=skip)

    def by_span(*ops: jnp.ndarray) -> Quantized:
        key = sort_key(ops[0])
        lo = _reduce(key, "min")
        return _sort_by_span(key, lo, _reduce(key, "max") - lo, *ops, dimension=dimension,
                             skip=skip)

    out, index, status = lax.cond(_fixed_point_fits(x, bound, top), fixed,
                                  partial(_not_sorted, CROWDED), *operands)
    out, index, status = lax.cond(status == CROWDED, by_span,
                                  lambda *_: (out, index, status), *operands)
    exact = partial(_sort_several, dimension=dimension, num_keys=1, screen=False, skip=skip)
    return lax.cond(status != SORTED, exact, lambda *_: (out, index), *operands)


def _fixed_point_fits(x: jnp.ndarray, bound: jnp.ndarray, top: int) -> jnp.ndarray:
    """Whether a float32 block whose largest finite magnitude is ``bound``
    (a scalar; NaN where the block has a NaN) is worth sorting in fixed
    point: :func:`_scale` applies, and of a sample (the first 8 columns: a
    register per thread and row pair) at most an eighth lies below
    ``bound * 2**-12``, where fixed point keeps fewer than 13 bits (a
    block of a wide dynamic range: softmax outputs, magnitudes over many
    octaves, whose fixed-point keys would tie)."""
    sample = jnp.abs(lax.slice(x, (0, 0), (x.shape[0], 8)))
    tiny = _reduce((sample < bound * 2.0 ** -12).astype(jnp.int32), "sum")
    return _scales(bound, top) & (tiny * 8 <= sample.size)


# --- keys quantized beside their index ---------------------------------------------------------

#: A quantized sort's outputs, its index, and its status (an int32 scalar:
#: :data:`SORTED`, else the outputs are placeholders).
Quantized = tuple[list[jnp.ndarray], jnp.ndarray, jnp.ndarray]
#: Statuses of a quantized sort: done; more neighbours out of order than the
#: block has lines (another quantization may tie fewer); runs left that the
#: repair could not sort (the two-word network's to do).
SORTED, CROWDED, UNSORTED = 0, 1, 2
#: Sweeps of :func:`_repair` before a quantized sort fails: runs of up to 8.
REPAIR_SWEEPS = 4


def _not_sorted(status: int, *operands: jnp.ndarray) -> Quantized:
    """A quantized sort that did not sort: placeholders (constants, whose
    layout yields to the other branch's) and its ``status``."""
    return ([jnp.zeros(o.shape, o.dtype) for o in operands],
            jnp.zeros(operands[0].shape, jnp.int32), jnp.int32(status))


def _quantized_top(n: int) -> int:
    """Quantized keys of a row of ``n`` (a power of two) lie in ``[-top,
    top)``: with the index's ``log2 n`` bits, one signed int32 word."""
    return 1 << (31 - (n.bit_length() - 1))


def _exponent_field(magnitude: jnp.ndarray) -> jnp.ndarray:
    return lax.shift_right_logical(lax.bitcast_convert_type(magnitude, jnp.int32), 23)


def _scales(magnitude: jnp.ndarray, top: int) -> jnp.ndarray:
    """Whether :func:`_scale` of a float32 block's largest magnitude (a
    scalar; NaN where the block has one) applies: the magnitude finite and
    not below ``2**(log2 top - 128)`` (a block of zeros, or of nothing but
    tiny numbers, does not scale to a normal float32)."""
    field = _exponent_field(magnitude)
    t = top.bit_length() - 1
    return (field >= t - 1) & (field < 255)


def _scale(magnitude: jnp.ndarray, top: int) -> jnp.ndarray:
    """The power of two that maps ``(-magnitude, magnitude)`` into ``(-top,
    top)``: ``magnitude < 2**(field - 126)``, so ``top * 2**(126 - field)``
    (its float32 exponent field ``log2 top + 253 - field``)."""
    t = top.bit_length() - 1
    return lax.bitcast_convert_type((t + 253 - _exponent_field(magnitude)) << 23, jnp.float32)


def _sort_by_span(key: jnp.ndarray, lo: jnp.ndarray, span: jnp.ndarray, *operands: jnp.ndarray,
                  dimension: int, skip: frozenset[int]) -> Quantized:
    """:func:`_sort_quantized` on the int32 ``key`` (lax.sort's order), whose
    block's keys lie in ``[lo, lo + span]`` (``span`` taken as unsigned):
    the offsets ``key - lo`` shifted right just enough to fit the word
    beside the index."""
    top = _quantized_top(key.shape[dimension])
    room = (2 * top).bit_length() - 1  # the bits of a quantized offset
    s = sum((lax.shift_right_logical(span, room + j) != 0).astype(jnp.int32)
            for j in range(32 - room))  # the span's bits beyond room
    # (key - lo) / 2**s - top, floored, as one subtract and one shift: key - lo
    # - top * 2**s lies in [-top * 2**s, top * 2**s), within int32 (s <= 32 - room)
    q = (key - (lo + (top << s))) >> jnp.broadcast_to(s, key.shape)
    return _sort_quantized(q, lambda: key, *operands, dimension=dimension, skip=skip)


def _sort_quantized(q: jnp.ndarray, key: Callable[[], jnp.ndarray], *operands: jnp.ndarray,
                    dimension: int, skip: frozenset[int]) -> Quantized:
    """lax.sort of ``operands`` on a 32-bit key along an axis that runs in
    registers on relabelled positions, through one word per element: ``q``
    (in ``[-top, top)``, :func:`_quantized_top`) quantizes the key, which
    ``key()`` gives exactly (int32, lax.sort's order): ``q`` never decreases
    where the key increases. The word ``q * n + index`` sorts the elements
    by key but among equal ``q``, which the index orders. A test of the
    sorted neighbours finds equal ``q``; only then are the exact keys read
    at the sorted indices and, where neighbours are out of order, the runs
    sorted (:func:`_repair`). It stops :data:`CROWDED` where more
    neighbours than the block has lines are out of order, :data:`UNSORTED`
    where the repair does not finish. The operands are read at the sorted
    index."""
    shape = tuple(q.shape)
    n = shape[dimension]
    bits = n.bit_length() - 1
    word = (q << bits) | positions(shape, dimension)
    place, stages = relabelled_stages(n)
    if dimension == 0:  # the transpose's rows on relabelled positions (column_sort)
        word = column_sort.sort_columns(word, transposed=True)
    else:
        [word] = bitonic_sort([word], 1, stages)
    index = word & (n - 1)
    # equal q in sorted neighbours: their words differ in the index bits alone
    tied = _reduce(lax.bitcast_convert_type(word ^ lanes.permute(word, _successors(place)),
                                                 jnp.uint32), "min") < n

    def repaired(index: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        exact_key = _gather_along(key().T if dimension == 0 else key(), index, 1)
        inverted = _reduce(_inverted(exact_key, index, place).astype(jnp.int32), "sum")

        def swept(index: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
            index, unsorted = _repair(exact_key, index, place)
            return index, jnp.where(unsorted, UNSORTED, SORTED)

        return lax.cond(
            inverted > shape[1 - dimension], lambda i: (i, jnp.int32(CROWDED)),
            lambda i: lax.cond(inverted == 0, lambda j: (j, jnp.int32(SORTED)), swept, i),
            index)

    index, status = lax.cond(tied, repaired, lambda i: (i, jnp.int32(SORTED)), index)

    def done(index: jnp.ndarray) -> Quantized:
        index = _in_position_order(index, dimension)
        x = operands[0]
        return _outputs(operands, skip, lambda: _gather_along(x, index, dimension), index,
                        dimension), index, jnp.int32(SORTED)

    return lax.cond(status != SORTED,
                    lambda _: _not_sorted(status, *operands), done, index)


def _any(flags: jnp.ndarray) -> jnp.ndarray:
    """Whether any of a block of booleans is set (:func:`_reduce`)."""
    return _reduce(flags.astype(jnp.int32), "max") > 0


def _successors(place: tuple[int, ...]) -> tuple[int, ...]:
    """For each column of a row on relabelled positions ``place``, the column
    of the next position (the last one's: the one before it)."""
    n = len(place)
    following = [0] * n
    for label in range(n):
        following[place[label]] = place[label + 1 if label + 1 < n else n - 2]
    return tuple(following)


def _inverted(key: jnp.ndarray, index: jnp.ndarray, place: tuple[int, ...],
              last: jnp.ndarray | None = None) -> jnp.ndarray:
    """Per element of ``(key, index)`` pairs on relabelled positions
    ``place``: whether the next position's pair is smaller (``last``: the
    last position's column, which has no next; computed here if not given)."""
    following = [lanes.permute(w, _successors(place)) for w in (key, index)]
    if last is None:
        last = positions(tuple(key.shape), 1) == place[-1]
    return lane_exchange.less(following, [key, index]) & ~last


def _repair(key: jnp.ndarray, index: jnp.ndarray, place: tuple[int, ...]
            ) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Sort ``(key, index)`` pairs on relabelled positions ``place`` that are
    sorted but within runs of neighbours (what a quantized sort leaves),
    and out of order: odd-even transposition, each sweep a compare-exchange
    of positions ``2 j`` and ``2 j + 1`` (the network's stage of mask 1:
    the two elements of one register) and then of ``2 j + 1`` and ``2 j +
    2`` (:func:`_odd_pairs`), the smaller to the lower position, until no
    neighbours are out of order; a sweep sorts runs of two, and ``s`` sweeps
    runs of ``2 s``. A compare-exchange only removes inversions: the pairs
    stay sorted outside the runs. Returns the index and whether the pairs
    are still unsorted after :data:`REPAIR_SWEEPS` sweeps."""
    bit0 = _relabel_bits(1, place)
    columns = positions(tuple(key.shape), 1)
    odd = (columns & 1) == 1  # the odd positions (computed once, outside the loop)
    last = columns == place[-1]

    Sweeps = tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray, jnp.ndarray]

    def sweep(state: Sweeps) -> Sweeps:
        key, index, rounds, _ = state
        key, index = lane_exchange.compare_exchange([key, index], mask=bit0, half=bit0)
        key, index = _odd_pairs(key, index, place, odd)
        return key, index, rounds + 1, _any(_inverted(key, index, place, last))

    _, index, _, unsorted = lax.while_loop(
        lambda state: state[3] & (state[2] < REPAIR_SWEEPS), sweep,
        (key, index, jnp.int32(0), jnp.bool_(True)))
    return index, unsorted


def _odd_pairs(key: jnp.ndarray, index: jnp.ndarray, place: tuple[int, ...],
               odd: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The compare-exchange of positions ``2 j + 1`` and ``2 j + 2`` (the
    first and last positions keep their pairs) on relabelled positions: each
    element's partner by a static column map, the odd position keeping the
    smaller. Position bit 0 is column bit 0 (:func:`relabelling`), so
    ``odd`` (the odd positions) is the odd columns."""
    n = len(place)
    partner = list(range(n))
    for p in range(1, n - 1, 2):
        partner[place[p]], partner[place[p + 1]] = place[p + 1], place[p]
    theirs = [lanes.permute(w, partner) for w in (key, index)]
    # distinct pairs: theirs > mine is not(theirs < mine); a lone position is
    # its own partner and keeps its pair either way
    swap = lane_exchange.less(theirs, [key, index]) == odd
    return jnp.where(swap, theirs[0], key), jnp.where(swap, theirs[1], index)


def _sort_offset_keys(key: jnp.ndarray, lo: jnp.ndarray, *operands: jnp.ndarray, dimension: int,
                      skip: frozenset[int]) -> tuple[list[jnp.ndarray], jnp.ndarray]:
    """lax.sort of ``operands`` on the int32 ``key`` of the first, whose
    block's keys lie in ``[lo, lo + 2**31 / P)``: the key's offset from
    ``lo`` and the index share one non-negative word (``(key - lo) * P +
    index``, ordered as the pair, and all different), so the network moves
    one word; the first operand is decoded from it, the others are read at
    the index."""
    shape = tuple(key.shape)
    p = _padded_length(shape[dimension])
    bits = p.bit_length() - 1
    [word] = _pad([((key - lo) << bits) | positions(shape, dimension)], dimension, p)
    [word] = bitonic_sort([word], dimension)
    word = _read(word, dimension, shape)
    index = word & (p - 1)
    return _outputs(operands, skip,
                    lambda: from_total_order_key((word >> bits) + lo, operands[0].dtype),
                    index, dimension), index


def _sort_bijective(x: jnp.ndarray, axis: int, p: int) -> jnp.ndarray:
    """One operand whose equal total-order keys are equal values (integers,
    floats without zeros, subnormals and NaNs): its keys sorted alone, no
    index. A float block is its own key there: its stages compare floats
    (a ``min``/``max`` each, exact on normal numbers and infinities; f16
    and bf16 two to an instruction where a register's halves pair with
    the same halves), which saves encoding and decoding integer keys."""
    if np.dtype(x.dtype) in FLOATS:
        [word] = bitonic_sort(_pad([x], axis, p), axis)
        return _read(word, axis, tuple(x.shape))
    [word] = bitonic_sort(_pad([total_order_key(x)], axis, p), axis)
    return from_total_order_key(_read(word, axis, tuple(x.shape)), x.dtype)


def _has_zero_subnormal_or_nan(x: jnp.ndarray) -> jnp.ndarray:
    """Whether the float block ``x`` holds a zero, a subnormal or a NaN (a
    scalar, the same in every thread): its least magnitude is not at least
    the smallest normal number (Pallas' ``reduce_min`` of floats propagates
    NaN). An ``abs`` and a ``min`` per element. Zeros and NaNs are the only
    values lax.sort does not order by their bits; subnormals are screened
    out too, so that the float compares of the path without them see only
    normal numbers and infinities, which no flush-to-zero mode changes (a
    flushed subnormal here is only taken as one more reason for the exact
    path)."""
    tiny = np.array(jnp.finfo(x.dtype).smallest_normal, x.dtype)
    return ~(_reduce(jnp.abs(x), "min") >= tiny)


def _sort_f32(x: jnp.ndarray, axis: int, p: int) -> jnp.ndarray:
    """One float32 operand, the exact path: its index folded into the keys of zeros
    (0 .. 255) and NaNs (NAN_BASE + index), the only elements whose equal
    keys may be different values; positive keys moved up to make room."""
    pos = positions(x.shape, axis)
    key = total_order_key(x)
    key = jnp.where(key > 0, key + ZERO_ROOM, key)
    key = jnp.where(x == 0, pos, key)
    key = jnp.where(x != x, NAN_BASE + pos, key)
    [word] = bitonic_sort(_pad([key], axis, p), axis)
    word = _read(word, axis, x.shape)
    zero = (word >= 0) & (word <= ZERO_ROOM)
    nan = word >= NAN_BASE
    index = jnp.where(zero, word, jnp.where(nan, word - NAN_BASE, 0))
    special = _gather_along(x, index, axis)
    value = from_total_order_key(jnp.where(word > ZERO_ROOM, word - ZERO_ROOM, word), x.dtype)
    return jnp.where(zero | nan, special, value)


# --- top_k ------------------------------------------------------------------------------------


def top_k_f(x: jnp.ndarray, *, k: int, axis: int) -> list[jnp.ndarray]:
    """lax.top_k: the ``k`` largest along ``axis`` in IEEE total order,
    descending, the lower index first among equal values; and their indices."""
    shape = tuple(x.shape)
    n = shape[axis]
    out_shape = tuple(k if d == axis else s for d, s in enumerate(shape))
    p = _padded_length(n)
    descending = ~total_order_key(x)  # one-to-one, order reversed
    [key] = _pad([descending], axis, p)
    words, packed = _with_index([key], is_narrow(x.dtype), key.shape, axis, padded=p != n)
    words = [_read(w, axis, out_shape) for w in smallest(words, axis, k)]
    index = _index_of(words, packed)
    key = (words[0] >> 16) if packed else words[0]  # arithmetic shift: the signed key
    return [from_total_order_key(~key, x.dtype), index]


def top_1_f(x: jnp.ndarray, *, axis: int) -> list[jnp.ndarray]:
    """lax.top_k with k = 1 along the last axis of a 2-D block: the largest
    total-order key by a reduction and the least index holding it (ties to
    the lower index, as top_k), no take at all. Both (n, 1) results are
    reductions broadcast back: no iota of an (n, 1) shape has a layout, so
    the network's reads could not build them."""
    key = total_order_key(x)
    best = lax.reduce_max(key, (axis,))
    kept = tuple(d for d in range(x.ndim) if d != axis)
    pos = positions(x.shape, axis)
    hit = key == lax.broadcast_in_dim(best, x.shape, kept)
    index = lax.reduce_min(jnp.where(hit, pos, x.shape[axis]), (axis,))
    out_shape = tuple(1 if d == axis else n for d, n in enumerate(x.shape))
    value = from_total_order_key(best, x.dtype)
    return [lax.broadcast_in_dim(v, out_shape, kept) for v in (value, index)]


# --- argsort's iota, fused --------------------------------------------------------------------

#: lax.sort without the operands that are iotas along its axis and read by
#: nothing else (``jnp.argsort``'s): their outputs are the sorted index
#: (``indices``: position and dtype), so Pallas never builds the iota, an
#: index computation per element the sort would not read. ``unused``: the
#: outputs nobody reads (argsort's sorted keys), which are not computed.
sort_index_p = jax_core.Primitive("smalti_sort_index")
sort_index_p.multiple_results = True


@sort_index_p.def_abstract_eval
def _sort_index_abstract_eval(*avals: Aval, dimension: int, is_stable: bool, num_keys: int,
                              indices: tuple[tuple[int, str], ...],
                              unused: tuple[int, ...]) -> list[Aval]:
    out = list(avals)
    for k, dtype in indices:  # in increasing position
        out.insert(k, jax_core.ShapedArray(avals[0].shape, np.dtype(dtype)))
    return out


def _sort_index_impl(*xs: jax.Array, dimension: int, is_stable: bool, num_keys: int,
                     indices: tuple[tuple[int, str], ...], unused: tuple[int, ...]
                     ) -> list[jax.Array]:
    operands = list(xs)
    for k, dtype in indices:
        operands.insert(k, lax.broadcasted_iota(np.dtype(dtype), xs[0].shape, dimension))
    return list(lax.sort(operands, dimension=dimension, is_stable=is_stable, num_keys=num_keys))


sort_index_p.def_impl(_sort_index_impl)
mlir.register_lowering(sort_index_p, mlir.lower_fun(_sort_index_impl, multiple_results=True))


def fuse(jaxpr: jax_core.Jaxpr) -> jax_core.Jaxpr | None:
    """``jaxpr`` with every sort that has an iota operand along its axis
    read by nothing else (past its keys), or an output nobody reads, as one
    :data:`sort_index_p` equation, the iotas dropped; ``None`` if none has."""
    uses = Counter(v for eqn in jaxpr.eqns for v in eqn.invars if isinstance(v, jax_core.Var))
    uses.update(v for v in jaxpr.outvars if isinstance(v, jax_core.Var))
    iotas = {eqn.outvars[0]: eqn for eqn in jaxpr.eqns if eqn.primitive is lax_internal.iota_p}
    replaced: dict[int, jax_core.JaxprEqn] = {}
    dropped: set[int] = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive is not lax_internal.sort_p:
            continue
        dimension, num_keys = eqn.params["dimension"], eqn.params["num_keys"]
        producers = {k: iotas[v] for k, v in enumerate(eqn.invars)
                     if k >= num_keys and isinstance(v, jax_core.Var) and v in iotas
                     and uses[v] == 1 and iotas[v].params["dimension"] == dimension
                     and np.dtype(iotas[v].params["dtype"]).kind in "iu"}
        unused = tuple(k for k, v in enumerate(eqn.outvars)
                       if isinstance(v, jax_core.DropVar) or uses[v] == 0)
        if not producers and not unused:
            continue
        indices = tuple((k, np.dtype(e.params["dtype"]).name) for k, e in producers.items())
        replaced[id(eqn)] = eqn.replace(
            primitive=sort_index_p,
            invars=[v for k, v in enumerate(eqn.invars) if k not in producers],
            params={**eqn.params, "indices": indices, "unused": unused})
        dropped.update(id(e) for e in producers.values())
    if not replaced:
        return None
    return jaxpr.replace(eqns=[replaced.get(id(eqn), eqn) for eqn in jaxpr.eqns
                               if id(eqn) not in dropped])


# --- Pallas rules -----------------------------------------------------------------------------


def _check_dtypes(ctx: PallasContext, what: str) -> None:
    from smalti.vocabulary.primitives import refuse

    for aval in ctx.avals_in:
        dtype = np.dtype(aval.dtype)
        if not (dtype in FLOATS or (dtype.kind in "iu" and dtype.itemsize <= 4)):
            raise refuse(ctx, f"{what} of operands of dtype {dtype} is not supported",
                         fix="sort float32, float16, bfloat16 or integers of at most 32 bits "
                             "(x.astype(jnp.int32) for booleans, float64 as float32)")


def lower_sort(ctx: PallasContext, *operands: Operand, dimension: int, is_stable: bool,
               num_keys: int) -> Lowered:
    """lax.sort; ``is_stable=False`` is sorted stably too (a valid order).
    Operands that are iotas along the axis (one that :func:`fuse` left, being
    read elsewhere too) are not read: their result is the sorted index."""
    del is_stable
    indices = tuple((i, np.dtype(aval.dtype).name) for i, (o, aval)
                    in enumerate(zip(operands, ctx.avals_in))
                    if i >= num_keys and _is_iota(o, int(dimension))
                    and np.dtype(aval.dtype).kind in "iu")
    return _lower(ctx, operands, dimension=int(dimension), num_keys=int(num_keys),
                  indices=indices, unused=frozenset(),
                  dropped=frozenset(i for i, _ in indices))


def lower_sort_index(ctx: PallasContext, *operands: Operand, dimension: int, is_stable: bool,
                     num_keys: int, indices: tuple[tuple[int, str], ...],
                     unused: tuple[int, ...]) -> Lowered:
    """:data:`sort_index_p`: lax.sort without its iota operands."""
    del is_stable
    return _lower(ctx, operands, dimension=int(dimension), num_keys=int(num_keys),
                  indices=indices, unused=frozenset(unused), dropped=frozenset())


def _lower(ctx: PallasContext, operands: tuple[Operand, ...], *, dimension: int, num_keys: int,
           indices: tuple[tuple[int, str], ...], unused: frozenset[int],
           dropped: frozenset[int]) -> Lowered:
    """The sort's rule; ``dropped``: operands it does not read (iotas whose
    outputs are the index)."""
    from smalti.vocabulary.primitives import _lower_fun

    _check_dtypes(ctx, "sort")
    check_block(ctx, tuple(ctx.avals_in[0].shape), dimension, "sort")
    with lanes.for_operands(*operands):
        # not screened: a block loaded plainly from global memory (a strided
        # layout, which the screen's reduction cannot take)
        screen = lanes.registers_allowed()
        fn = partial(sort_f, dimension=dimension, num_keys=num_keys, screen=screen,
                     indices=indices, unused=unused)
        return _lower_fun(lambda *xs: fn(*(x for i, x in enumerate(xs) if i not in dropped)))(
            ctx, *operands)


def _is_iota(value: Operand, dimension: int) -> bool:
    """Whether an operand is Pallas' ``broadcasted_iota`` along ``dimension``
    (what ``jnp.argsort`` sorts beside its keys)."""
    if not isinstance(value, ir.OpResult):
        return False
    op = value.owner.operation  # an OpView, or the Operation itself
    return op.name == "mosaic_gpu.broadcasted_iota" and \
        ir.IntegerAttr(op.attributes["dimension"]).value == dimension


def lower_top_k(ctx: PallasContext, x: Operand, *, k: int, axis: int = -1,
                is_stable: bool = True) -> Lowered:
    from smalti.vocabulary.primitives import _lower_fun

    del is_stable
    [aval] = ctx.avals_in
    axis = int(axis) % len(aval.shape)
    _check_dtypes(ctx, "top_k")
    check_block(ctx, tuple(aval.shape), axis, "top_k")
    if int(k) == 1 and len(aval.shape) == 2:
        return _lower_fun(partial(top_1_f, axis=axis))(ctx, x)
    with lanes.for_operands(x):
        return _lower_fun(partial(top_k_f, k=int(k), axis=axis))(ctx, x)


def _padded_shape(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return tuple(_padded_length(s) if d == axis else s for d, s in enumerate(shape))


def estimate_sort(ctx: EstimatorContext, *avals: Aval, dimension: int, is_stable: bool,
                  num_keys: int) -> Resources:
    """The largest take: an int32 word of the padded block, or an operand
    (as :mod:`smalti.vocabulary.block_gather` pads it, where it gathers from
    it), or along the rows :mod:`smalti.vocabulary.column_sort`'s scratch."""
    del is_stable, num_keys
    padded = _padded_shape(tuple(avals[0].shape), dimension)
    sizes = [int(np.prod(padded)) * 4]
    if dimension == 0 and column_sort.applies(padded, np.int32):
        sizes.append(column_sort.scratch_bytes(padded))
    for a in avals:
        gathered = lanes.fits(a)  # where _gather_along may use block_gather
        sizes.append(block_gather.scratch_bytes(a) if gathered
                     else int(a.size) * np.dtype(a.dtype).itemsize)
    return take_scratch(ctx, (max(sizes),), np.uint8)


def estimate_sort_index(ctx: EstimatorContext, *avals: Aval, dimension: int, is_stable: bool,
                        num_keys: int, indices: tuple[tuple[int, str], ...],
                        unused: tuple[int, ...]) -> Resources:
    del indices, unused
    return estimate_sort(ctx, *avals, dimension=dimension, is_stable=is_stable,
                         num_keys=num_keys)


def estimate_top_k(ctx: EstimatorContext, aval: Aval, *, k: int, axis: int = -1,
                   is_stable: bool = True) -> Resources:
    del k, is_stable
    axis = int(axis) % len(aval.shape)
    return take_scratch(ctx, _padded_shape(tuple(aval.shape), axis), np.int32)
