"""Peak memory of `attnres convert` on a synthetic multi-shard checkpoint: streamed against in memory.

Writes a Qwen3-shaped checkpoint of random fp32 weights in safetensors shards of about --shard-mb MB
(about --shards of them, with model.safetensors.index.json as transformers writes it), then, in one
fresh child process, converts it twice: streamed (`attnres.hf.streaming.stream_to_hf`, what `attnres
convert` runs) and in memory (`attnres.hf.export.convert_to_hf`, the reference). The child first
converts a tiny checkpoint both ways, so imports and first-call allocations are in its baseline; then
for each conversion it reports its peak resident set (VmHWM, what ru_maxrss reads) above its resident
set just before. Linux lets a process reset that peak (/proc/self/clear_refs), so each conversion is
measured on its own; where it cannot, the peaks are high-water marks in order (streamed first), which
can only overstate the streamed one.

    .venv/bin/python tools/benchmarks/streaming_convert.py                       # 8 shards of 50 MB
    .venv/bin/python tools/benchmarks/streaming_convert.py --out results/streaming-convert   # + results.json
    .venv/bin/python tools/benchmarks/streaming_convert.py --shards 8 --shard-mb 8 --json

tests/hf/test_streaming_convert.py runs `measure` on a small checkpoint and checks the bound.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file

from attnres.common.atomic import write_atomic
from attnres.common.machine import machine_info
from attnres.report.document import dumps_json, jsonable

MB = 10**6
HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 1024, 2816, 16, 8, 64, 8192

# The child: warm up on the tiny checkpoint, then measure each conversion of the large one.
CHILD = r"""
import gc, json, re, resource, sys, time
import torch
torch.set_num_threads(1)
from attnres.hf.export import convert_to_hf
from attnres.hf.streaming import stream_to_hf

tiny, source, out = sys.argv[1:4]

def status(key):
    return int(re.search(key + r":\s+(\d+) kB", open("/proc/self/status").read())[1]) * 1024

def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # VmHWM := VmRSS
        return True
    except OSError:
        return False

def run(mode, src, dst):
    if mode == "streamed":
        stream_to_hf(src, dst)
    else:
        convert_to_hf(src, dst)  # returns the model: dropped here

for mode in ("streamed", "in_memory"):
    run(mode, tiny, f"{out}/warm-{mode}")
results = {}
for mode in ("streamed", "in_memory"):
    gc.collect()
    reset = reset_peak()
    before = status("VmRSS")
    begin = time.perf_counter()
    run(mode, source, f"{out}/{mode}")
    results[mode] = {"increase_bytes": status("VmHWM") - before, "seconds": time.perf_counter() - begin,
                     "peak_reset": reset, "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
print(json.dumps(results))
"""


def write_checkpoint(directory: Path, shards: int, shard_mb: float, layers: int | None = None,
                     hidden: int = HIDDEN, intermediate: int = INTERMEDIATE, vocab: int = VOCAB) -> dict:
    """A Qwen3 checkpoint of random fp32 weights in `directory`, split as save_pretrained splits it at
    max_shard_size = shard_mb MB, with as many layers as fit in `shards` shards (or `layers`). Returns
    {"shards", "total_bytes", "largest_shard_bytes", "layers"}. One shard is in memory at a time."""
    heads = max(1, hidden // HEAD_DIM)
    limit = shard_mb * MB

    def shard_count(count: int) -> int:
        return len(_split(_shapes(_qwen3(count, hidden, intermediate, vocab, heads)), limit))

    if layers is None:  # the most layers that fit in `shards` shards, from an estimate by size
        layer_bytes = 4 * (hidden * HEAD_DIM * (heads + max(1, heads // 2)) * 2 + 3 * hidden * intermediate)
        layers = max(1, round((shards * limit - 2 * 4 * vocab * hidden) / layer_bytes))
        while layers > 1 and shard_count(layers) > shards:
            layers -= 1
        while shard_count(layers + 1) <= shards:
            layers += 1
    config = _qwen3(layers, hidden, intermediate, vocab, heads)
    shapes = _shapes(config)
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    generator = torch.Generator().manual_seed(0)
    groups = _split(shapes, limit)
    weight_map, sizes = {}, []
    for i, group in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {name: (torch.randn(shapes[name], generator=generator) * (1.0 if "norm" in name else 0.05))
                   for name in group}
        save_file(tensors, directory / file, metadata={"format": "pt"})
        sizes.append((directory / file).stat().st_size)
        weight_map.update(dict.fromkeys(group, file))
        del tensors
    total = sum(4 * torch.Size(s).numel() for s in shapes.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return {"shards": len(groups), "total_bytes": sum(sizes), "largest_shard_bytes": max(sizes),
            "layers": config.num_hidden_layers}


def _qwen3(layers: int, hidden: int, intermediate: int, vocab: int, heads: int):
    return transformers.Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                                    num_hidden_layers=layers, num_attention_heads=heads,
                                    num_key_value_heads=max(1, heads // 2), head_dim=HEAD_DIM,
                                    max_position_embeddings=128, tie_word_embeddings=False)


def _shapes(config) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        return {name: tuple(t.shape) for name, t in transformers.Qwen3ForCausalLM(config).state_dict().items()}


def _split(shapes: dict, limit: float) -> list[list[str]]:
    """save_pretrained's split: in order, a new shard when the next tensor would pass `limit`."""
    groups, current, size = [], [], 0
    for name, shape in shapes.items():
        nbytes = 4 * torch.Size(shape).numel()
        if current and size + nbytes > limit:
            groups.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
    return groups + [current]


def measure(root: Path, shards: int, shard_mb: float, **shape) -> dict:
    """Write the checkpoint under `root` and measure both conversions in one child process (module doc):
    the checkpoint's figures and, per conversion, its peak increase in bytes and its seconds."""
    source = root / "source"
    figures = write_checkpoint(source, shards, shard_mb, **shape)
    write_checkpoint(root / "tiny", 1, 1, layers=1, hidden=64, intermediate=128, vocab=256)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(root / "tiny"), str(source), str(root / "out")],
                          capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the measuring child failed:\n{done.stderr[-4000:]}")
    return {**figures, **json.loads(done.stdout.strip().splitlines()[-1])}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8, help="about how many source shards (default: 8)")
    parser.add_argument("--shard-mb", type=float, default=50, help="source shard size in MB (default: 50)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--out", help="also write OUT/results.json (the figures, the command, the machine)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        result = measure(Path(root), args.shards, args.shard_mb)
    if args.out:
        command = shlex.join([os.path.relpath(sys.executable), os.path.relpath(__file__),
                              *(sys.argv[1:] if argv is None else argv)])
        document = {"command": command, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "machine": machine_info(torch.device("cpu")),
                    "code_path": {"precision": "fp32", "routing_impl": "none"},
                    "settings": {"shards": args.shards, "shard_mb": args.shard_mb, "hidden_size": HIDDEN,
                                 "dtype": "fp32", "threads": 1},
                    "units": "bytes; increase_bytes: the peak resident set above the one just before the conversion",
                    **result}
        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_atomic(Path(args.out) / "results.json", dumps_json(jsonable(document)) + "\n")
    if args.json:
        print(json.dumps(result))
        return
    print(f"source: {result['shards']} shards, {result['total_bytes'] / MB:.1f} MB in all, largest shard "
          f"{result['largest_shard_bytes'] / MB:.1f} MB (Qwen3 shape, {result['layers']} layers x {HIDDEN}, fp32)")
    for mode, label in (("streamed", "streamed (attnres convert)"), ("in_memory", "in memory (convert_to_hf)")):
        row = result[mode]
        print(f"{label:>28}: peak +{row['increase_bytes'] / MB:.1f} MB over its baseline, {row['seconds']:.1f} s")
    if not result["streamed"]["peak_reset"]:
        print("(the peak could not be reset between conversions: both are high-water marks since the warm-up)")


if __name__ == "__main__":
    main()
