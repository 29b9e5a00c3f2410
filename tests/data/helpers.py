"""Helpers shared by the data tests: deterministic English-like texts and JSON-lines files."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ("the river runs past an old mill where children learn to count stones and birds while "
         "their teachers write letters about weather markets songs bread iron glass winter light "
         "a quiet village keeps its records in a wooden box near the school door").split()


def make_texts(count: int, seed: int = 0, sentences: int = 6) -> list[str]:
    """`count` distinct paragraphs of English-like text, deterministic for `seed`."""
    rng = random.Random(seed)
    texts = []
    for index in range(count):
        parts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + "."
                 for _ in range(sentences)]
        texts.append(f"Note {index}. " + " ".join(parts))
    return texts


def write_jsonl(path: Path, records: list[dict]) -> Path:
    """Write `records` as JSON lines to `path` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path
