"""Coverage of the scaling-law fit's bootstrap intervals on synthetic sweeps (docs/explanation/scaling-law.md).

    .venv/bin/python tools/benchmarks/fit_coverage.py [--out results/fit-coverage]      # every configuration below
    .venv/bin/python tools/benchmarks/fit_coverage.py --method cases --sizes 8 --seeds 1 --draws 60   # one of them

Draws synthetic sweeps from L(C) = 200 C^-0.15 + 2 at `sizes` computes from 1e13 to 1e17 FLOPs,
`seeds` runs each with 1 % log-normal noise, fits each with 200 bootstrap replicates and reports how
often the 95 % percentile interval holds the true alpha, E and loss at the largest compute, and, for
a second variant drawn with its own noise from L(1.25 C) (a constant 1.25x compute advantage), how
often the paired interval of its compute advantage at the largest compute holds 1.25.

Without --method/--sizes/--seeds/--draws it runs the configurations docs/explanation/scaling-law.md quotes
(`CONFIGURATIONS`) and writes them all to OUT/results.json. The draws are the same whatever their
number (sweep i comes from generators seeded per configuration and is bootstrapped with seed i), so
a configuration with fewer sweeps than another of the same shape is the first sweeps of that one
and is read from it rather than run again.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from attnres.common.atomic import write_atomic
from attnres.common.machine import machine_info
from attnres.report.document import dumps_json, jsonable
from attnres.scaling.fit import BOOTSTRAPS, Point, bootstrap_fits, compute_advantage, percentile_interval

A, ALPHA, E = 200.0, 0.15, 2.0
ADVANTAGE = 1.25  # the second variant's true compute advantage over the first, at every compute
COMPUTE_RANGE = (1e13, 1e17)
# (method, sizes, seeds, sweeps): the runs docs/explanation/scaling-law.md quotes.
CONFIGURATIONS = [("residuals", 8, 1, 60), ("residuals", 8, 1, 300), ("cases", 8, 1, 60), ("cases", 8, 1, 300),
                  ("residuals", 5, 2, 200)]


def _draw(compute: np.ndarray, seeds: int, rng: np.random.Generator, noise: float, ahead: float = 1.0) -> list[Point]:
    """One variant's runs: loss L(ahead x C) with log-normal noise, `seeds` per compute."""
    return [Point(c, (A * (ahead * c) ** -ALPHA + E) * math.exp(rng.normal(0, noise)), str(i), s)
            for i, c in enumerate(compute) for s in range(seeds)]


def truth(sizes: int) -> dict[str, float]:
    """The true value of each quantity an interval is checked against."""
    largest = np.logspace(*np.log10(COMPUTE_RANGE), sizes)[-1]
    return {"alpha": ALPHA, "E": E, "loss at the largest compute": A * largest ** -ALPHA + E,
            "compute advantage at the largest compute": ADVANTAGE}


def covered_draws(method: str, sizes: int, seeds: int, draws: int, replicates: int = 200,
                  noise: float = 0.01) -> dict[str, list[bool]]:
    """Per quantity, whether each of `draws` synthetic sweeps' 95 % interval holds the true value."""
    compute = np.logspace(*np.log10(COMPUTE_RANGE), sizes)
    true_values = truth(sizes)
    rng, rng_ahead = np.random.default_rng(1), np.random.default_rng(2)  # standard's draws as before the second variant
    covered: dict[str, list[bool]] = {key: [] for key in true_values}
    for draw in range(draws):
        sweep = {"standard": _draw(compute, seeds, rng, noise),
                 "ahead": _draw(compute, seeds, rng_ahead, noise, ADVANTAGE)}
        replicates_of = bootstrap_fits(sweep, replicates=replicates, seed=draw, method=method)
        fits = [f for f in replicates_of["standard"] if f]
        pairs = [(s, v) for s, v in zip(replicates_of["standard"], replicates_of["ahead"]) if s and v]
        values = {"alpha": [f.alpha for f in fits], "E": [f.e for f in fits],
                  "loss at the largest compute": [f.loss(compute[-1]) for f in fits],
                  "compute advantage at the largest compute": [compute_advantage(v, s, compute[-1]) for s, v in pairs]}
        for key, true_value in true_values.items():
            low, high = percentile_interval(values[key])
            covered[key].append(bool(low <= true_value <= high))
    return covered


def main(method: str, sizes: int, seeds: int, draws: int, replicates: int = 200,
         noise: float = 0.01) -> dict[str, float]:
    """The share of `draws` synthetic sweeps whose 95 % interval holds each true quantity."""
    return {key: sum(hits) / draws
            for key, hits in covered_draws(method, sizes, seeds, draws, replicates, noise).items()}


def configuration_entry(method: str, sizes: int, seeds: int, draws: int, hits: dict[str, list[bool]],
                        replicates: int, noise: float, seconds: float | None, first_of: int | None = None) -> dict:
    """One configuration's record: its shape, the share and count of sweeps covered per quantity, and the
    binomial standard error of a 95 % coverage at this many sweeps."""
    entry = {"method": method, "sizes": sizes, "seeds": seeds, "draws": draws, "replicates": replicates,
             "noise": noise, "compute_range": list(COMPUTE_RANGE), "truth": truth(sizes),
             "coverage": {key: sum(h[:draws]) / draws for key, h in hits.items()},
             "covered": {key: sum(h[:draws]) for key, h in hits.items()},
             "binomial_standard_error": math.sqrt(0.95 * 0.05 / draws), "seconds": seconds}
    if first_of is not None:
        entry["first_draws_of"] = first_of  # the first `draws` sweeps of that many, not a separate run
    return entry


def run_configurations(configurations: list[tuple[str, int, int, int]], replicates: int = 200,
                       noise: float = 0.01) -> list[dict]:
    """Every configuration's entry, in the order given; each shape is run once, at its largest draws."""
    longest: dict[tuple[str, int, int], int] = {}
    for method, sizes, seeds, draws in configurations:
        longest[(method, sizes, seeds)] = max(draws, longest.get((method, sizes, seeds), 0))
    runs = {}
    for shape, draws in longest.items():
        start = time.perf_counter()
        runs[shape] = covered_draws(*shape, draws, replicates, noise), time.perf_counter() - start
    entries = []
    for method, sizes, seeds, draws in configurations:
        hits, seconds = runs[(method, sizes, seeds)]
        full = longest[(method, sizes, seeds)]
        entries.append(configuration_entry(method, sizes, seeds, draws, hits, replicates, noise,
                                           seconds if draws == full else None, None if draws == full else full))
        rates = entries[-1]["coverage"]
        print(f"{method}, {sizes} sizes x {seeds} seed(s), {draws} sweeps: "
              + ", ".join(f"{k} {v:.0%}" for k, v in rates.items())
              + (f" ({seconds:.0f} s)" if draws == full else f" (the first {draws} of {full})"), flush=True)
    return entries


def cli(argv: list[str] | None = None) -> Path:
    """Parse `argv`, run the configurations and write OUT/results.json; returns its path."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=BOOTSTRAPS, help="one configuration: this method (default residuals)")
    parser.add_argument("--sizes", type=int, help="one configuration: this many sizes (default 8)")
    parser.add_argument("--seeds", type=int, help="one configuration: this many seeds per size (default 1)")
    parser.add_argument("--draws", type=int, help="one configuration: this many synthetic sweeps (default 60)")
    parser.add_argument("--replicates", type=int, default=200, help="bootstrap replicates per sweep")
    parser.add_argument("--noise", type=float, default=0.01, help="log-normal noise of each run's loss")
    parser.add_argument("--out", default="results/fit-coverage", help="folder of results.json")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    single = (args.method, args.sizes, args.seeds, args.draws)
    configurations = CONFIGURATIONS if single == (None,) * 4 else [
        (args.method or "residuals", args.sizes or 8, args.seeds or 1, args.draws or 60)]
    start = time.perf_counter()
    entries = run_configurations(configurations, args.replicates, args.noise)
    document = {"command": shlex.join([os.path.relpath(sys.executable), os.path.relpath(__file__), *argv]),
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "machine": machine_info(torch.device("cpu")),
                "code_path": {"precision": "float64", "routing_impl": None},
                "settings": {"configurations": [list(c) for c in configurations], "replicates": args.replicates,
                             "noise": args.noise, "confidence": 0.95, "law": {"A": A, "alpha": ALPHA, "E": E},
                             "advantage": ADVANTAGE, "compute_range": list(COMPUTE_RANGE)},
                "seconds": time.perf_counter() - start, "configurations": entries}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return write_atomic(out / "results.json", dumps_json(jsonable(document)) + "\n")


if __name__ == "__main__":
    print(f"wrote {cli()}")
