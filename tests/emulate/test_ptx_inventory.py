"""Every inline-PTX template in the installed jax's Mosaic GPU code generators
(``jax/experimental/mosaic/gpu/*.py``, read as source: ``ptx_inventory.py``)
is either modelled by the emulator's table or listed, with the reason, in
docs/emulator.md's table of PTX not modelled."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import pytest

from tests.emulate.ptx_inventory import Site, needed_rows, not_modelled_table, problems, sites

DOC = Path(__file__).resolve().parents[2] / "docs" / "emulator.md"
MOSAIC = Path(jax.__file__).parent / "experimental" / "mosaic" / "gpu"


@pytest.fixture(scope="module")
def listed():
    return not_modelled_table(DOC.read_text())


def test_the_inventory_finds_the_known_sites():
    """The parser finds the sites it must (so a clean verdict means something):
    jax's conversions, WGMMA, barriers, TMA, tcgen05."""
    found = sites(MOSAIC)
    text = "\n".join(t for s in found for t in s.templates)
    lines = "\n".join(line for s in found for b in s.blocks for line in b)
    for needle in ["wgmma.mma_async", "sub.bf16x2", "prmt.b32", "tcgen05.alloc", "bar.sync",
                   "max.NaN.f16x2", "max.s16x2"]:
        assert needle in text, needle
    # FragmentedArray.astype's conversion block, joined from a list of lines
    for needle in ["cvt.rn.satfinite.e4m3x2.f32", "cvt.rn.f16x2.e5m2x2",
                   "cvt.rn.satfinite.e2m1x2.f32", "cvt.rp.satfinite.ue8m0x2.bf16x2"]:
        assert needle in lines, needle
    assert len(found) > 40


def test_every_jax_ptx_template_is_modelled_or_listed(listed):
    bad = [p for s in sites(MOSAIC) for p in problems(s, listed)]
    assert not bad, ("inline PTX that jax emits is neither modelled nor listed in "
                     "docs/emulator.md's not-modelled table:\n" + "\n".join(bad))


def test_the_verdict_reports_an_unlisted_template_and_accepts_a_listed_one(listed):
    site = Site("x.py", 1, ["frobnicate.b32 $0;", "tcgen05.wait::ld.sync.aligned;",
                            "fence.proxy.async;"],
                [["cvt.rn.satfinite.e4m3x2.f32 r, $2, $1;", "frob.b16 $0, r;"]])
    assert problems(site, listed) == [
        "x.py:1: 'frobnicate.b32 $0;'", "x.py:1: joined block with ['frob.b16 $0, r']"]


def test_every_not_modelled_row_is_needed_by_this_jax_or_names_the_one_it_is_for(listed):
    """A row that no template of the installed jax needs is stale (what it
    listed is modelled now), unless its reason names the other jax version
    whose templates need it (CI reads both versions' sources)."""
    needed = needed_rows(sites(MOSAIC), listed)
    mine = ".".join(jax.__version__.split(".")[:2])
    stale = [p.pattern for p, reason in listed if p.pattern not in needed
             and not [v for v in re.findall(r"jax (\d+\.\d+)", reason) if v != mine]]
    assert not stale, f"rows of docs/emulator.md's not-modelled table no jax needs: {stale}"


def test_every_not_modelled_row_gives_a_reason(listed):
    assert listed
    for pattern, reason in listed:
        assert len(reason.split()) >= 3, pattern.pattern
