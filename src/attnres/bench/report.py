"""The benchmark report: bench.json (every figure) and bench.md (markdown tables)."""

from __future__ import annotations

import json
from pathlib import Path

from attnres.bench.bench_config import BASELINE
from attnres.common.atomic import write_atomic
from attnres.common.machine import cpu_facts


def write_report(results: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """Write out_dir/bench.json and out_dir/bench.md from run_bench's results; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "bench.json", out / "bench.md"
    write_atomic(json_path, json.dumps(results, indent=2) + "\n")
    write_atomic(md_path, format_markdown(results))
    return json_path, md_path


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}" if ms >= 0.1 else f"{ms:.4f}"


def _mib(nbytes: float | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:.1f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def format_markdown(results: dict) -> str:
    """The report as markdown: run details, per-variant tables, depth sweep, router."""
    config, machine = results["config"], results["machine"]
    lines = ["# attnres bench", "",
             f"Command: `{results['command']}`", "",
             f"Machine: torch {machine['torch']}, device {machine['device']} ({machine['device_name']}), "
             f"{machine['threads']} torch threads, {machine['cpu_count']} CPUs, Python {machine['python']}, "
             f"{machine['platform']}{''.join(f', {fact}' for fact in cpu_facts(machine))}.", "",
             "Settings: " + ("Kimi Linear (experts, latent and delta attention; attnres.bench.model_bench.model_shape), "
                             if config.get("architecture") == "kimi_linear" else "")
             + f"{config['precision']} precision, routing_impl={config['routing_impl']} "
             f"({results.get('resolved_routing_impl')}), "
             f"median of {config['repeats']} interleaved repeats after {config['warmup']} warm-up "
             f"round(s), seed {config['seed']}" + (", --quick" if config.get("quick") else "") + ".", ""]
    for note in results.get("notes", []):
        lines += [f"> {note}", ""]
    lines += _model_section(results.get("models"), _bandwidth_limit(machine))
    lines += _sweep_section(results.get("depth_sweep"))
    lines += _router_section(results.get("router"))
    lines += ["## How this is measured", "",
              "Each round runs every variant once in turn (standard first), so drifting machine load hits all "
              "alike; warm-up rounds are dropped and each figure is the median over rounds, divided by "
              "standard's median from the same run. Training step: forward with loss, backward, AdamW step. "
              "Prefill: forward of the whole prompt into a fresh KV cache, no grad. Decode: one token at a time "
              "with the cache after the prompt, the per-token mean of each round; compiled decode (where "
              "measured): the same with the static cache and the compiled step, after an untimed prefill. "
              "Memory: one training step; activations are the storages saved for backward; on CPU the peak is "
              "an estimate (parameters + gradients + two AdamW moments + activations), on CUDA the allocator's "
              "peak for this model. "
              "Router: bytes moved = sources read + output written (forward; forward+backward also reads the "
              "sources and output gradient again and writes the source gradients), against `dst.copy_(src)` "
              "of all sources' size (2 x its bytes), timed interleaved in the same run.", ""]
    return "\n".join(lines)


def _bandwidth_limit(machine: dict) -> tuple[float, str] | None:
    """What decoding's memory traffic is compared with: the machine's read bandwidth (kept per machine,
    attnres.generation.memory_bandwidth), or in results of 0.2.0 and before the copy measured at the start."""
    if machine.get("read_bandwidth_gb_s"):
        gb_s = machine["read_bandwidth_gb_s"]
        return gb_s, f"this machine's {gb_s:.1f} GB/s read bandwidth (a sum over a buffer 8x its last-level cache)"
    if machine.get("copy_bandwidth_gb_s"):
        gb_s = machine["copy_bandwidth_gb_s"]
        return gb_s, f"a {gb_s:.1f} GB/s tensor copy measured at the start"
    return None


def _model_section(models: dict | None, limit: tuple[float, str] | None = None) -> list[str]:
    if not models:
        return []
    variants = models["variants"]
    head = (f"## Variants against standard ({models['num_layers']} layers x {models['hidden_size']} wide, "
            f"batch {models['batch_size']} x {models['seq_len']}, {models['decode_tokens']} decoded tokens)")
    time_rows, mem_rows, compiled_rows = [], [], []
    for name, row in variants.items():
        r = row["ratios"]
        time_rows.append([name, _ms(row["train_step_s"]["median_s"]), _x(r["train_step"]),
                          _ms(row["prefill_s"]["median_s"]), _x(r["prefill"]),
                          _ms(row["decode_per_token_s"]["median_s"]), _x(r["decode_per_token"])])
        if "decode_compiled_per_token_s" in row:
            compile_s = row.get("decode_compile_s")
            compiled_rows.append([name, _ms(row["decode_per_token_s"]["median_s"]), _x(r["decode_per_token"]),
                                  _ms(row["decode_compiled_per_token_s"]["median_s"]),
                                  _x(r.get("decode_compiled_per_token")), _x(row.get("compiled_decode_speedup")),
                                  "-" if compile_s is None else f"{compile_s:.0f}",
                                  _traffic(row.get("decode_compiled_gb_per_s"), limit and limit[0])])
        m = row["memory"]
        mem_rows.append([name, _mib(m["peak_bytes"]), _x(r["peak_memory"]), _mib(m["activation_bytes"]),
                         _x(r["activation_memory"]), _mib(m["non_activation_bytes"]), _x(r["non_activation_memory"]),
                         f"{row['parameters']:,}"])
    return ([head, "", "### Time", ""]
            + _table(["variant", "train step (ms)", "x standard", "prefill (ms)", "x standard",
                      "decode (ms/token)", "x standard"], time_rows)
            + _compiled_decode_table(compiled_rows, limit)
            + ["", "### Memory of one training step", ""]
            + _table(["variant", "peak (MiB)", "x standard", "activations (MiB)", "x standard",
                      "rest of peak (MiB)", "x standard", "parameters"], mem_rows) + [""])


def _traffic(gb_per_s: float | None, limit_gb_s: float | None) -> str:
    """'12.3 (45 %)': a step's memory traffic and its share of the bandwidth limit."""
    if gb_per_s is None:
        return "-"
    return f"{gb_per_s:.1f}" + (f" ({gb_per_s / limit_gb_s:.0%})" if limit_gb_s else "")


def _compiled_decode_table(rows: list[list[str]], limit: tuple[float, str] | None = None) -> list[str]:
    if not rows:
        return []
    limit = (f" Memory: the weights and KV cache one compiled step reads, per second, and its share of "
             f"{limit[1]}." if limit else "")
    return (["", "### Decode: eager and compiled", "",
             "Eager: AttnResLM.forward one token at a time with the growing KV cache. Compiled: the static KV "
             "cache and the decode step (routing and the greedy choice included) captured once by "
             "torch.compile(fullgraph=True) (docs/explanation/fast-paths.md); its compile time is measured once, untimed "
             "otherwise." + limit, ""]
            + _table(["variant", "eager (ms/token)", "x standard", "compiled (ms/token)", "x standard",
                      "compiled speed-up", "compile (s)", "memory (GB/s)"], rows))


def _sweep_section(sweep: list | None) -> list[str]:
    if not sweep:
        return []
    names = [n for n in sweep[0]["variants"] if n != BASELINE]
    rows = []
    for entry in sweep:
        v = entry["variants"]
        rows.append([str(entry["num_layers"]), _options_cell(entry), _ms(v[BASELINE]["train_step_s"]["median_s"])]
                    + [f"{_x(v[n]['ratios']['train_step'])} / {_x(v[n]['ratios']['peak_memory'])} / "
                       f"{_x(v[n]['ratios']['activation_memory'])}" for n in names])
    return (["## Depth sweep", "",
             "Each cell: training step / peak memory / activations, as multiples of standard at the same depth "
             "(with the options of the 'options' column).", ""]
            + _table(["layers", "options", "standard step (ms)", *names], rows) + [""])


def _options_cell(entry: dict) -> str:
    """The options the variants ran with at this depth, e.g. "block_attnres (N=4), delta_block (N=4)"
    ("-" without any; a file written before names were recorded gives its block count)."""
    if "num_blocks" in entry:
        return f"N={entry['num_blocks']}"
    named = [row["name"] for row in entry["variants"].values() if " " in row.get("name", "")]
    return ", ".join(named) or "-"


def _router_section(router: dict | None) -> list[str]:
    if not router:
        return []
    rows = [["copy (`dst.copy_(src)`)", _mib(router["copy"]["bytes"]), _ms(router["copy"]["time"]["median_s"]),
             f"{router['copy']['bytes_per_s'] / 1e9:.2f}", "1.00"]]
    for key, label in (("forward", "route forward"), ("forward_backward", "route forward + backward")):
        part = router[key]
        rows.append([label, _mib(part["bytes"]["total_bytes"]), _ms(part["time"]["median_s"]),
                     f"{part['bytes_per_s'] / 1e9:.2f}", f"{part['fraction_of_copy']:.2f}"])
    impl = f" (routing_impl {router['routing_impl']} -> {router['resolved_impl']})" if router["resolved_impl"] else ""
    return (["## Router micro-benchmark", "",
             f"`{router['function']}`{impl} over {router['n_sources']} sources of shape {tuple(router['shape'])}, "
             f"{router['dtype']}, on {router['device']}.", ""]
            + _table(["measurement", "bytes moved (MiB)", "median (ms)", "GB/s", "of copy bandwidth"], rows) + [""])
