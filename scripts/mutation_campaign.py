#!/usr/bin/env python
"""The mutation campaign: real kernels, mutated, through jax and smalti.

Draws mutants of the seeds of ``tests.fuzz.mutants`` (official Pallas
kernels, kernels built with the dialect bindings, profiled kernels), from
mutant number ``--seed`` on, until ``--mutants`` verified mutants ran or
``--minutes`` passed; prints a table of outcome classes with counts and
time, and writes every bug's mutant to ``--found`` (textual MLIR, to keep as
a reproducer under tests/fuzz/reproducers/). Exits 1 if any bug was found.

    python scripts/mutation_campaign.py --mutants 2000 --minutes 30 --seed 0
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for `tests`

import smalti  # noqa: E402
from tests.fuzz import mutants  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=int, default=2000, help="verified mutants to run")
    parser.add_argument("--minutes", type=float, default=30.0, help="stop after this long")
    parser.add_argument("--seed", type=int, default=0, help="first mutant number")
    parser.add_argument("--no-official", action="store_true",
                        help="leave out the official Pallas kernels (faster seeds)")
    parser.add_argument("--found", type=Path, default=Path("mutation_bugs"),
                        help="folder for the mutants of bugs found")
    parser.add_argument("--details", action="store_true", help="print every non-ok outcome")
    args = parser.parse_args(argv)
    # Ops used on other architectures (the arch mutation) warn, as they should.
    warnings.simplefilter("ignore", smalti.ArchitectureWarning)

    start = time.perf_counter()
    seeds = mutants.default_seeds(official=not args.no_official)
    print(f"{len(seeds)} seeds in {time.perf_counter() - start:.1f} s", flush=True)
    outcomes: collections.Counter[str] = collections.Counter()
    seconds: collections.Counter[str] = collections.Counter()
    details: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    slowest, ran, tried, bugs = 0.0, 0, 0, 0
    number = args.seed
    campaign_start = time.perf_counter()
    while ran < args.mutants and time.perf_counter() - campaign_start < args.minutes * 60:
        seed = seeds[number % len(seeds)]
        tried += 1
        mutant = mutants.mutate(seed, number)
        number += 1
        if mutant.text is None:
            continue
        ran += 1
        began = time.perf_counter()
        try:
            outcome = mutants.run_mutant(mutant.text)
        except Exception as e:  # noqa: BLE001 - the harness itself broke
            outcome = mutants.Outcome("HARNESS ERROR", f"{type(e).__name__}: {e}", 0.0)
            traceback.print_exc()
        took = time.perf_counter() - began
        outcomes[outcome.kind] += 1
        seconds[outcome.kind] += took
        slowest = max(slowest, outcome.seconds)
        details[outcome.kind][outcome.detail.split(":")[0][:90]] += 1
        if outcome.kind.startswith(("BUG", "HARNESS")):
            bugs += 1
            args.found.mkdir(exist_ok=True)
            path = args.found / f"{seed.name.replace('#', '_')}-{mutant.number}.mlir"
            lines = "\n".join((f"found: {outcome.kind}: {outcome.detail}", f"seed: {seed.name}",
                               *mutant.mutations, f"smalti: {outcome.smalti_error[:400]}",
                               f"jax: {outcome.jax_error[:300]}"))
            header = "".join(f"// {line}\n" for line in lines.splitlines() if line.strip())
            path.write_text(header + mutant.text)
            print(f"{outcome.kind}: {seed.name} #{mutant.number}: {outcome.detail[:200]} "
                  f"-> {path}", flush=True)
        if ran % 250 == 0:
            print(f"... {ran} mutants, {time.perf_counter() - campaign_start:.0f} s", flush=True)
    total = time.perf_counter() - campaign_start
    print(f"\n{ran} verified mutants ({tried} drawn, {tried - ran} did not verify) "
          f"in {total:.0f} s; slowest smalti call {slowest:.2f} s")
    print(f"{'outcome':55} {'mutants':>8} {'seconds':>9}")
    for kind, count in outcomes.most_common():
        print(f"{kind:55} {count:8} {seconds[kind]:9.1f}")
        if args.details or kind != "ok":
            for detail, n in details[kind].most_common(12):
                print(f"    {n:6}  {detail}")
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
