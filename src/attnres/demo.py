"""The demo: train a tiny model of every variant on generated sequences and compare them.

A stand-in for the comparison report on real text (a later issue). The data is synthetic: each
sequence is a walk on a fixed sparse Markov chain whose second half repeats its first half, so a
model gains from both local statistics and copying. Same data order, seed and steps for every
variant.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from attnres.analysis import summarize_sharpness
from attnres.model import AttnResLM, ModelConfig

DEMO_VARIANTS = (
    ("standard", None),
    ("full_attnres", None),
    ("block_attnres", 4),
    ("delta_attnres", None),
    ("delta_block", 4),
)


@dataclass(frozen=True)
class DemoSettings:
    """Sizes of the demo run; the defaults finish in well under a minute on 2 CPU cores."""

    steps: int = 40
    num_layers: int = 8
    hidden_size: int = 64
    vocab_size: int = 128
    seq_len: int = 64
    batch_size: int = 16
    lr: float = 3e-3
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "num_layers", "hidden_size", "vocab_size", "seq_len", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"DemoSettings.{name} must be a positive integer, got {value!r}")
        if self.seq_len < 4:
            raise ValueError(f"DemoSettings.seq_len must be at least 4, got {self.seq_len}")
        if self.hidden_size % 16:
            raise ValueError(f"DemoSettings.hidden_size must be a multiple of 16 (4 heads of even size), "
                             f"got {self.hidden_size}")
        if not self.lr > 0:
            raise ValueError(f"DemoSettings.lr must be positive, got {self.lr}")


def markov_copy_batch(generator: torch.Generator, successors: torch.Tensor, batch_size: int,
                      seq_len: int) -> torch.Tensor:
    """(batch_size, seq_len) token ids: a Markov walk over `successors` (V, k), second half a copy."""
    vocab, k = successors.shape
    half = (seq_len + 1) // 2
    walk = torch.empty(batch_size, half, dtype=torch.long)
    walk[:, 0] = torch.randint(0, vocab, (batch_size,), generator=generator)
    for t in range(1, half):
        choice = torch.randint(0, k, (batch_size,), generator=generator)
        walk[:, t] = successors[walk[:, t - 1], choice]
    return torch.cat([walk, walk], dim=1)[:, :seq_len]


def run_demo(settings: DemoSettings, log=print) -> list[dict]:
    """Train each of DEMO_VARIANTS; returns one row of results per variant."""
    data_gen = torch.Generator().manual_seed(settings.seed)
    successors = torch.randint(0, settings.vocab_size, (settings.vocab_size, 4), generator=data_gen)
    batches = [markov_copy_batch(data_gen, successors, settings.batch_size, settings.seq_len)
               for _ in range(settings.steps)]
    held_out = markov_copy_batch(data_gen, successors, settings.batch_size, settings.seq_len)
    rows = []
    for residual, num_blocks in DEMO_VARIANTS:
        torch.manual_seed(settings.seed)
        config = ModelConfig(vocab_size=settings.vocab_size, hidden_size=settings.hidden_size,
                             num_layers=settings.num_layers, num_heads=4, num_kv_heads=2,
                             intermediate_size=4 * settings.hidden_size, residual=residual,
                             num_blocks=num_blocks, max_seq_len=settings.seq_len)
        model = AttnResLM(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
        start, first_loss, loss = time.perf_counter(), None, None
        for batch in batches:
            loss = model(batch, labels=batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            first_loss = float(loss.detach()) if first_loss is None else first_loss
        elapsed = time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            out = model(held_out, labels=held_out, return_routing=True)
        sharpness = summarize_sharpness(out.routing or [])
        row = {"residual": residual, "num_blocks": num_blocks, "params": sum(p.numel() for p in model.parameters()),
               "first_loss": first_loss, "final_loss": float(loss.detach()), "held_out_loss": float(out.loss),
               "sec_per_step": elapsed / settings.steps, **sharpness}
        log(f"  {residual:<14} held-out loss {row['held_out_loss']:.3f}  ({elapsed:.1f} s)")
        rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    """Markdown table of `run_demo` rows."""
    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    lines = ["| variant | params | loss, step 1 | loss, last step | held-out loss | max weight (mean) "
             "| max weight (deepest third) | s/step |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        name = r["residual"] + (f" (N={r['num_blocks']})" if r["num_blocks"] else "")
        lines.append(f"| {name} | {r['params']:,} | {r['first_loss']:.3f} | {r['final_loss']:.3f} | "
                     f"{r['held_out_loss']:.3f} | {num(r['max_weight'], '.3f')} | "
                     f"{num(r['max_weight_deep'], '.3f')} | {r['sec_per_step']:.3f} |")
    return "\n".join(lines)
