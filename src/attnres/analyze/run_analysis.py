"""`attnres analyze`: depth statistics of saved checkpoints on their runs' held-out batches, and a report.

Each checkpoint (a `runs/X/checkpoints/step_N` directory, or a run directory, meaning its latest
checkpoint) is loaded the way `attnres eval` loads it (`attnres.train.evaluate`): its run config,
its run's data (from the data cache) tokenised by the tokenizer saved with the checkpoint, its
weights. With `data` (a `DataConfig.source`), held-out batches come from that source instead,
tokenised by the checkpoint's own tokenizer; that is how a converted model (`attnres convert` output,
a Hugging Face-format directory, step 0) is read, and how it is compared with its fine-tuned
checkpoints on the same documents. On the first `max_batches` fixed validation batches it measures:

- validation loss (the run's precision, as `attnres eval`),
- `collect_depth_stats`: mean routing weight per router and source, max weight, entropy, effective
  sources, hidden-state RMS by depth (fp32),
- `collect_source_cosines`: per router, the token-mean cosine matrix of its sources,
- `collect_grad_norms`: RMS of dLoss/d(sub-layer output) by depth,
- with `causal`, `collect_causal_routing`: each router's sources ablated in turn (by zero and by
  their token mean), the loss change against the routing mass, and their rank correlation.

`attnres.report.depth_analysis_report.write_analysis_report` turns the results into figures, summary.md,
index.html and analysis.json.
"""

from __future__ import annotations

import gc
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from attnres.analysis.causal import collect_causal_routing, summarize_causal_routing
from attnres.analysis.depth_stats import DepthStats, collect_depth_stats
from attnres.analysis.grad_norms import collect_grad_norms
from attnres.analysis.intervals import mean
from attnres.analysis.redundancy import collect_source_cosines
from attnres.analysis.sharpness import summarize_max_weights
from attnres.common.errors import InputError
from attnres.report.variant_names import variant_name
from attnres.report.depth_analysis_report import write_analysis_report
from attnres.data import DataConfig, eval_batches, prepare_data
from attnres.train import CheckpointError
from attnres.train.evaluate import (LoadedCheckpoint, checkpoint_data_config, held_out_batches, load_checkpoint,
                                    load_pretrained, resolve_checkpoint, validation_loss)

DEFAULT_MAX_BATCHES = 4


@dataclass
class CheckpointAnalysis:
    """The measurements of one checkpoint; `to_dict()` is JSON-safe (lists, numbers, strings, None).

    depth_stats: `DepthStats` as a dict. source_cosines: per router (model.routers order), the
    n_r x n_r cosine matrix of its sources, rows and columns in `depth_stats["source_names"][r]`
    order. grad_norms: 2L values, sub-layer 0 .. 2L-1. summary: `summarize_checkpoint`.
    causal: None, or {"clean_loss", "routers": [`RouterCausality.to_dict()`, ...], "summary":
    `summarize_causal_routing`} (the causal check, on the same batches).
    """

    label: str
    checkpoint: str
    step: int
    variant: str
    residual: str
    residual_options: dict
    num_layers: int
    hidden_size: int
    num_parameters: int
    num_batches: int
    num_tokens: int
    val_loss: float
    val_ppl: float
    val_tokens: int
    depth_stats: dict
    source_cosines: list[list[list[float]]]
    grad_norms: list[float]
    summary: dict = field(default_factory=dict)
    causal: dict | None = None

    def to_dict(self) -> dict:
        """Every field, as nested plain dicts and lists."""
        return asdict(self)


def summarize_checkpoint(stats: DepthStats, grad_norms: list[float]) -> dict:
    """Scalar summaries: max_weight and max_weight_deep (`summarize_max_weights`: all multi-source
    routers, and the deepest third of them), mean_entropy (nats), mean_normalized_entropy (entropy /
    ln n, 1 = uniform) and mean_effective_sources, each over the routers with two or more sources
    and an entropy (None when there are none, as for `standard` and DenseFormer's signed averages),
    and mean_grad_norm over sub-layers."""
    multi = [r for r, names in enumerate(stats.source_names) if len(names) >= 2]
    out = dict(summarize_max_weights(stats.max_weight))
    out["num_routers"] = len(stats.source_names)
    out["num_multi_source_routers"] = len(multi)
    # Routers without an entropy (NaN: weights of any sign, DenseFormer's averages) are left out.
    entropic = [r for r in multi if stats.entropy and math.isfinite(stats.entropy[r])]
    out["mean_entropy"] = mean([stats.entropy[r] for r in entropic]) if entropic else None
    out["mean_normalized_entropy"] = (mean([stats.entropy[r] / math.log(len(stats.source_names[r]))
                                            for r in entropic]) if entropic else None)
    out["mean_effective_sources"] = (mean([stats.effective_sources[r] for r in entropic])
                                     if entropic and stats.effective_sources else None)
    out["mean_grad_norm"] = mean(grad_norms)
    return out


def is_pretrained_dir(path: Path) -> bool:
    """A Hugging Face-format model directory (config.json, no training state.json, not a run)."""
    return (path.is_dir() and (path / "config.json").is_file() and not (path / "state.json").exists()
            and not (path / "checkpoints").is_dir())


def _load(path: Path, data: str | None, max_batches: int, device: str, seq_len: int | None,
          batch_size: int) -> tuple[LoadedCheckpoint, list]:
    """The loaded checkpoint and its held-out batches: its run's, or `data`'s (see the module docstring)."""
    if is_pretrained_dir(path):
        if data is None:
            raise CheckpointError(f"{path} is a Hugging Face-format directory (`attnres convert` output) with no "
                                  "training run to name its held-out data; give --data SOURCE (a text file or "
                                  "folder, 'hf:<dataset>', 'demo', ...), tokenised by its own tokenizer")
        loaded = load_pretrained(path, data, device, seq_len, batch_size)
        return loaded, held_out_batches(loaded, max_batches, device)
    loaded = load_checkpoint(resolve_checkpoint(path), device)
    if data is None:
        return loaded, held_out_batches(loaded, max_batches, device)
    tokenizer = checkpoint_data_config(loaded.checkpoint, loaded.run).tokenizer  # the one saved with it
    if tokenizer == "bpe":
        raise CheckpointError(f"--data tokenises with the checkpoint's own tokenizer, but {path} was trained "
                              "with its own BPE and saved no tokenizer.json; analyze it without --data (on its "
                              "run's held-out split)")
    prepared = prepare_data(DataConfig(source=data, tokenizer=tokenizer))
    seq_len = seq_len or min(loaded.model.config.max_seq_len, 256)
    return loaded, [b.to(device) for b in eval_batches(prepared.val_tokens, seq_len, batch_size, max_batches)]


def analyze_checkpoint(path: str | Path, label: str | None = None, max_batches: int = DEFAULT_MAX_BATCHES,
                       device: str = "cpu", causal: bool = False, causal_routers: list[int] | None = None,
                       data: str | None = None, seq_len: int | None = None, batch_size: int = 4
                       ) -> CheckpointAnalysis:
    """Load checkpoint `path` (a run directory's latest, or with `data` a converted model's directory)
    and measure it on `max_batches` held-out batches (with `data`: of `batch_size` x `seq_len`, default
    min(max_seq_len, 256)); with `causal`, also the causal check of `causal_routers` (default: all)."""
    loaded, batches = _load(Path(path), data, max_batches, device, seq_len, batch_size)
    model = loaded.model
    loss = validation_loss(loaded, batches)
    stats = collect_depth_stats(model, batches)
    cosines = [m.tolist() for m in collect_source_cosines(model, batches)]
    grads = collect_grad_norms(model, batches)
    causal_result = None
    if causal and model.routers:
        clean, routers = collect_causal_routing(model, batches, causal_routers)
        causal_result = {"clean_loss": clean, "routers": [r.to_dict() for r in routers],
                         "summary": summarize_causal_routing(routers)}
    config = model.config.to_dict()
    result = CheckpointAnalysis(
        label=label or f"{variant_name(config)} step {loaded.checkpoint.step}",
        checkpoint=str(loaded.checkpoint.path), step=loaded.checkpoint.step, variant=variant_name(config),
        residual=config["residual"], residual_options=config["residual_options"], num_layers=config["num_layers"],
        hidden_size=config["hidden_size"], num_parameters=sum(p.numel() for p in model.parameters()),
        num_batches=len(batches), num_tokens=stats.num_tokens, depth_stats=stats.to_dict(),
        source_cosines=cosines, grad_norms=grads, summary=summarize_checkpoint(stats, grads), causal=causal_result,
        **loss)
    del loaded, model, batches
    gc.collect()
    return result


def _unique_labels(results: list[CheckpointAnalysis]) -> None:
    """Default labels that collide (same variant and step) get the run directory's name, then a number."""
    labels = [r.label for r in results]
    for r in results:
        if labels.count(r.label) > 1:
            r.label = f"{r.label} [{Path(r.checkpoint).parent.parent.name}]"
    seen: dict[str, int] = {}
    for r in results:
        seen[r.label] = seen.get(r.label, 0) + 1
        if seen[r.label] > 1:
            r.label = f"{r.label} #{seen[r.label]}"


def analyze(checkpoints: list[str | Path], out_dir: str | Path, labels: list[str] | None = None,
            max_batches: int = DEFAULT_MAX_BATCHES, device: str = "cpu", command: str = "",
            log=print, causal: bool = False, causal_routers: list[int] | None = None, data: str | None = None,
            seq_len: int | None = None, batch_size: int = 4) -> dict:
    """Analyze every checkpoint and write the report into `out_dir`; returns the analysis.json content.

    labels: one display name per checkpoint (default: variant and step). causal: run the causal
    check of routing (one forward pass per batch, router, source and ablation kind) on
    `causal_routers` (default: all). data: held-out batches from this source for every checkpoint
    (required for converted models' directories; see `analyze_checkpoint`). Raises InputError for bad
    arguments (label count, duplicate labels, max_batches < 1) before anything is loaded, and
    CheckpointError for a missing or corrupt checkpoint.
    """
    if not checkpoints:
        raise InputError("analyze needs at least one checkpoint")
    if not isinstance(max_batches, int) or max_batches < 1:
        raise InputError(f"max_batches must be a positive integer, got {max_batches!r}")
    if labels is not None:
        if len(labels) != len(checkpoints):
            raise InputError(f"--labels gives {len(labels)} label(s) for {len(checkpoints)} checkpoint(s); "
                             "give one per checkpoint")
        if len(set(labels)) != len(labels):
            raise InputError(f"--labels must be distinct, got {labels}")
        if any(not str(label).strip() for label in labels):
            raise InputError("--labels must not be empty strings")
    results = []
    for i, path in enumerate(checkpoints):
        log(f"[{i + 1}/{len(checkpoints)}] analyzing {path} ...")
        results.append(analyze_checkpoint(path, labels[i] if labels else None, max_batches, device, causal,
                                          causal_routers, data, seq_len, batch_size))
        r = results[-1]
        deep = r.summary["max_weight_deep"]
        log(f"    {r.label}: val loss {r.val_loss:.4f} on {r.val_tokens} tokens, max weight (deepest third) "
            f"{'-' if deep is None else f'{deep:.3f}'}")
    if labels is None:
        _unique_labels(results)
    analysis = {"command": command, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "settings": {"max_batches": max_batches, "device": device, "causal": causal,
                             "causal_routers": causal_routers, "data": data,
                             "batch": None if data is None else {"batch_size": batch_size, "seq_len": seq_len}},
                "checkpoints": [r.to_dict() for r in results]}
    return write_analysis_report(analysis, Path(out_dir))

