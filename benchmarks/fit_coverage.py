"""Coverage of the scaling-law fit's bootstrap intervals on synthetic sweeps (docs/scaling.md).

Usage: python benchmarks/fit_coverage.py [--method residuals|cases] [--sizes 8] [--seeds 1] [--draws 60]
Draws `draws` synthetic sweeps from L(C) = 200 C^-0.15 + 2 at `sizes` computes from 1e13 to 1e17
FLOPs, `seeds` runs each with 1 % log-normal noise, fits each with 200 bootstrap replicates and
prints how often the 95 % percentile interval holds the true alpha, E and loss at the largest compute.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from attnres.scaling.fit import BOOTSTRAPS, Point, bootstrap_fits, percentile_interval

A, ALPHA, E = 200.0, 0.15, 2.0


def main(method: str, sizes: int, seeds: int, draws: int, replicates: int = 200, noise: float = 0.01) -> dict[str, float]:
    """The share of `draws` synthetic sweeps whose 95 % interval holds each true quantity."""
    compute = np.logspace(13, 17, sizes)
    truth = {"alpha": ALPHA, "E": E, "loss at the largest compute": A * compute[-1] ** -ALPHA + E}
    rng = np.random.default_rng(1)
    covered = dict.fromkeys(truth, 0)
    for draw in range(draws):
        points = [Point(c, (A * c ** -ALPHA + E) * math.exp(rng.normal(0, noise)), str(i), s)
                  for i, c in enumerate(compute) for s in range(seeds)]
        fits = [f for f in bootstrap_fits({"v": points}, replicates=replicates, seed=draw, method=method)["v"] if f]
        values = {"alpha": [f.alpha for f in fits], "E": [f.e for f in fits],
                  "loss at the largest compute": [f.loss(compute[-1]) for f in fits]}
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
