"""Figures of the machinery rather than of a variant: the bytes pipeline stages send, with and without
the cross-stage cache (results/pipeline-bytes), how often the scaling fit's intervals hold the truth
in synthetic sweeps (results/fit-coverage), and the memory a streamed conversion takes
(results/streaming-convert)."""

from __future__ import annotations

from tools.pages.seeds import table
from tools.pages.sources import cpu_words, provenance

PIPELINE, COVERAGE = "pipeline-bytes/results.json", "fit-coverage/results.json"
STREAMING = "streaming-convert/results.json"


def _bytes_rows(rows: list[dict], unit: int) -> list[list[str]]:
    out = []
    for r in rows:
        off, on = r["uncached_forward"], r["cached_forward"]
        out.append([r["residual"], r["schedule"], f"{r['ranks']} x {r['stages_per_rank']}", f"{off / unit:,.2f}",
                    f"{on / unit:,.2f}", f"{off / on:.2f}x",
                    f"{r['uncached_peak'] / unit:,.2f} -> {r['cached_peak'] / unit:,.2f}"])
    return out


def pipeline_bytes(ctx) -> str:
    """Bytes sent forward per training step (backward sends as many), measured on a small model and
    predicted by the layout for a paper-scale one."""
    results = ctx.results.json(PIPELINE)
    header = lambda unit: ["residual", "schedule", "ranks x stages each", f"no cache ({unit})",  # noqa: E731
                           f"with cache ({unit})", "saved", f"largest transition per micro-batch ({unit})"]
    predicted = results["settings"]["predicted"]
    model = predicted["model"]
    return "\n\n".join([
        "Measured (one step of a small model on CPU processes joined by gloo, fp32; each figure checked "
        "against the layout's prediction):", table(header("KiB"), _bytes_rows(results["measured"], 1024)),
        f"Predicted by the layout alone for a {model['num_layers']}-layer, {model['hidden_size']}-wide model on "
        f"{predicted['ranks']} ranks, bf16:", table(header("MiB"), _bytes_rows(results["predicted"], 2 ** 20)),
        provenance(results, ctx.source(PIPELINE), what="Counted")])


QUANTITIES = {"alpha": "alpha", "E": "E", "loss at the largest compute": "loss at C_max",
              "compute advantage at the largest compute": "compute advantage at C_max"}


def fit_coverage(ctx) -> str:
    """The share of synthetic sweeps whose nominal 95 % interval holds each true quantity."""
    results = ctx.results.json(COVERAGE)
    rows = []
    for entry in results["configurations"]:
        cells = [f"{entry['coverage'][key]:.0%}" if key in entry["coverage"] else "-" for key in QUANTITIES]
        rows.append([entry["method"], f"{entry['sizes']} x {entry['seeds']}", str(entry["draws"]), *cells,
                     f"{entry['binomial_standard_error']:.1%}"])
    header = ["bootstrap", "sizes x seeds", "sweeps", *QUANTITIES.values(), "standard error of a true 95 %"]
    return "\n\n".join([table(header, rows), provenance(results, ctx.source(COVERAGE), what="Computed")])


def streaming_convert(ctx) -> str:
    """The peak memory of `attnres convert` streaming a sharded safetensors checkpoint, against the
    largest source shard and against converting it in memory."""
    results = ctx.results.json(STREAMING)
    mb = lambda n: f"{n / 10**6:.1f} MB"  # noqa: E731
    streamed, in_memory = results["streamed"]["increase_bytes"], results["in_memory"]["increase_bytes"]
    return (f"A Qwen3-shaped fp32 checkpoint of {results['shards']} shards, {mb(results['total_bytes'])} in all, "
            f"the largest {mb(results['largest_shard_bytes'])}, raised the converting process's peak resident "
            f"memory by {mb(streamed)} streamed ({mb(streamed - results['largest_shard_bytes'])} over the largest "
            f"shard) and by {mb(in_memory)} in memory. " + provenance(results, ctx.source(STREAMING)))


TIMINGS = "timings/timings.json"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} minutes"


def durations(ctx) -> str:
    """How long the README's commands take on a fresh clone (tools/studies/timings.sh): the first set-up, the
    tests and the main job, as far as the result file has them."""
    result = ctx.results.json(TIMINGS)
    machine = result.get("machine") or {}
    parts = [f"the first set-up took {_minutes(result['setup_s'])}" if "setup_s" in result else None,
             f"`tools/test.sh` {_minutes(result['tests_s'])}",
             f"`tools/compare.sh` {_minutes(result['main_job_s'])}" if "main_job_s" in result else None]
    parts = [p for p in parts if p]
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"On {cpu_words(machine)}, otherwise idle, {listed} (how, and the tests' count: {ctx.source(TIMINGS)})."
