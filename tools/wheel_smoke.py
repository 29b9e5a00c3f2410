"""What a user of the installed wheel does first, run by tools/wheel_check.sh in a fresh virtual
environment from a folder outside the repository, with an empty extensions cache (so the fused CPU
kernel is not built there), once per install stage:

    python wheel_smoke.py core REPO EXPECTED_FILES   # the wheel alone, beside torch
    python wheel_smoke.py hf REPO                    # after pip install attnres[hf]
    python wheel_smoke.py train REPO                 # after pip install attnres[train]

core: attnres is imported from the environment, not from REPO; the installed package holds every
file listed in EXPECTED_FILES (paths under src/attnres: the modules, the bundled configs, the
kernel's C++ source); a small nanoGPT-style model with `attnres.build_residual` trains a few AdamW
steps on random tokens with two variants (the loss falls); AttnResLM runs forward and backward;
without the fused kernel, routing_impl "auto" routes with the lean ops and says so exactly once; the
`attnres` command answers --help, and a command whose extra is missing names it in one line.
hf: `attnres convert` turns a tiny random Qwen3 checkpoint into a Delta Block model with the gate,
which transformers loads, with the source's logits. train: the bundled presets load. Each check fails with a message.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import attnres
from attnres.routing import fused_cpu


def check(condition: bool, message: str) -> None:
    if not condition:
        raise SystemExit(f"wheel smoke: FAILED: {message}")


class Block(nn.Module):
    """nanoGPT's block without its two `x = x + ...` lines: the residual scheme owns the stream."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def attn(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class GPT(nn.Module):
    def __init__(self, residual: str, options: dict, vocab: int = 64, width: int = 32, layers: int = 4,
                 context: int = 16) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.h = nn.ModuleList(Block(width, 4) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)
        self.residual = attnres.build_residual(residual, options, num_layers=layers, hidden_size=width)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        state = self.residual.start(self.wte(idx) + self.wpe(torch.arange(idx.shape[1])))
        for i, block in enumerate(self.h):
            h = self.residual.sublayer_input(2 * i, state)
            self.residual.after(2 * i, state, block.attn(block.ln_1(h)))
            h = self.residual.sublayer_input(2 * i + 1, state)
            self.residual.after(2 * i + 1, state, block.mlp(block.ln_2(h)))
        logits = self.head(self.ln_f(self.residual.finish(state)))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def drop_in_losses(residual: str, options: dict, steps: int = 25) -> list[float]:
    torch.manual_seed(0)
    model = GPT(residual, options)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.randint(0, 64, (8, 17), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(steps):
        loss = model(data[:, :-1], data[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def attnres_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "attnres"), *args], capture_output=True, text=True)


def core(repo: Path, expected_files: Path) -> None:
    start = time.perf_counter()
    package = Path(attnres.__file__).resolve().parent
    check(repo.resolve() not in package.parents, f"attnres was imported from the repository ({package})")
    check(Path(sys.prefix).resolve() in package.parents, f"attnres is not in this environment ({package})")
    expected = expected_files.read_text().split()
    missing = [name for name in expected if not (package / name).is_file()]
    check(len(expected) > 50 and not missing, f"the wheel lacks {len(missing)} of {len(expected)} files: {missing[:8]}")
    check(not fused_cpu.fused_available(), "the fused CPU kernel is loaded; this check wants it absent")

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for residual, options in (("block_attnres", {"num_blocks": 2}), ("delta_attnres", {})):
            losses = drop_in_losses(residual, options)
            check(all(math.isfinite(v) for v in losses) and losses[-1] < losses[0] - 1.0,
                  f"{residual}: the drop-in model's loss did not fall: {losses[0]:.3f} -> {losses[-1]:.3f}")
            print(f"wheel smoke: drop-in {residual}: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(losses)} steps")
        config = attnres.ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                                     intermediate_size=64, residual="block_attnres", residual_options={"num_blocks": 2},
                                     max_seq_len=32)
        model = attnres.AttnResLM(config)
        ids = torch.randint(0, 64, (2, 12))
        out = model(ids, labels=ids)
        out.loss.backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        check(torch.isfinite(out.loss).item() and all(g is not None and torch.isfinite(g).all() for g in grads),
              "AttnResLM's forward/backward gave a non-finite loss or a missing gradient")
        print(f"wheel smoke: AttnResLM forward/backward: loss {out.loss.item():.3f}, {len(grads)} gradients")
    notes = [str(w.message) for w in record if "fused CPU routing kernel is not built" in str(w.message)]
    check(len(notes) == 1 and "python -m attnres.routing.fused_cpu_build" in notes[0],
          f"expected the fused kernel's note exactly once, got {notes}")
    print(f"wheel smoke: the one-time note: {notes[0]}")
    cli = attnres_command("--help")
    check(cli.returncode == 0 and "train" in cli.stdout, f"`attnres --help` failed: {cli.stderr[-500:]}")
    convert = attnres_command("convert", "SOURCE", "--out", "OUT")
    check(convert.returncode == 2 and "pip install 'attnres[hf]'" in convert.stderr
          and convert.stderr.count("\n") == 1, f"`attnres convert` without the hf extra: {convert.stderr[-500:]}")
    print(f"wheel smoke: without the hf extra: {convert.stderr.strip()}")
    print(f"wheel smoke: core passed in {time.perf_counter() - start:.0f} s (torch {torch.__version__}, "
          f"{len(expected)} package files)")


def hf(workdir: Path) -> None:
    """attnres convert on a tiny random Qwen3 checkpoint; transformers loads the result with its logits."""
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    import attnres.hf  # noqa: F401  (registers the attnres model with the Auto classes)

    start = time.perf_counter()
    torch.manual_seed(0)
    source = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                          max_position_embeddings=64)).eval()
    source.save_pretrained(workdir / "qwen3")
    # Delta Block with the gate: a routed variant that converts exactly (method §4)
    result = attnres_command("convert", str(workdir / "qwen3"), "--residual", "delta_block", "--option",
                             "num_blocks=2", "--option", "exact_conversion=gate", "--out", str(workdir / "converted"))
    check(result.returncode == 0, f"`attnres convert` failed: {result.stderr[-800:]}")
    converted = AutoModelForCausalLM.from_pretrained(workdir / "converted").eval()
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        gap = (converted(ids).logits - source(ids).logits).abs().max().item()
    check(gap < 1e-5, f"the converted model's logits differ from the source's by {gap:.2e}")
    print(f"wheel smoke: hf: converted a Qwen3 checkpoint to delta_block with the gate, logits within {gap:.1e} of the "
          f"source's, in {time.perf_counter() - start:.0f} s")


def train(repo: Path) -> None:
    from attnres.compare.presets import available_presets, load_preset

    presets = available_presets()
    check(len(presets) >= 3, f"bundled compare presets: {presets}")
    here = os.getcwd()
    os.chdir(repo)  # a study preset's rates_from names a results folder of the repository
    try:
        for name in presets:
            load_preset(name)  # the bundled YAML files parse into presets
    finally:
        os.chdir(here)
    print(f"wheel smoke: train: {len(presets)} bundled compare presets load")


if __name__ == "__main__":
    stage, arguments = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if stage == "core" and len(arguments) == 2:
        core(Path(arguments[0]), Path(arguments[1]))
    elif stage == "hf" and len(arguments) == 1:
        hf(Path(os.getcwd()))
    elif stage == "train" and len(arguments) == 1:
        train(Path(arguments[0]))
    else:
        raise SystemExit(__doc__)
