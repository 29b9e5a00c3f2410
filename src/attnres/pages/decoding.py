"""Decoding speed of converted SmolLM2-135M (results/generate-speed: benchmarks/generate_speed.py):
tokens/s of transformers and of attnres eager and compiled, compile times, the first answer of a
new user's `attnres generate`, and the memory bandwidth each reaches."""

from __future__ import annotations

from attnres.pages.seeds import table
from attnres.pages.sources import provenance

SPEED = "generate-speed/generate_speed.json"
LABELS = {"standard": "standard", "block_attnres": "Block AttnRes (N = 6)", "full_attnres": "Full AttnRes"}


def _bandwidth(row: dict, limit: float) -> str:
    return f"{row['gb_per_s']:.1f} ({row['gb_per_s'] / limit:.0%})"


def _emulated_note(results: dict) -> str:
    if results["machine"].get("cpu_native_bf16") is False:
        return ("This CPU has no native bf16, so the bf16 rows are emulated arithmetic and the fp32 rows "
                "are the binding ones.")
    return ""


def decode_speed(ctx) -> str:
    """Per variant and weight dtype: tokens/s of transformers, attnres eager and compiled, the compile
    times, and the memory traffic of the compiled step against the measured copy bandwidth."""
    results = ctx.results.json(SPEED)
    limit = results["copy_bandwidth_gb_s"]
    rows = []
    for dtype, methods in results["decode"].items():
        base = methods["transformers"]
        for variant, label in LABELS.items():
            eager, compiled = methods.get(f"attnres {variant} eager"), methods.get(f"attnres {variant} compiled")
            if eager is None:
                continue
            times = results["compile"][f"{variant} {dtype}"]
            rows.append([label, dtype, f"{base['tokens_per_s']:.1f}", f"{eager['tokens_per_s']:.1f}",
                         f"{compiled['tokens_per_s']:.1f}", f"{compiled['ratio_to_transformers']:.2f}x",
                         f"{times['cold_compile_s']:.0f} s / {times['warm_compile_s']:.1f} s",
                         _bandwidth(eager, limit), _bandwidth(compiled, limit)])
    header = ["variant", "weights", "transformers tokens/s", "attnres eager", "attnres compiled",
              "compiled / transformers", "compile cold / warm", "eager GB/s (of copy)", "compiled GB/s (of copy)"]
    differ = sorted(f"{label} ({dtype})" for dtype, methods in results["decode"].items()
                    for label, row in methods.items() if not row["same_tokens_as_transformers"])
    tokens = (f"Greedy tokens differ from transformers' for {', '.join(differ)}." if differ else
              "Every attnres method gave transformers' greedy tokens.")
    note = (f"Greedy, {results['prompt_tokens']}-token prompt, {results['new_tokens']} new tokens, median of "
            f"{results['repeats']} interleaved rounds; transformers runs its own loop with its dynamic cache. "
            f"Memory: weights and KV cache read per step x tokens/s, against a {limit:.1f} GB/s tensor copy "
            f"measured in the same run. {tokens} {_emulated_note(results)}").strip()
    return "\n\n".join([table(header, rows), note, provenance(results, ctx.source(SPEED))])


def first_answer(ctx) -> str:
    """How long a new user's first `attnres generate` of 32 tokens takes, cold, and what it decided."""
    results = ctx.results.json(SPEED)
    rows = []
    for variant, label in LABELS.items():
        entry = results["first_answer"].get(variant)
        if entry is not None:
            decided = "compiled" if entry["compiled"] else "eager (the compile would not pay)"
            rows.append([label, f"{entry['wall_s']:.1f} s", decided])
    command = next(iter(results["first_answer"].values()))["command"]
    header = ["variant", f"`{command}`, from start to exit, empty caches", "decode step"]
    return "\n\n".join([table(header, rows), provenance(results, ctx.source(SPEED))])
