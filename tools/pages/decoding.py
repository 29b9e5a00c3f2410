"""Decoding speed of converted SmolLM2-135M (results/generate-speed: tools/benchmarks/generate_speed.py):
tokens/s of transformers and of attnres eager and compiled, compile times, the first answer of a
new user's `attnres generate`, and the memory bandwidth each reaches."""

from __future__ import annotations

from tools.pages.seeds import table
from tools.pages.sources import provenance

SPEED = "generate-speed/generate_speed.json"
LABELS = {"standard": "standard", "block_attnres": "Block AttnRes (N = 6)", "full_attnres": "Full AttnRes"}


def _bandwidth(row: dict, limit: float) -> str:
    return f"{row['gb_per_s']:.1f} ({row['gb_per_s'] / limit:.0%})"


def _limit(results: dict) -> tuple[float, str]:
    if "read_bandwidth_gb_s" in results:
        return results["read_bandwidth_gb_s"], "read"
    return results["copy_bandwidth_gb_s"], "copy"


def _limit_text(results: dict, limit: float) -> str:
    if "read_bandwidth_gb_s" in results:
        return (f"this machine's {limit:.1f} GB/s read bandwidth (a sum over "
                f"{results['read_buffer_bytes'] / 2 ** 20:.0f} MiB, measured in the same run; a copy moved "
                f"{results['copy_bandwidth_gb_s']:.1f} GB/s)")
    return f"a {limit:.1f} GB/s tensor copy measured in the same run"


def _emulated_note(results: dict) -> str:
    if results["machine"].get("cpu_native_bf16") is False:
        return ("This CPU has no native bf16, so the bf16 rows are emulated arithmetic and the fp32 rows "
                "are the binding ones.")
    return ""


def _rate(row: dict | None) -> str:
    return "-" if row is None else f"{row['tokens_per_s']:.1f}"


def decode_speed(ctx) -> str:
    """Two tables per variant and weight dtype: tokens/s of transformers and of attnres through
    transformers' loop, its static step eager and compiled; then the compile times, the first
    token's latency and the memory traffic against the machine's read bandwidth (a copy's, in results
    recorded before it was measured)."""
    results = ctx.results.json(SPEED)
    limit, limit_name = _limit(results)
    speed, costs = [], []
    for dtype, methods in results["decode"].items():
        base = methods["transformers"]
        for variant, label in LABELS.items():
            eager, compiled = methods.get(f"attnres {variant} eager"), methods.get(f"attnres {variant} compiled")
            if eager is None:
                continue
            times = results["compile"][f"{variant} {dtype}"]
            speed.append([label, dtype, _rate(base), _rate(methods.get(f"attnres {variant} dynamic")), _rate(eager),
                          _rate(compiled), f"{compiled['ratio_to_transformers']:.2f}x"])
            first = [row.get("first_token_s") for row in (base, eager)]
            costs.append([label, dtype, f"{times['cold_compile_s']:.0f} s / {times['warm_compile_s']:.1f} s",
                          "-" if None in first else f"{1e3 * first[0]:.0f} / {1e3 * first[1]:.0f} ms",
                          _bandwidth(eager, limit), _bandwidth(compiled, limit)])
    speed_header = ["variant", "weights", "transformers", "attnres, transformers' loop", "attnres, static step",
                    "attnres, compiled step", "compiled / transformers"]
    costs_header = ["variant", "weights", "compile cold / warm", "first token: transformers / attnres",
                    f"GB/s, static step (of {limit_name})", f"GB/s, compiled (of {limit_name})"]
    differ = sorted(f"{label} ({dtype})" for dtype, methods in results["decode"].items()
                    for label, row in methods.items() if not row["same_tokens_as_transformers"])
    tokens = (f"Greedy tokens differ from transformers' for {', '.join(differ)}." if differ else
              "Every attnres method gave transformers' greedy tokens.")
    note = (f"Decode tokens/s, greedy, {results['prompt_tokens']}-token prompt, {results['new_tokens']} new "
            f"tokens, median of {results['repeats']} interleaved rounds; transformers' loop grows a dynamic "
            f"cache. First token: prefill and the first choice, as the static step does it. Memory: weights "
            f"and KV cache read per step x tokens/s, against {_limit_text(results, limit)}. {tokens} {_emulated_note(results)}").strip()
    return "\n\n".join([table(speed_header, speed), table(costs_header, costs), note,
                         provenance(results, ctx.source(SPEED))])


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
    header = ["variant", "start to exit", "decode step"]
    return "\n\n".join([f"`{command}`, with an empty inductor cache and no recorded compile times:",
                         table(header, rows), provenance(results, ctx.source(SPEED))])
