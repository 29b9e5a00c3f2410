"""Synthetic scaling sweeps drawn from known laws, shared by the summary and report tests.

Standard follows L(C) = 200 C^-0.15 + 2; a variant with compute advantage k has loss L(k C) at its
own compute C, so standard needs k times the compute for the variant's loss, at every C.
"""

import numpy as np

A, ALPHA, E = 200.0, 0.15, 2.0
COMPUTE = np.logspace(12, 16, 6)  # standard's training FLOPs of the six sizes
WIDTHS = (32, 48, 64, 96, 128, 192)
SEEDS = (0, 1)


def standard_loss(compute):
    return A * np.asarray(compute, dtype=float) ** -ALPHA + E


def size_name(i: int) -> str:
    return f"d{WIDTHS[i]}-l{4 + i}"


def ahead(advantage: float):
    """The loss law of a variant with a constant compute advantage over standard."""
    return lambda compute: standard_loss(advantage * compute)


def variant(name: str, residual: str, law, rng, noise: float = 0.002, sizes=range(6), flops_ratio: float = 1.0,
            **fields) -> dict:
    """A variant of the sweep: every size in `sizes` x SEEDS, its loss `law(flops)` times log-normal noise
    of `noise`; its FLOPs `flops_ratio` times standard's."""
    runs = []
    for i in sizes:
        flops = float(COMPUTE[i] * flops_ratio)
        for seed in SEEDS:
            loss = float(law(flops) * np.exp(rng.normal(0.0, noise)))
            runs.append({"size": size_name(i), "seed": seed, "parameters": int(12 * WIDTHS[i] ** 2 * (4 + i)),
                         "total_parameters": int(12 * WIDTHS[i] ** 2 * (4 + i) + 2048 * WIDTHS[i]),
                         "tokens": int(20 * 12 * WIDTHS[i] ** 2 * (4 + i)), "flops": flops, "final_val_loss": loss,
                         "val_curve": [[0, 7.6], [10, loss]], "step_time_s": 0.01 * (i + 1)})
    return {"name": name, "residual": residual, **fields, "runs": runs}


def sweep(seed: int = 0, noise: float = 0.002) -> list[dict]:
    """Standard; Block AttnRes at 1.3x (its FLOPs 2 % above standard's); Full AttnRes at 1.0x; and a
    Delta AttnRes run at two sizes only (too few for the 3-parameter law)."""
    rng = np.random.default_rng(seed)
    return [variant("standard", "standard", ahead(1.0), rng, noise),
            variant("block_attnres (N=8)", "block_attnres", ahead(1.3), rng, noise, flops_ratio=1.02, num_blocks=8),
            variant("full_attnres", "full_attnres", ahead(1.0), rng, noise, flops_ratio=1.06),
            variant("delta_attnres", "delta_attnres", ahead(1.1), rng, noise, sizes=(0, 5), flops_ratio=1.05)]


def below_floor(compute):
    """A law whose loss falls below standard's floor E = 2 within the sweep (past about 3e14 FLOPs)."""
    return 100.0 * np.asarray(compute, dtype=float) ** -ALPHA + 1.0
