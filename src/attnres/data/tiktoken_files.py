"""A fast tokenizer (`tokenizer.json`) built from a tiktoken checkpoint's files, without running its code.

Kimi's checkpoints (Kimi Linear, Kimi K2) ship their tokenizer as `tiktoken.model` (one
`base64-token rank` line per BPE token), `tokenization_kimi.py` (remote code holding the split regex
`pat_str` and the special-token layout) and `tokenizer_config.json` (`added_tokens_decoder`, the
special tokens, the chat template). transformers loads that only with `trust_remote_code`; attnres
never runs a checkpoint's code, so it rebuilds the same tokenizer here with transformers'
`TikTokenConverter`:

- the ranks become a byte-level BPE (every ranked token, the merges derived from the ranks);
- the split regex is the `pat_str` the checkpoint's `tokenization*.py` defines, *read* from its
  syntax tree (`ast`; only string literals are evaluated, nothing is imported or run). Where no
  such file defines it as literals, Kimi's published pattern (`KIMI_PATTERN`) is used with a
  one-line warning;
- the special tokens take the ids after the ranks, as Kimi's tokenizer lays them out: 256 + 2
  slots from `len(ranks)` (further if `added_tokens_decoder` declares higher ids), each named by
  `added_tokens_decoder` or else `<|reserved_token_ID|>`;
- `tokenizer_config.json` keeps the source's settings (bos/eos/pad/unk, chat template, ...) but
  names the fast class instead of the remote one (`auto_map` dropped).

What cannot be built (an unreadable or non-BPE `tiktoken.model`, a pattern the tokenizers library
cannot compile, special-token ids that do not fit) raises `DataError` in one line naming what to do.
"""

from __future__ import annotations

import ast
import base64
import binascii
import json
import os
import warnings
from pathlib import Path

from attnres.common.atomic import write_atomic
from attnres.common.json_files import read_json_object
from attnres.data.data_error import DataError

TIKTOKEN_FILE = "tiktoken.model"
TOKENIZER_FILE = "tokenizer.json"  # a fast tokenizer's files (data/tokenizer.py takes the names from here)
CONFIG_FILE = "tokenizer_config.json"

# Kimi's split regex as `tokenization_kimi.py` publishes it (Kimi Linear, Kimi K2; the `pat_str` of
# its TikTokenTokenizer): runs of Han characters first, then words with Han subtracted from the letter
# classes (`&&[^\p{Han}]`, which both tiktoken's fancy-regex and tokenizers' Oniguruma accept),
# numbers of up to 3 digits, punctuation, newlines and spaces as in cl100k.
KIMI_PATTERN_PARTS = (
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
)
KIMI_PATTERN = "|".join(KIMI_PATTERN_PARTS)
# Kimi's tokenizer gives ids len(ranks) .. len(ranks) + 257 to special tokens (256 reserved + 2).
SPECIAL_SLOTS = 258


def read_ranks(path: str | os.PathLike[str]) -> dict[bytes, int]:
    """{token bytes: rank} of a tiktoken BPE file; DataError unless the ranks are 0..n-1, each once,
    with all 256 single bytes among the tokens (a byte-level BPE)."""
    path = Path(path)
    ranks: dict[bytes, int] = {}
    try:
        with open(path, "rb") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    token, rank = line.split()
                    ranks[base64.b64decode(token, validate=True)] = int(rank)
                except (ValueError, binascii.Error):
                    raise DataError(f"tokenizer: {path} line {number} is not 'BASE64-TOKEN RANK'; replace it "
                                    f"with the checkpoint's original {TIKTOKEN_FILE}") from None
    except OSError as exc:
        raise DataError(f"tokenizer: cannot read {path} ({exc.strerror}); check the file's permissions or "
                        f"download it again") from exc
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise DataError(f"tokenizer: the ranks in {path} are not 0..{len(ranks) - 1}, each once (a token "
                        f"repeated or a rank missing); replace it with the checkpoint's original {TIKTOKEN_FILE}")
    if any(bytes([b]) not in ranks for b in range(256)):
        raise DataError(f"tokenizer: {path} lacks some of the 256 single-byte tokens, so it is not a byte-level "
                        f"BPE attnres can rebuild; convert the tokenizer yourself and put tokenizer.json beside it")
    return ranks


def pattern_in_code(source: str) -> str | None:
    """The string a module's text assigns to `pat_str` (at any depth: module, class), read from its
    syntax tree without running it: a string literal or `"SEP".join([literals])`; None otherwise."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            names, value = [t.id for t in node.targets if isinstance(t, ast.Name)], node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            names, value = [node.target.id], node.value
        else:
            continue
        if "pat_str" in names:
            pattern = _literal_pattern(value)
            if pattern is not None:
                return pattern
    return None


def _literal_pattern(node: ast.expr) -> str | None:
    # literal_eval runs nothing: it accepts only literals, so a computed pattern gives None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join" \
            and len(node.args) == 1 and not node.keywords:
        try:
            separator, parts = ast.literal_eval(node.func.value), ast.literal_eval(node.args[0])
        except (ValueError, TypeError, SyntaxError):
            return None
        if isinstance(separator, str) and isinstance(parts, (list, tuple)) and all(isinstance(p, str) for p in parts):
            return separator.join(parts)
        return None
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return None
    return value if isinstance(value, str) else None


def split_pattern(source: str | os.PathLike[str]) -> str:
    """The split regex of the tiktoken tokenizer in directory `source`: the `pat_str` its
    `tokenization*.py` defines (read, never run; the first file in name order that defines one), else
    `KIMI_PATTERN` with a one-line warning."""
    for path in sorted(Path(source).glob("tokenization*.py")):
        pattern = pattern_in_code(path.read_text(encoding="utf-8", errors="replace"))
        if pattern is not None:
            return pattern
    warnings.warn(f"attnres: no tokenization*.py in {str(source)!r} defines pat_str as literals, so the tokenizer "
                  f"built from its {TIKTOKEN_FILE} splits text with Kimi's published pattern; if the checkpoint is "
                  f"not a Kimi model, put its tokenization*.py beside {TIKTOKEN_FILE} (read, never run) and convert "
                  f"again", UserWarning, stacklevel=2)
    return KIMI_PATTERN


def special_tokens(config: dict, num_ranks: int, where: str = CONFIG_FILE) -> dict[int, dict]:
    """{id: added-token fields} for every id from num_ranks up, Kimi's layout (`SPECIAL_SLOTS`): the
    entries of config's `added_tokens_decoder`, `<|reserved_token_ID|>` where it declares none."""
    declared = config.get("added_tokens_decoder") or {}
    if not isinstance(declared, dict):
        raise DataError(f"tokenizer: {where}'s added_tokens_decoder must be an object of id -> token; fix it")
    tokens: dict[int, dict] = {}
    for key, entry in declared.items():
        content = entry.get("content") if isinstance(entry, dict) else entry
        if not (str(key).isdigit() and isinstance(content, str) and content):
            raise DataError(f"tokenizer: {where}'s added_tokens_decoder entry {key!r} is not id -> "
                            f"{{\"content\": TOKEN}}; fix it")
        if int(key) < num_ranks:
            raise DataError(f"tokenizer: {where} declares special token {content!r} at id {key}, inside "
                            f"{TIKTOKEN_FILE}'s {num_ranks} ranks; special ids start at {num_ranks}, fix the id")
        fields = entry if isinstance(entry, dict) else {}
        tokens[int(key)] = {"content": content, "special": bool(fields.get("special", True)),
                            **{flag: bool(fields.get(flag, False)) for flag in ("lstrip", "rstrip", "single_word")}}
    end = max([num_ranks + SPECIAL_SLOTS, *(i + 1 for i in tokens)])
    return {i: tokens.get(i, {"content": f"<|reserved_token_{i}|>", "special": True}) for i in range(num_ranks, end)}


def build_fast_tokenizer(source: str | os.PathLike[str]):
    """The `tokenizers.Tokenizer` of the tiktoken tokenizer in directory `source` (`TIKTOKEN_FILE`,
    `split_pattern`, `special_tokens` of its tokenizer_config.json); DataError in one line where that
    cannot be built."""
    from tokenizers import AddedToken, Regex
    from transformers.convert_slow_tokenizer import TikTokenConverter

    source = Path(source)
    ranks = read_ranks(source / TIKTOKEN_FILE)
    pattern = split_pattern(source)
    try:
        Regex(pattern)
    except Exception as exc:  # noqa: BLE001 - the Rust side raises plain Exception
        raise DataError(f"tokenizer: the split pattern of {str(source)!r} does not compile in the tokenizers "
                        f"library ({exc}); convert its tokenizer yourself and put tokenizer.json beside "
                        f"{TIKTOKEN_FILE}") from exc
    specials = special_tokens(_source_config(source), len(ranks), str(source / CONFIG_FILE))

    class _Ranks(TikTokenConverter):
        # the ranks come from read_ranks, so the converter needs no tiktoken package
        def load_tiktoken_bpe(self, tiktoken_url):
            return ranks

    backend = _Ranks(pattern=pattern).converted()
    backend.add_special_tokens([AddedToken(t["content"], normalized=False, **{k: v for k, v in t.items()
                                                                              if k != "content"})
                                for t in specials.values()])
    for token_id, token in specials.items():
        # tokenizers numbers added tokens itself: one that is also an ordinary token keeps that id
        if backend.token_to_id(token["content"]) != token_id:
            raise DataError(f"tokenizer: special token {token['content']!r} of {str(source)!r} cannot take id "
                            f"{token_id} (it is also an ordinary token); convert its tokenizer yourself")
    return backend


def needs_building(source: str | os.PathLike[str]) -> bool:
    """Whether `source` is a directory with `TIKTOKEN_FILE` and no tokenizer.json of its own."""
    source = Path(source)
    return (source / TIKTOKEN_FILE).is_file() and not (source / TOKENIZER_FILE).is_file()


def fast_tokenizer_files(source: str | os.PathLike[str]) -> dict[str, str]:
    """{"tokenizer.json": ..., "tokenizer_config.json": ...} built from the tiktoken tokenizer in
    `source`; DataError in one line where they cannot be (bos/eos/pad/unk included). The config keeps
    the source's fields (bos/eos/pad/unk, chat template, lengths) but names the fast class."""
    backend = build_fast_tokenizer(source)
    config = {key: value for key, value in _source_config(Path(source)).items()
              if key not in ("auto_map", "tokenizer_class", "added_tokens_decoder", "vocab_file")}
    # tiktoken decodes bytes as they are; transformers' clean-up would drop spaces before punctuation
    config.update(tokenizer_class="PreTrainedTokenizerFast", clean_up_tokenization_spaces=False)
    for role in ("bos_token", "eos_token", "pad_token", "unk_token"):
        token = config.get(role)
        token = token.get("content") if isinstance(token, dict) else token
        if token is not None and backend.token_to_id(token) is None:
            raise DataError(f"tokenizer: {role} {token!r} of {str(source)!r} is in neither {TIKTOKEN_FILE} nor "
                            f"added_tokens_decoder; fix its {CONFIG_FILE}")
    return {TOKENIZER_FILE: backend.to_str(pretty=True),
            CONFIG_FILE: json.dumps(config, indent=2, ensure_ascii=False) + "\n"}


def check_tiktoken_source(source: str | os.PathLike[str]) -> None:
    """Build what `write_fast_tokenizer` would write from `source`, if it `needs_building`, and drop it:
    a conversion calls this first, so a tokenizer that cannot be built fails it before the weights."""
    if needs_building(source):
        fast_tokenizer_files(source)


def write_fast_tokenizer(source: str | os.PathLike[str], directory: str | os.PathLike[str]) -> list[str]:
    """Write `fast_tokenizer_files(source)` into `directory` (each atomically); returns their names."""
    files = fast_tokenizer_files(source)
    for name, text in files.items():
        write_atomic(Path(directory) / name, text)
    return list(files)


def _source_config(source: Path) -> dict:
    # beside tiktoken.model, the only record of the special tokens and the chat template
    return read_json_object(source / CONFIG_FILE, "tokenizer", error=DataError,
                            hint=f"copy the checkpoint's original {CONFIG_FILE} beside its {TIKTOKEN_FILE}")
