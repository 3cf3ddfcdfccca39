"""The emulator's race detector on the catalogue of racy kernels and their
clean twins (tests/emulate/race_kernels.py).

A racy kernel must raise ``RaceError`` (by default, ``on_race="raise"``)
and one of its reported races must be the catalogued one: same kind, memory
space, agents and both source lines. Every reported race must be
self-consistent (its kind matches which access writes; the two byte ranges
overlap). A clean twin must run without a race report and compute numpy's
answer. ``on_race="warn"``/``"ignore"`` and the ``SMALTI_EMULATE_ON_RACE``
default are checked on one racy kernel.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import smalti.emulate as emu
from tests.emulate.race_kernels import MARKS, RAW, THREAD, WAR, WAW, entries

ENTRIES = {e.name: e for e in entries()}
RACY = sorted(name for name, e in ENTRIES.items() if e.race is not None)
CLEAN = sorted(name for name, e in ENTRIES.items() if e.race is None)
KINDS = {RAW, WAR, WAW}
SPACES = {"smem", "gmem", "tmem"}


@pytest.fixture(autouse=True)
def built_in_default(monkeypatch):
    """Tests of the default see the built-in one, whatever the caller's environment."""
    monkeypatch.delenv("SMALTI_EMULATE_ON_RACE", raising=False)


def line_of(access) -> int | None:
    """The line of ``race_kernels.py`` an access's location names, else None."""
    path, _, line = access.location.rpartition(":")
    if path.endswith("race_kernels.py") and line.isdigit():
        return int(line)
    return None


def agent_is(agent: str, expected: str | None) -> bool:
    if expected is None:
        return True
    if expected == THREAD:
        return agent.startswith("block") and "warpgroup" in agent
    return agent.startswith(expected)  # TMA, WGMMA


def orientation(race, expected):
    """The (kind, first line, second line, agents) of ``expected.accepted()``
    that ``race`` reports, else None."""
    for kind, first_line, second_line, agents in expected.accepted():
        if (race.space == expected.space and race.kind == kind
                and line_of(race.first) == first_line and line_of(race.second) == second_line):
            return kind, first_line, second_line, agents
    return None


def check_consistent(race) -> None:
    """What holds for every reported race, whatever the kernel."""
    assert isinstance(race, emu.Race)
    assert race.kind in KINDS and race.space in SPACES
    writes = (race.first.is_write, race.second.is_write)
    assert writes == {RAW: (True, False), WAR: (False, True), WAW: (True, True)}[race.kind]
    for access in (race.first, race.second):
        assert isinstance(access.op, str) and access.op
        assert isinstance(access.agent, str) and access.agent
        assert isinstance(access.allocation, str)
        assert 0 <= access.start < access.stop
    assert race.first.allocation == race.second.allocation
    assert max(race.first.start, race.second.start) < min(race.first.stop, race.second.stop)
    text = str(race)
    assert len(text.splitlines()) >= 3  # the two accesses and a fix
    assert race.first.location in text and race.second.location in text


def check_outputs(entry, got) -> None:
    want = entry.ref(*entry.args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        if entry.rtol:
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                       rtol=entry.rtol, atol=entry.rtol)
        else:
            np.testing.assert_array_equal(g, w)


def test_catalogue_is_well_formed():
    """Every racy entry's marks exist, every mark in the file is used, and
    each rule of the brief has a racy kernel and a clean twin."""
    used = set()
    for entry in ENTRIES.values():
        if entry.race is not None:
            assert entry.race.first_line > 0 and entry.race.second_line > 0
            used.add(entry.race.mark)
    assert {mark for _, mark in MARKS} == used
    rules = {}
    for entry in ENTRIES.values():
        rules.setdefault(entry.rule, set()).add(entry.verdict)
    assert {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"} <= set(rules)
    assert all(verdicts == {"race", "clean"} for verdicts in rules.values())


@pytest.mark.parametrize("name", RACY)
def test_racy_kernel_raises_the_catalogued_race(name):
    entry = ENTRIES[name]
    with pytest.raises(emu.RaceError) as info, warnings.catch_warnings():
        # a read that races its write may also come before it: not this test's business
        warnings.simplefilter("ignore", emu.UninitializedReadWarning)
        emu.run(entry.fn, *entry.args)
    assert isinstance(info.value, emu.EmulationError)
    races = info.value.races
    assert races, "RaceError with no races"
    for race in races:
        check_consistent(race)
    expected = entry.race
    found = [(r, orientation(r, expected)) for r in races if orientation(r, expected)]
    assert found, (f"expected {expected.kind} in {expected.space} between lines "
                   f"{expected.first_line} and {expected.second_line}; reported:\n"
                   + "\n".join(str(r) for r in races))
    assert any(agent_is(r.first.agent, agents[0]) and agent_is(r.second.agent, agents[1])
               for r, (_, _, _, agents) in found), (
        f"expected agents {expected.agents} (a warpgroup's agent starts with 'block', "
        "an asynchronous unit's with 'TMA' or 'WGMMA'); reported: "
        + "; ".join(f"{r.first.agent!r} then {r.second.agent!r}" for r, _ in found))


@pytest.mark.parametrize("name", CLEAN)
def test_clean_twin_runs_and_computes_the_reference(name):
    entry = ENTRIES[name]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = emu.run(entry.fn, *entry.args)
    check_outputs(entry, got)
    uninitialized = [w for w in record if issubclass(w.category, emu.UninitializedReadWarning)]
    assert not uninitialized, [str(w.message) for w in uninitialized]


WARN_CASE = "tma_store_without_commit_smem"


def races_of(entry) -> list:
    with pytest.raises(emu.RaceError) as info:
        emu.run(entry.fn, *entry.args, on_race="raise")
    return info.value.races


def race_warnings(record) -> list:
    return [w for w in record if issubclass(w.category, emu.RaceWarning)]


def test_on_race_warn_warns_once_per_race_and_returns_the_outputs():
    entry = ENTRIES[WARN_CASE]
    races = races_of(entry)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = emu.run(entry.fn, *entry.args, on_race="warn")
    found = race_warnings(record)
    assert issubclass(emu.RaceWarning, UserWarning)
    assert len(found) == len(races)
    line = f"race_kernels.py:{entry.race.second_line}"
    assert any(line in str(w.message) for w in found)
    (out,) = got
    assert out.shape == (64, 64) and out.dtype == np.float32


def test_on_race_ignore_returns_the_same_outputs_silently():
    entry = ENTRIES[WARN_CASE]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        warned = emu.run(entry.fn, *entry.args, on_race="warn")
        ignored = emu.run(entry.fn, *entry.args, on_race="ignore")
    assert len(race_warnings(record)) == len(races_of(entry))  # the "warn" run's only
    assert len(warned) == len(ignored)
    for w, i in zip(warned, ignored):
        np.testing.assert_array_equal(w, i)


def test_environment_variable_sets_the_default(monkeypatch):
    entry = ENTRIES[WARN_CASE]
    monkeypatch.setenv("SMALTI_EMULATE_ON_RACE", "warn")
    with pytest.warns(emu.RaceWarning):
        emu.run(entry.fn, *entry.args)
    monkeypatch.setenv("SMALTI_EMULATE_ON_RACE", "ignore")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        emu.run(entry.fn, *entry.args)
    assert not race_warnings(record)
    with pytest.raises(emu.RaceError):  # an explicit argument wins over the default
        emu.run(entry.fn, *entry.args, on_race="raise")
    monkeypatch.setenv("SMALTI_EMULATE_ON_RACE", "raise")
    with pytest.raises(emu.RaceError):
        emu.run(entry.fn, *entry.args)


def test_contract_names_exist():
    """The error and warning classes the race checker's callers rely on."""
    for name in ("RaceError", "UninitializedRead", "OutOfBounds", "BarrierDivergence",
                 "Deadlock"):
        assert issubclass(getattr(emu, name), emu.EmulationError), name
    assert issubclass(emu.UninitializedReadWarning, UserWarning)
    assert issubclass(emu.RaceWarning, UserWarning)

