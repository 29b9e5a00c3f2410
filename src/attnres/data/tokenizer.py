"""Tokenizer: a byte-level BPE trained here, or a pretrained tokenizer loaded from a local directory."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer as _BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from attnres.common.atomic import write_atomic
from attnres.common.checks import check_int
from attnres.data.data_error import DataError
from attnres.data.hashing import digest
from attnres.data.tiktoken_files import (CONFIG_FILE, TOKENIZER_FILE, build_fast_tokenizer, needs_building,
                                         write_fast_tokenizer)

EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
# What a Hugging Face tokenizer directory may hold: copied whole when a pretrained tokenizer is
# saved again, so its chat template, BOS and padding tokens survive into runs and checkpoints.
TOKENIZER_FILES = (TOKENIZER_FILE, CONFIG_FILE, SPECIAL_TOKENS_FILE, "added_tokens.json", "chat_template.jinja",
                   "chat_template.json", "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model")
SPECIAL_TOKENS = ("bos", "eos", "pad")  # the roles transformers' generate reads as <role>_token_id


class Tokenizer:
    """Text <-> token ids, with the end-of-sequence id that separates documents.

    Wraps a `tokenizers.Tokenizer`. Special tokens are never added by `encode`, and special-token
    strings inside a text are encoded as plain text, so only packing inserts EOS.
    """

    def __init__(self, backend: _BackendTokenizer, eos_token: str, source: Path | None = None) -> None:
        eos_id = backend.token_to_id(eos_token)
        if eos_id is None:
            raise DataError(f"tokenizer: EOS token {eos_token!r} is not in the vocabulary")
        self._backend = backend
        # A document containing the literal "<|endoftext|>" must not inject a separator.
        self._backend.encode_special_tokens = True
        self._eos_token = eos_token
        self._eos_id = int(eos_id)
        self._source = source  # the pretrained tokenizer directory this was loaded from, if any
        self._fingerprint = digest(backend.to_str() + "\x00" + eos_token, size=8)

    @property
    def vocab_size(self) -> int:
        """Number of ids (added tokens included): every id is in [0, vocab_size)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def eos_id(self) -> int:
        """Id of the end-of-sequence token appended after every document."""
        return self._eos_id

    @property
    def eos_token(self) -> str:
        """The end-of-sequence token string."""
        return self._eos_token

    @property
    def fingerprint(self) -> str:
        """16 hex characters identifying the vocabulary, merges and EOS (for cache keys)."""
        return self._fingerprint

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no special tokens added)."""
        return self._backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, as `encode` would give them (batched, multi-threaded)."""
        return [enc.ids for enc in self._backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; special tokens (EOS) are kept, so decode(encode(t)) == t for byte-level BPE."""
        return self._backend.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the tokenizer into `directory`; returns it.

        A pretrained tokenizer's files are copied as they are (`TOKENIZER_FILES`: chat template,
        special tokens and all); a BPE trained here is written as `tokenizer.json` and
        `tokenizer_config.json` (EOS, which also pads). The directory reloads with `Tokenizer.load`,
        and with `transformers.AutoTokenizer`.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self._source is not None:
            copy_tokenizer_files(self._source, directory)
            return directory
        # each file atomically: a process killed while saving leaves no partial file under its name
        write_atomic(directory / TOKENIZER_FILE, self._backend.to_str(pretty=True))  # what backend.save writes
        write_atomic(directory / CONFIG_FILE, json.dumps(self._bpe_config(), indent=2) + "\n")
        return directory

    def _bpe_config(self) -> dict:
        # EOS separates documents; it doubles as the padding token so batched generation and
        # scoring can pad (transformers' tokenizers refuse to pad without one).
        return {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": self._eos_token, "pad_token": self._eos_token}

    def special_token_ids(self) -> dict[str, int | None]:
        """{"bos_token_id", "eos_token_id", "pad_token_id"}: what a saved copy of this tokenizer
        declares (None for a role it has no token for), as a model's config.json carries them."""
        declared = _declared_tokens(self._source) if self._source is not None else self._bpe_config()
        ids = {}
        for role in SPECIAL_TOKENS:
            token = declared.get(f"{role}_token")
            ids[f"{role}_token_id"] = None if token is None else self._backend.token_to_id(token)
        ids["eos_token_id"] = self._eos_id
        return ids

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Tokenizer:
        """Load a tokenizer directory: `tokenizer.json` (EOS from tokenizer_config.json or
        special_tokens_map.json, else a special `<|endoftext|>`), or, without tokenizer.json, a tiktoken
        tokenizer (`tiktoken.model`, rebuilt by `attnres.data.tiktoken_files`) or any fast
        `transformers` tokenizer via `AutoTokenizer.from_pretrained(local_files_only=True)`.
        """
        directory = Path(directory).expanduser()
        if not directory.is_dir():
            raise DataError(f"tokenizer: {str(directory)!r} is not a directory (DataConfig.tokenizer must be "
                            "'bpe' or a directory holding tokenizer.json or a transformers tokenizer)")
        if (directory / TOKENIZER_FILE).is_file():
            try:
                backend = _BackendTokenizer.from_file(str(directory / TOKENIZER_FILE))
            except Exception as exc:  # noqa: BLE001 - the Rust side raises plain Exception
                raise DataError(f"tokenizer: cannot read {directory / TOKENIZER_FILE}: {exc}") from exc
        elif needs_building(directory):  # Kimi's tiktoken.model: rebuilt, its remote code never run
            backend = build_fast_tokenizer(directory)
        else:
            return _load_transformers(directory)
        eos = _declared_tokens(directory).get("eos_token")
        special = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
        if eos is None and EOS_TOKEN in special:
            eos = EOS_TOKEN
        if eos is None:
            raise DataError(f"tokenizer: {str(directory)!r} defines no EOS token; add \"eos_token\" to its "
                            f"{CONFIG_FILE} (the token documents are separated with)")
        return cls(backend, eos, source=directory)


def copy_tokenizer_files(source: str | os.PathLike[str], directory: str | os.PathLike[str]) -> list[str]:
    """Copy the `TOKENIZER_FILES` that `source` holds into `directory`, each atomically; returns their names.

    A tiktoken tokenizer (Kimi's `tiktoken.model`, no tokenizer.json) is rebuilt as tokenizer.json and
    tokenizer_config.json instead of copied (`attnres.data.tiktoken_files`; its code is never run)."""
    built = write_fast_tokenizer(source, directory) if needs_building(source) else []
    copied = list(built)
    for name in TOKENIZER_FILES:
        if name not in built and (Path(source) / name).is_file():
            write_atomic(Path(directory) / name, (Path(source) / name).read_bytes())
            copied.append(name)
    return copied


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE on `texts` with at most `vocab_size` ids, `<|endoftext|>` (id 0) as EOS.

    Deterministic: the same texts in the same order give the same vocabulary and merges.
    """
    check_int(vocab_size, "train_bpe: vocab_size", minimum=260, error=DataError)
    backend = _BackendTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(texts, trainer=trainer)
    return Tokenizer(backend, EOS_TOKEN)


def _declared_tokens(directory: Path) -> dict[str, str]:
    """"<role>_token" -> token string declared in tokenizer_config.json or special_tokens_map.json (the
    first file that declares a role wins; a token may be a string or {"content": ...})."""
    declared: dict[str, str] = {}
    for name in (CONFIG_FILE, SPECIAL_TOKENS_FILE):
        path = directory / name
        if not path.is_file():
            continue
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataError(f"tokenizer: cannot read {path}: {exc}") from exc
        if not isinstance(values, dict):
            raise DataError(f"tokenizer: {path} must hold a JSON object")
        for role in SPECIAL_TOKENS:
            token = values.get(f"{role}_token")
            if isinstance(token, dict):
                token = token.get("content")
            if isinstance(token, str) and token:
                declared.setdefault(f"{role}_token", token)
    return declared


def _load_transformers(directory: Path) -> Tokenizer:
    try:
        from transformers import AutoTokenizer

        loaded = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, ImportError...
        raise DataError(f"tokenizer: {str(directory)!r} has no {TOKENIZER_FILE} and transformers could not "
                        f"load it ({type(exc).__name__}: {exc})") from exc
    backend = getattr(loaded, "backend_tokenizer", None)
    if backend is None:
        raise DataError(f"tokenizer: {str(directory)!r} loads as a slow transformers tokenizer "
                        f"({type(loaded).__name__}); a fast one (tokenizer.json) is needed")
    if not loaded.eos_token:
        raise DataError(f"tokenizer: {str(directory)!r} has no eos_token; set one in its {CONFIG_FILE}")
    return Tokenizer(backend, loaded.eos_token, source=directory)
