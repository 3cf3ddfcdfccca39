#!/usr/bin/env python
"""The long fuzz campaign: random kernels through smalti and jax.

Runs ``--cases`` well-formed kernels (smalti must agree with jax) and as many
ill-formed ones (only smalti errors may come out, failed steps change
nothing), from seed ``--start`` on, and prints how often each outcome
occurred and every case that broke a rule (with its seed, to replay with
``tests.fuzz``). Exits 1 if any case did.

    python scripts/fuzz_campaign.py --cases 2000 --minutes 15
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for `tests`

from tests.fuzz.kernels import well_formed  # noqa: E402
from tests.fuzz.oracle import check_ill_formed, check_well_formed  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000, help="cases of each kind")
    parser.add_argument("--start", type=int, default=1_000_000, help="first seed")
    parser.add_argument("--minutes", type=float, default=15.0, help="stop after this long")
    args = parser.parse_args(argv)
    checks = {"well-formed": lambda s: check_well_formed(well_formed(s)),
              "ill-formed": check_ill_formed}
    outcomes: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    start, run = time.perf_counter(), 0
    for seed in range(args.start, args.start + args.cases):
        if time.perf_counter() - start > args.minutes * 60:
            break
        for kind, check in checks.items():
            run += 1
            try:
                outcomes[f"{kind}: {check(seed)}"] += 1
            except AssertionError as e:
                outcomes[f"{kind}: FAILED"] += 1
                failures.append(f"{kind} seed {seed}: {e}")
            except Exception as e:  # noqa: BLE001 - the harness itself broke
                outcomes[f"{kind}: HARNESS ERROR"] += 1
                failures.append(f"{kind} seed {seed}: harness error "
                                f"{''.join(traceback.format_exception_only(e)).strip()}")
    seconds = time.perf_counter() - start
    print(f"{run} cases in {seconds:.0f} s (seeds {args.start}..{seed})")
    for label, count in sorted(outcomes.items()):
        print(f"{count:6d}  {label}")
    for failure in failures:
        print("FAILED", failure[:2000])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
