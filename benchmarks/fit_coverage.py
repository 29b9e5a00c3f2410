"""Coverage of the scaling-law fit's bootstrap intervals on synthetic sweeps (docs/scaling.md).

Usage: python benchmarks/fit_coverage.py [--method residuals|cases] [--sizes 8] [--seeds 1] [--draws 60]
Draws `draws` synthetic sweeps from L(C) = 200 C^-0.15 + 2 at `sizes` computes from 1e13 to 1e17
FLOPs, `seeds` runs each with 1 % log-normal noise, fits each with 200 bootstrap replicates and
prints how often the 95 % percentile interval holds the true alpha, E and loss at the largest compute,
and, for a second variant drawn with its own noise from L(1.25 C) (a constant 1.25x compute
advantage), how often the paired interval of its compute advantage at the largest compute holds 1.25.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from attnres.scaling.fit import BOOTSTRAPS, Point, bootstrap_fits, compute_advantage, percentile_interval

A, ALPHA, E = 200.0, 0.15, 2.0
ADVANTAGE = 1.25  # the second variant's true compute advantage over the first, at every compute


def _draw(compute: np.ndarray, seeds: int, rng: np.random.Generator, noise: float, ahead: float = 1.0) -> list[Point]:
    """One variant's runs: loss L(ahead x C) with log-normal noise, `seeds` per compute."""
    return [Point(c, (A * (ahead * c) ** -ALPHA + E) * math.exp(rng.normal(0, noise)), str(i), s)
            for i, c in enumerate(compute) for s in range(seeds)]


def main(method: str, sizes: int, seeds: int, draws: int, replicates: int = 200, noise: float = 0.01) -> dict[str, float]:
    """The share of `draws` synthetic sweeps whose 95 % interval holds each true quantity."""
    compute = np.logspace(13, 17, sizes)
    truth = {"alpha": ALPHA, "E": E, "loss at the largest compute": A * compute[-1] ** -ALPHA + E,
             "compute advantage at the largest compute": ADVANTAGE}
    rng, rng_ahead = np.random.default_rng(1), np.random.default_rng(2)  # standard's draws as before the second variant
    covered = dict.fromkeys(truth, 0)
    for draw in range(draws):
        sweep = {"standard": _draw(compute, seeds, rng, noise),
                 "ahead": _draw(compute, seeds, rng_ahead, noise, ADVANTAGE)}
        replicates_of = bootstrap_fits(sweep, replicates=replicates, seed=draw, method=method)
        fits = [f for f in replicates_of["standard"] if f]
        pairs = [(s, v) for s, v in zip(replicates_of["standard"], replicates_of["ahead"]) if s and v]
        values = {"alpha": [f.alpha for f in fits], "E": [f.e for f in fits],
                  "loss at the largest compute": [f.loss(compute[-1]) for f in fits],
                  "compute advantage at the largest compute": [compute_advantage(v, s, compute[-1]) for s, v in pairs]}
        for key, true_value in truth.items():
            low, high = percentile_interval(values[key])
            covered[key] += low <= true_value <= high
    return {key: count / draws for key, count in covered.items()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=BOOTSTRAPS, default="residuals")
    parser.add_argument("--sizes", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--draws", type=int, default=60)
    args = parser.parse_args()
    start = time.perf_counter()
    rates = main(args.method, args.sizes, args.seeds, args.draws)
    print(f"{args.method}, {args.sizes} sizes x {args.seeds} seed(s), {args.draws} sweeps: "
          + ", ".join(f"{k} {v:.0%}" for k, v in rates.items()) + f" ({time.perf_counter() - start:.0f} s)")
