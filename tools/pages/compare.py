"""The main job (`tools/compare.sh`, results/compare-default): one seed of every variant of the default
preset on real text, with the cost measured after training; and the SmolLM2 fine-tuning runs."""

from __future__ import annotations

from tools.pages.ablation import scale_words, step_cell
from tools.pages.seeds import table
from tools.pages.sources import provenance
from attnres.report.compare_report import signed
from attnres.report.document import fmt

DEFAULT = "compare-default/results.json"
FINETUNE = {"standard": "standard", "Delta Block (N=6)": "delta-block-N-6",
            "Block AttnRes (N=6), zero queries": "block-attnres-N-6-zero-queries",
            "Block AttnRes (N=6), N(0, 0.02) queries": "block-attnres-N-6-N-0-0-02-queries"}


def compare_default(ctx) -> str:
    """Every variant of the default preset: loss, its difference to standard, step and memory cost, routing."""
    results = ctx.results.json(DEFAULT)
    rows = []
    for name, entry in results["summary"].items():
        rows.append([name, f"{entry['val_loss_mean']:.3f}",
                     "baseline" if name == "standard" else signed(entry["delta_vs_standard"]),
                     "1.00x" if name == "standard" else step_cell(entry), fmt(entry.get("peak_memory_ratio"), ".2f", "x"),
                     fmt(entry.get("max_weight_deep"), ".3f")])
    header = ["variant", "val loss", "Δ vs standard", "training step x (90 % CI)", "peak memory x",
              "max routing weight, deepest third"]
    return "\n\n".join([table(header, rows), f"*{scale_words(results)}: a first look, not a verdict.*",
                        provenance(results, ctx.source(DEFAULT))])


def finetune_table(ctx) -> str:
    """The SmolLM2 fine-tuning runs: first loss, early peak, late mean, held-out loss along the way."""
    rows = []
    for label, stem in FINETUNE.items():
        records = ctx.results.jsonl(f"smollm2-finetune/{stem}.jsonl")
        train = [r for r in records if "loss" in r]
        evals = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
        rows.append([label, f"{train[0]['loss']:.3f}", f"{max(r['loss'] for r in train[:20]):.3f}",
                     f"{sum(r['loss'] for r in train[-50:]) / len(train[-50:]):.3f}",
                     " / ".join(f"{v:.3f}" for _, v in evals)])
    steps = " / ".join(str(s) for s, _ in evals)
    header = ["run", "loss at step 1", "max loss, steps 1-20", "mean loss, last 50 steps", f"held-out loss at {steps}"]
    return "\n\n".join([table(header, rows), "*Per-step metrics of `attnres finetune` in "
                        f"{ctx.source('smollm2-finetune/standard.jsonl')} and beside it, by the commands in "
                        f"{ctx.source('smollm2-finetune/summary.md')} (fp32, SmolLM2's own tokenizer, the demo "
                        "corpus); these files do not record the date, the CPU or the routing implementation.*"])
