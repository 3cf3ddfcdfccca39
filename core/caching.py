"""Memoizing functions of MLIR types and attributes without leaking contexts.

An ``ir.Type`` or ``ir.Attribute`` keeps its context alive, and with it
everything uniqued there (for a large kernel, its locations and attributes:
about a megabyte). A ``functools.lru_cache`` keyed by them keeps up to
``maxsize`` dead kernels' contexts in a long-lived process. :func:`per_context`
keeps the entries of one context at a time: inference and lowering work on
one module at a time, so they still hit, and at most the latest context is
retained.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from jax._src.lib.mlir import ir


def per_context[Result](function: Callable[..., Result]) -> Callable[..., Result]:
    """Memoizes ``function(key, *args)``, ``key`` an ``ir.Type`` or
    ``ir.Attribute`` and ``args`` hashable, for the context of the latest
    ``key`` only (a key of another context starts the cache afresh)."""
    cache: dict[Any, Result] = {}
    owner: ir.Context | None = None

    @functools.wraps(function)
    def cached(key: ir.Type | ir.Attribute, *args: Any) -> Result:
        nonlocal owner
        context = key.context
        if context is not owner:
            cache.clear()
            owner = context
        entry = (key, *args) if args else key
        try:
            return cache[entry]
        except KeyError:
            value = cache[entry] = function(key, *args)
            return value

    def cache_clear() -> None:
        nonlocal owner
        cache.clear()
        owner = None

    cached.cache_clear = cache_clear  # type: ignore[attr-defined]
    return cached
