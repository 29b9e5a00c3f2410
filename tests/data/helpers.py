"""Helpers shared by the data tests: deterministic English-like texts, JSON-lines files and tiktoken BPE files."""

from __future__ import annotations

import base64
import json
import random
import re
from pathlib import Path

from attnres.data.tiktoken_files import KIMI_PATTERN, KIMI_PATTERN_PARTS, SPECIAL_SLOTS, TIKTOKEN_FILE

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


def train_tiktoken_ranks(texts: list[str], merges: int, seed: int = 0) -> dict[bytes, int]:
    """A valid tiktoken BPE ({token bytes: rank}) learnt from `texts`: the 256 single bytes in a shuffled
    order (real files do not rank them by byte value), then up to `merges` merges, each the most
    frequent adjacent pair within words, ranked in the order learnt (so a token's parts rank lower)."""
    rng = random.Random(seed)
    order = list(range(256))
    rng.shuffle(order)
    ranks = {bytes([b]): rank for rank, b in enumerate(order)}
    counts: dict[bytes, int] = {}
    for text in texts:
        for word in re.findall(r" ?\w+| ?[^\w\s]+|\s+", text):
            counts[word.encode()] = counts.get(word.encode(), 0) + 1
    words = {word: [bytes([b]) for b in word] for word in counts}
    for _ in range(merges):
        pairs: dict[tuple[bytes, bytes], int] = {}
        for word, parts in words.items():
            for pair in zip(parts, parts[1:]):
                pairs[pair] = pairs.get(pair, 0) + counts[word]
        if not pairs:
            break
        left, right = max(pairs, key=lambda pair: (pairs[pair], pair))  # ties broken the same way every run
        ranks[left + right] = len(ranks)
        for word, parts in words.items():
            merged, i = [], 0
            while i < len(parts):
                if parts[i] == left and i + 1 < len(parts) and parts[i + 1] == right:
                    merged.append(left + right)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            words[word] = merged
    return ranks


def write_tiktoken_model(path: Path, ranks: dict[bytes, int]) -> Path:
    """Write `ranks` as a tiktoken BPE file (`BASE64-TOKEN RANK` lines, in rank order)."""
    ordered = sorted(ranks.items(), key=lambda item: item[1])
    path.write_text("".join(f"{base64.b64encode(token).decode()} {rank}\n" for token, rank in ordered), "ascii")
    return path


def synthetic_ranks(merges: int = 300) -> dict[bytes, int]:
    """`train_tiktoken_ranks` on English-like text plus mixed scripts, code and digits (merges of
    multi-byte characters included)."""
    mixed = ["It's 2024; we're 1234567 strong, THEY'LL see!", "中文English混合, 日本語のテキスト naïve café Жук 🙂" * 3,
             "def f(x):\n    return x ** 2  # squared\n" * 3, "1234567890 " * 5]
    return train_tiktoken_ranks(make_texts(40, seed=3) + mixed, merges)


# Special tokens of the synthetic Kimi tokenizers, at the ids after the ranks in this order (Kimi's first ones)
SPECIAL = ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>"]
TEMPLATE = ("{% for m in messages %}<|im_{{ m['role'] }}|>{{ m['content'] }}<|im_end|>{% endfor %}"
            "{% if add_generation_prompt %}<|im_assistant|>{% endif %}")


def kimi_code(parts) -> str:
    """A stand-in for tokenization_kimi.py: pat_str as Kimi writes it ("|".join of raw strings in a class),
    and a first line that fails if the module is ever imported."""
    joined = ",\n".join(f'            r"""{part}"""' for part in parts)
    return ('raise RuntimeError("attnres ran the checkpoint\'s code")\n\n\nclass TikTokenTokenizer:\n'
            f'    pat_str = "|".join(\n        [\n{joined}\n        ]\n    )\n')


def write_kimi_tokenizer(directory, ranks, parts=KIMI_PATTERN_PARTS, config=None):
    """A Kimi-style tokenizer directory: tiktoken.model, tokenization_kimi.py (unless parts is None) and
    tokenizer_config.json with SPECIAL at the ids after the ranks, the chat template and `config`."""
    directory.mkdir(parents=True, exist_ok=True)
    write_tiktoken_model(directory / TIKTOKEN_FILE, ranks)
    if parts is not None:
        (directory / "tokenization_kimi.py").write_text(kimi_code(parts))
    n = len(ranks)
    values = {"added_tokens_decoder": {str(n + i): {"content": token, "lstrip": False, "normalized": False,
                                                     "rstrip": False, "single_word": False, "special": True}
                                       for i, token in enumerate(SPECIAL)},
              "bos_token": "[BOS]", "eos_token": "<|im_end|>", "pad_token": "[EOS]", "chat_template": TEMPLATE,
              "tokenizer_class": "TikTokenTokenizer", "model_max_length": 4096,
              "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}, **(config or {})}
    (directory / "tokenizer_config.json").write_text(json.dumps(values))
    return directory


def tiktoken_reference(ranks, pattern=KIMI_PATTERN):
    """tiktoken's Encoding of the same ranks, pattern and special tokens (Kimi's layout, reserved names too)."""
    import tiktoken

    n = len(ranks)
    names = SPECIAL + [f"<|reserved_token_{i}|>" for i in range(n + len(SPECIAL), n + SPECIAL_SLOTS)]
    special = {name: n + i for i, name in enumerate(names)}
    return tiktoken.Encoding("synthetic", pat_str=pattern, mergeable_ranks=ranks, special_tokens=special)
