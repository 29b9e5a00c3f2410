"""The machine probe of a scaling sweep: the same runs on another floating-point path, side by side.

Small CPU runs part ways on floating-point details alone. This reads a sweep's results.json and a
probe's (the same preset and settings, a part of its sizes, run with another kernel set, e.g.
`ATEN_CPU_CAPABILITY=avx2 attnres scaling --preset cpu --sizes ... --seeds 1 --out PROBE`), pairs
their runs by variant, size and seed, and writes PROBE/probe.md: each run's final loss on both
paths, how far the probe moved it, the paired difference to standard on both paths, and the
seeds' spread at each size in the sweep, which is the noise the fit's intervals already carry.

    python tools/benchmarks/scaling_probe.py results/scaling results/scaling-probe
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

# Run as a file from anywhere: the page helpers it shares are the repository's tools/, not the library's.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.pages.scaling import paired_rows, seed_spread_by_size


def probe_markdown(sweep: dict, probe: dict, sweep_dir: str, probe_dir: str) -> str:
    """probe.md: the paired table and what it says."""
    rows = paired_rows(sweep, probe)
    if not rows:
        raise ValueError("the sweep and the probe share no run (variant, size and seed)")
    spread = seed_spread_by_size(sweep)
    fmt = lambda x: "-" if x is None else f"{x:+.3f}"  # noqa: E731
    capability = lambda r: r.get("machine", {}).get("cpu_capability", "?")  # noqa: E731
    lines = [f"# Machine probe of {sweep_dir}", "",
             f"The sweep ran with PyTorch's `{capability(sweep)}` CPU kernels; the probe (`{probe_dir}`) ran the "
             f"same settings with `{capability(probe)}`. Command of the probe: `{probe.get('command', '?')}`.", "",
             "| size | variant | seed | loss (sweep) | loss (probe) | moved | Δ vs standard (sweep) | "
             "Δ vs standard (probe) | seed spread at the size |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        s = spread.get(r["size"])
        lines.append(f"| {r['size']} | {r['variant']} | {r['seed']} | {r['sweep']:.4f} | {r['probe']:.4f} | "
                     f"{r['moved']:+.4f} | {fmt(r['diff_sweep'])} | {fmt(r['diff_probe'])} | "
                     f"{'-' if s is None else f'{s:.4f}'} |")
    moved = [abs(r["moved"]) for r in rows]
    pairs = [r for r in rows if r["diff_sweep"] is not None]
    flips = [r for r in pairs if (r["diff_sweep"] > 0) != (r["diff_probe"] > 0)]
    shifts = [abs(r["diff_probe"] - r["diff_sweep"]) for r in pairs]
    lines += ["", f"{len(rows)} runs on both paths: the probe moved final losses by {max(moved):.4f} nats at most "
                  f"(median {statistics.median(moved):.4f}); the seeds' spread at these sizes is "
                  f"{', '.join(f'{k} {v:.4f}' for k, v in sorted(spread.items()) if k in {r['size'] for r in rows})}.",
              f"Paired differences to standard moved by {max(shifts):.4f} at most "
              f"(median {statistics.median(shifts):.4f}); {len(flips)} of {len(pairs)} changed sign"
              + (": " + ", ".join(f"{r['variant']} at {r['size']} seed {r['seed']}" for r in flips) if flips else "")
              + "." if pairs else "No variant shares a size and seed with standard in both."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", help="the sweep's report folder (results.json)")
    parser.add_argument("probe", help="the probe's report folder (results.json); probe.md is written here")
    args = parser.parse_args(argv)
    sweep = json.loads((Path(args.sweep) / "results.json").read_text())
    probe = json.loads((Path(args.probe) / "results.json").read_text())
    text = probe_markdown(sweep, probe, args.sweep, args.probe)
    (Path(args.probe) / "probe.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
