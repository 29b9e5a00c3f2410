"""The CPU scaling sweep (results/scaling, results/scaling-probe): each variant's compute advantage over
standard from the fitted laws, in FLOPs and in wall-clock time, and the sweep on another floating-point path."""

from __future__ import annotations

import math
import statistics

from attnres.common.errors import InputError
from tools.pages.seeds import table
from tools.pages.sources import provenance
from attnres.report.scaling_report import advantage_row, quoted_law, wall_clock_advantage, wall_clock_rows

SCALING, PROBE = "scaling/results.json", "scaling-probe/results.json"
BASELINE = "standard"


def advantage_at_max(results: dict, name: str) -> dict | None:
    """The quoted law's compute advantage of `name` at the largest compute: {"law", "value", "low",
    "high"} (None ends: beyond standard's floor), and "time": the same in wall-clock time on the sweep's
    CPU (saturating law only, else None); None when neither law gives one."""
    fit = results["fit"]
    law, _ = quoted_law(fit, name)
    if law is None:
        return None
    entry = fit["advantage"][law][name]
    at = entry["at_max"]
    in_time = wall_clock_advantage(results).get(name, {}) if results.get("cost") else {}
    return {"law": law, "value": at["value"], "low": at["low"] if entry["replicates"] else None,
            "high": at["high"] if entry["replicates"] else None,
            "time": {k: in_time.get(k) for k in ("value", "low", "high")} if law == "saturating" else None}


def sweep_words(results: dict) -> str:
    sizes = results["sizes"]
    c_low, c_high = results["fit"]["compute_range"]
    return (f"{len(sizes)} sizes from {sizes[0]['name']} to {sizes[-1]['name']} "
            f"({sizes[0]['total_parameters'] / 1e6:.2f}M to {sizes[-1]['total_parameters'] / 1e6:.1f}M parameters), "
            f"{results['rules']['tokens_per_parameter']} tokens per non-embedding parameter, "
            f"{_e(c_low)} to {_e(c_high)} training FLOPs")


def _e(value: float) -> str:
    """8.8e13, not 8.8e+13."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def scaling_advantage(ctx) -> str:
    """Per variant: the compute advantage at the largest compute under both laws, the final loss at the
    largest size, and the advantage in wall-clock time on the sweep's CPU."""
    results = ctx.results.json(SCALING)
    fit, finals = results["fit"], results["tables"]["final_losses"]
    largest = results["sizes"][-1]["name"]
    in_time = {row[0]: row for row in wall_clock_rows(results)}
    rows = []
    for variant in results["variants"]:
        name = variant["name"]
        final = finals[name][largest]["mean"]
        if name == fit["baseline"]:
            rows.append([name, "1", "1", f"{final:.3f}", "1.00×", "-"])
            continue
        law, _ = quoted_law(fit, name)
        saturating = advantage_row("saturating", name, fit["advantage"]["saturating"][name])
        power = advantage_row("power", name, fit["advantage"]["power"][name])
        cell = lambda row: f"{row[2]} [{row[3].replace(' to ', ', ')}]" if row[3] != "-" else row[2]  # noqa: E731
        rows.append([name + ("" if law == "saturating" else f" (quoted: {law} law)"), cell(saturating), cell(power),
                     f"{final:.3f}", in_time[name][1].split(" [")[0], in_time[name][5]])
    header = ["variant", "compute advantage at C_max, saturating law [95 % CI]", "power law [95 % CI]",
              f"final loss at {largest}", f"training step × standard at {largest}", "advantage in wall-clock time"]
    return "\n\n".join([table(header, rows), f"*{sweep_words(results)}.*",
                        provenance(results, ctx.source(SCALING), code_path=results["cost"]["settings"])])


def _losses(results: dict) -> dict[tuple[str, str, int], float]:
    return {(v["name"], r["size"], r["seed"]): r["final_val_loss"] for v in results["variants"] for r in v["runs"]}


def paired_rows(sweep: dict, probe: dict) -> list[dict]:
    """One row per run present in both: {"variant", "size", "seed", "sweep", "probe", "moved",
    "diff_sweep", "diff_probe"} (diff_*: the variant's loss minus standard's at that size and seed;
    None for standard itself)."""
    main, other = _losses(sweep), _losses(probe)
    rows = []
    for key in sorted(set(main) & set(other), key=lambda k: (k[1], k[2], k[0] != BASELINE, k[0])):
        name, size, seed = key
        base = (BASELINE, size, seed)
        both = name != BASELINE and base in main and base in other
        rows.append({"variant": name, "size": size, "seed": seed, "sweep": main[key], "probe": other[key],
                     "moved": other[key] - main[key],
                     "diff_sweep": main[key] - main[base] if both else None,
                     "diff_probe": other[key] - other[base] if both else None})
    return rows


def seed_spread_by_size(sweep: dict) -> dict[str, float]:
    """Per size, the pooled sample standard deviation of final loss between seeds over the variants
    (sizes with one seed are left out)."""
    squares, dof = {}, {}
    for variant in sweep["variants"]:
        by_size: dict[str, list[float]] = {}
        for run in variant["runs"]:
            by_size.setdefault(run["size"], []).append(run["final_val_loss"])
        for size, losses in by_size.items():
            if len(losses) > 1:
                mean = statistics.fmean(losses)
                squares[size] = squares.get(size, 0.0) + sum((x - mean) ** 2 for x in losses)
                dof[size] = dof.get(size, 0) + len(losses) - 1
    return {size: math.sqrt(squares[size] / dof[size]) for size in squares}


def scaling_probe(ctx) -> str:
    """How far another floating-point path moves the sweep's runs, against the seeds' spread."""
    sweep, probe = ctx.results.json(SCALING), ctx.results.json(PROBE)
    rows = paired_rows(sweep, probe)
    if not rows:
        raise InputError("the sweep and the probe share no run")
    spread = seed_spread_by_size(sweep)
    pairs = [r for r in rows if r["diff_sweep"] is not None]
    flips = sum((r["diff_sweep"] > 0) != (r["diff_probe"] > 0) for r in pairs)
    sizes = sorted({r["size"] for r in rows}, key=lambda s: [x["name"] for x in sweep["sizes"]].index(s))
    capability = lambda r: r.get("machine", {}).get("cpu_capability", "?")  # noqa: E731
    text = (f"{len(rows)} runs of the sweep ({', '.join(sizes)}) rerun with PyTorch's {capability(probe)} kernels "
            f"instead of {capability(sweep)}: final losses moved by at most {max(abs(r['moved']) for r in rows):.4f} "
            f"nats, paired differences to standard by at most "
            f"{max(abs(r['diff_probe'] - r['diff_sweep']) for r in pairs):.4f}, and {flips} of {len(pairs)} changed "
            f"sign; the seeds' spread at these sizes is "
            f"{', '.join(f'{s} {spread[s]:.4f}' for s in sizes if s in spread)}.")
    return "\n\n".join([text, provenance(probe, ctx.source(PROBE))])
