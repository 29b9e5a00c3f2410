"""tools.pages.kimi_linear: hyper-connections against standard on the Kimi Linear stability grid."""

import json
from pathlib import Path

from tools.pages import kimi_linear
from tools.pages.render import Context
from tools.pages.sources import Results

ROOT = Path(__file__).resolve().parents[3]


def test_hyper_connections_are_counted_against_standard_by_setting_and_seed(tmp_path):
    grid = tmp_path / "results" / "kimi-linear-stability"
    for lr, warmup, hc in ((3e-3, 60, [5.2, 5.1]), (6e-3, 10, [4.9, 5.3])):
        folder = grid / f"lr{lr:.1e}-warmup{warmup}"
        folder.mkdir(parents=True)
        runs = lambda losses: [{"seed": s, "final_val_loss": x} for s, x in enumerate(losses)]  # noqa: E731
        folder.joinpath("results.json").write_text(json.dumps({
            "settings": {"train": {"lr": lr, "warmup_steps": warmup}},
            "variants": [{"name": "standard", "runs": runs([5.0, 5.0])},
                         {"name": "hyper_connections", "runs": runs(hc)}]}))
    text = kimi_linear.kimi_linear_hyper_connections(Context(Results(tmp_path), "docs/explanation/kimi-linear.md"))
    assert text.startswith("Hyper-connections end above standard in 3 of the grid's 4 runs")
    assert "(lr 3e-3, 60 warm-up steps) by +0.200, +0.100 nats" in text
