"""The stability grid's table (docs/ablation.md) from scripts/stability.sh's comparisons.

Usage: python benchmarks/stability_table.py docs/stability
Reads OUT/lr*-warmup*/results.json (one `attnres compare --preset stability` per learning rate and
warm-up) and writes OUT/table.md: per setting and variant, the final validation loss (mean and 95 %
interval over seeds, and each seed's), the loss spikes, gradient-norm spikes and clip rate of each
seed's run (attnres.train.stability), and whether any run of the setting had a loss spike.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from study_tables import interval, table  # run as a script: benchmarks/ is on the path


def per_seed(totals: list[dict], key: str, spec: str) -> str:
    """Each seed's event total `key` (format `spec`), "n/a" where a run has none."""
    return ", ".join(format(t[key], spec) if key in t else "n/a" for t in totals)


def setting_rows(results: dict) -> list[list[str]]:
    """One row per variant of one comparison."""
    train = results["settings"]["train"]
    rows = []
    for variant in results["variants"]:
        runs = sorted(variant["runs"], key=lambda r: r["seed"])
        losses = [float(r["final_val_loss"]) for r in runs]
        totals = [r.get("stability") or {} for r in runs]
        rows.append([f"{train['lr']:g}", str(train.get("warmup_steps", "n/a")), variant["name"], interval(losses),
                     ", ".join(f"{v:.3f}" for v in losses), per_seed(totals, "loss_spikes", "d"),
                     per_seed(totals, "grad_spikes", "d"), per_seed(totals, "clip_rate", ".0%")])
    return rows


def grid_order(path: Path) -> tuple[float, int]:
    """(lr, warm-up) of a setting's results.json, from its folder name "lr<lr>-warmup<steps>"."""
    lr, warmup = re.fullmatch(r"lr(.+)-warmup(\d+)", path.parent.name).groups()
    return float(lr), int(warmup)


def main(out: Path) -> None:
    rows = []
    for path in sorted(out.glob("lr*-warmup*/results.json"), key=grid_order):
        rows += setting_rows(json.loads(path.read_text()))
    header = ["lr", "warm-up", "variant", "val loss (95 % CI)", "per seed", "loss spikes", "grad spikes", "clip rate"]
    text = ("# Stability grid\n\nOne row per setting and variant; the events are each seed's run's totals "
            "(attnres.train.stability), in seed order.\n\n" + table(header, rows))
    (out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
