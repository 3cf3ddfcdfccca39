"""The benchmark's statistics (the timings themselves are shown by running it)."""

from __future__ import annotations

import gc
import weakref

import pytest

from benchmarks.run import collector_kept_out, ratio_by_turns


def test_a_ratio_by_turns_is_not_set_by_one_lucky_run():
    # One read walk in a fast moment: the fastest over the fastest says 10x,
    # every turn says 5x.
    reads = [1.0, 1.0, 0.5, 1.0, 1.0]
    infers = [5.0, 5.0, 5.0, 5.0, 5.0]
    assert min(infers) / min(reads) == 10.0
    assert ratio_by_turns(infers, reads) == 5.0


def test_a_ratio_by_turns_follows_the_machine_through_a_drift():
    # The machine slows down by half mid-run: each turn still says 4x, while
    # the fastest of each come from different moments.
    reads = [1.0, 1.0, 1.5, 1.5, 1.5]
    infers = [4.0, 4.0, 6.0, 6.0, 6.0]
    assert ratio_by_turns(infers, reads) == 4.0
    reads_late_fast = [1.5, 1.5, 1.5, 1.0, 1.0]
    infers_late_slow = [6.0, 6.0, 6.0, 4.0, 4.0]
    assert ratio_by_turns(infers_late_slow, reads_late_fast) == 4.0


def test_turns_must_pair_up():
    with pytest.raises(ValueError):
        ratio_by_turns([1.0, 2.0], [1.0])


def test_collector_kept_out_collects_first_and_pauses_collection_during_the_run():
    class Cycle:
        def __init__(self) -> None:
            self.me = self

    garbage = Cycle()
    witness = weakref.ref(garbage)
    del garbage
    assert gc.isenabled()
    with collector_kept_out():
        assert witness() is None  # collected before the run
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_kept_out():
            pass
        assert not gc.isenabled()  # a caller's choice is left as it was
    finally:
        gc.enable()
