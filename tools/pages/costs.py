"""What each variant costs, from `attnres bench` (results/bench-*/bench.json): training step, memory,
prefill and decoding against standard in the same run, and the routing implementations side by side."""

from __future__ import annotations

from tools.pages.seeds import table
from tools.pages.sources import provenance
from attnres.report.document import fmt

FP32, BF16 = "bench-fp32/bench.json", "bench-bf16/bench.json"
IMPLS = {"reference": "bench-fp32-reference/bench.json", "lean": "bench-fp32-lean/bench.json", "auto": FP32}
DEPTH = "bench-fp32-depth/bench.json"


def code_path(bench: dict) -> dict:
    """A bench run's precision and routing implementation (as asked, and as resolved on its machine)."""
    config = bench["config"]
    return {"precision": config["precision"], "routing_impl": config["routing_impl"],
            "routing": bench.get("resolved_routing_impl")}


def ratios(bench: dict) -> dict[str, dict]:
    """Variant -> its figures divided by standard's from the same run (bench.json's `ratios`)."""
    return {name: entry.get("ratios") or {} for name, entry in bench["models"]["variants"].items()}


def shape_words(bench: dict) -> str:
    m = bench["models"]
    return (f"{m['num_layers']} layers x {m['hidden_size']} wide, batch {m['batch_size']} x {m['seq_len']}, "
            f"{bench['config']['repeats']} interleaved rounds")


def x(value) -> str:
    return fmt(value, ".2f", "x")


def bench_costs(ctx) -> str:
    """Every variant's cost as multiples of standard's: fp32 and bf16 training step and memory, prefill,
    eager and compiled decoding."""
    fp32, bf16 = ctx.results.json(FP32), ctx.results.json(BF16)
    r32, r16 = ratios(fp32), ratios(bf16)
    rows = []
    for name, r in r32.items():
        b = r16.get(name, {})
        rows.append([name, x(r.get("train_step")), x(b.get("train_step")), x(r.get("peak_memory")),
                     x(b.get("peak_memory")), x(r.get("activation_memory")), x(r.get("prefill")),
                     x(r.get("decode_per_token")), x(r.get("decode_compiled_per_token"))])
    base32, base16 = fp32["models"]["variants"]["standard"], bf16["models"]["variants"]["standard"]
    header = ["variant", "train step, fp32", "train step, bf16", "peak memory, fp32", "peak memory, bf16",
              "activations, fp32", "prefill, fp32", "decode per token, eager", "decode per token, compiled"]
    lines = [table(header, rows),
             f"*Multiples of `standard` in the same run ({shape_words(fp32)}); standard's training step took "
             f"{base32['train_step_s']['median_s'] * 1e3:.0f} ms in fp32 and {base16['train_step_s']['median_s'] * 1e3:.0f} ms "
             f"in bf16. Decoding is fp32.*",
             provenance(fp32, ctx.source(FP32), code_path=code_path(fp32)),
             provenance(bf16, ctx.source(BF16), code_path=code_path(bf16))]
    return "\n\n".join(lines)


def routing_impls(ctx) -> str:
    """The routed variants' training step and memory under each routing implementation."""
    runs = {impl: ctx.results.json(path) for impl, path in IMPLS.items()}
    rows = []
    for name in (n for n in ratios(runs["reference"]) if n != "standard"):
        cells = []
        for impl, bench in runs.items():
            r = ratios(bench).get(name, {})
            cells += [x(r.get("train_step")), x(r.get("activation_memory"))]
        rows.append([name, *cells])
    header = ["variant"] + [f"{what}, {impl if impl != 'auto' else 'auto (' + str(runs[impl].get('resolved_routing_impl')) + ')'}"
                            for impl in runs for what in ("train step", "activations")]
    lines = [table(header, rows), f"*Multiples of `standard` in the same run ({shape_words(runs['lean'])}), fp32.*"]
    lines += [provenance(bench, ctx.source(IMPLS[impl]), code_path=code_path(bench)) for impl, bench in runs.items()]
    return "\n\n".join(lines)


def depth_sweep(ctx) -> str:
    """Training step and activations against standard at each depth of the depth sweep."""
    bench = ctx.results.json(DEPTH)
    sweep = bench["depth_sweep"]
    names = [n for n in sweep[0]["variants"] if n != "standard"]
    rows = [[name] + [f"{x(e['variants'][name]['ratios']['train_step'])} / "
                      f"{x(e['variants'][name]['ratios']['activation_memory'])}" for e in sweep] for name in names]
    header = ["variant"] + [f"{e['num_layers']} layers: step / activations" for e in sweep]
    config = bench["config"]
    return "\n\n".join([table(header, rows),
                        f"*{config['sweep_hidden']} wide, sequences of {config['sweep_seq_len']}, multiples of standard "
                        f"at the same depth.*", provenance(bench, ctx.source(DEPTH), code_path=code_path(bench))])


WIDTHS = (BF16, "bench-bf16-d512/bench.json", "bench-bf16-d1024/bench.json")
PROFILE = "step-profile/bf16.json"
KERNELS = ("route forward", "route backward", "merge forward", "merge backward", "collect")


def width_costs(ctx) -> str:
    """The AttnRes variants' bf16 training step against standard's at each width of the same depth."""
    runs = [ctx.results.json(path) for path in WIDTHS]
    names = list(dict.fromkeys(n for bench in runs[1:] for n in ratios(bench) if n != "standard"))
    rows = [[name] + [x(ratios(bench).get(name, {}).get("train_step")) for bench in runs] for name in names]
    rows.append(["standard's step"] + [f"{b['models']['variants']['standard']['train_step_s']['median_s'] * 1e3:.0f} ms"
                                       for b in runs])
    m = runs[-1]["models"]
    header = ["variant"] + [f"{b['models']['hidden_size']} wide" for b in runs]
    lines = [table(header, rows),
             f"*bf16 training step as a multiple of `standard`'s in the same run: {m['num_layers']} layers, batch "
             f"{m['batch_size']} x {m['seq_len']}, {runs[-1]['config']['repeats']} interleaved rounds.*"]
    lines += [provenance(bench, ctx.source(path), code_path=code_path(bench)) for bench, path in zip(runs, WIDTHS)]
    return "\n\n".join(lines)


def step_profile(ctx) -> str:
    """Per routed variant, a profiled bf16 step's time beyond standard's: the routing kernels by kind and the rest."""
    prof = ctx.results.json(PROFILE)
    rows = []
    for name, row in prof["variants"].items():
        kernels = row["routing_kernels_ms"]
        rows.append([name, x(row["x_standard"]), f"+{row['extra_ms']:.0f}"]
                    + [f"{kernels[k]:.1f}" if k in kernels else "-" for k in KERNELS] + [f"{row['rest_ms']:+.0f}"])
    shape = prof["shape"]
    header = ["variant", "step", "beyond standard, ms"] + [f"{k}, ms" for k in KERNELS] + ["the rest, ms"]
    return "\n\n".join([table(header, rows),
                        f"*Profiled self time per step ({shape['num_layers']} layers x {shape['hidden_size']} wide, batch "
                        f"{shape['batch_size']} x {shape['seq_len']}, mean of {prof['repeats']} interleaved rounds); "
                        f"standard's took {prof['standard_step_ms']:.0f} ms.*",
                        provenance(prof, ctx.source(PROFILE))])


ALLOCATORS = ("allocator-libc/bench.json", "allocator-tcmalloc/bench.json", "allocator-jemalloc/bench.json")


def _per_round(bench: dict, name: str) -> str:
    """A variant's training-step multiple, median and per-round range: '1.12x (1.07-1.19)'."""
    variants = bench["models"]["variants"]
    pairs = zip(variants[name]["train_step_s"]["samples_s"], variants["standard"]["train_step_s"]["samples_s"])
    per_round = [mine / base for mine, base in pairs]
    return f"{x(ratios(bench)[name].get('train_step'))} ({min(per_round):.2f}-{max(per_round):.2f})"


def allocator_costs(ctx) -> str:
    """Standard's bf16 training step under each C allocator, and the routed variants' multiples of it,
    each run on its own with its variants interleaved."""
    runs = [ctx.results.json(path) for path in ALLOCATORS]
    names = [name for name in ratios(runs[0]) if name != "standard"]
    rows = [[bench["machine"].get("cpu_allocator") or "not recorded",
             f"{bench['models']['variants']['standard']['train_step_s']['median_s'] * 1e3:.0f} ms"]
            + [_per_round(bench, name) for name in names] for bench in runs]
    header = ["allocator", "standard's step"] + [f"{name} (per round)" for name in names]
    lines = [table(header, rows),
             f"*bf16 training step, one run per allocator ({shape_words(runs[0])}); multiples of standard's "
             f"step in the same run, median and range over rounds.*"]
    lines += [provenance(bench, ctx.source(path), code_path=code_path(bench)) for bench, path in zip(runs, ALLOCATORS)]
    return "\n\n".join(lines)
