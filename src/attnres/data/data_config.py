"""DataConfig: where the text comes from, how it is tokenised and split, validated at construction."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from attnres.common.checks import check_int, is_number
from attnres.data.data_error import DataError

SOURCE_HELP = ("'demo', 'python-docs', 'fineweb-edu', 'hf:<dataset path or local dir>', or a local path to a "
               ".txt/.jsonl/.parquet file or a folder of them")
TOKENIZER_HELP = "'bpe' (train a byte-level BPE) or a path to a pretrained tokenizer directory"
MIN_BPE_VOCAB = 260  # 256 byte symbols + <|endoftext|> + room for a few merges
CACHE_ENV = "ATTNRES_CACHE"


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """What text to read and how to turn it into train/validation token streams.

    `source`: "demo" (KJV Bible chapters from Debian's packages), "python-docs" (the Python 3.11
    documentation's reStructuredText pages, Debian's python3.11-doc), "fineweb-edu" (HuggingFaceFW/
    fineweb-edu, config sample-10BT unless `hf_config` is given, streamed; needs `max_documents`),
    "hf:<path>" (any `datasets` dataset, streamed: hub name, local dataset dir or data file), or a
    local path to a .txt/.jsonl/.parquet file or a folder of them.
    `tokenizer`: "bpe" trains a byte-level BPE of `vocab_size` on the training split; anything
    else is a local directory with a pretrained tokenizer. `val_fraction` of documents (by hash of
    their id with `split_salt`) go to validation and, when `test_fraction` > 0, a further
    `test_fraction` to a test split that training and every choice leave alone (`attnres compare`'s
    protocol reports on it); the validation documents do not depend on `test_fraction`.
    `cache_dir=None` means $ATTNRES_CACHE, else ~/.cache/attnres.
    """

    source: str = "demo"
    hf_config: str | None = None
    hf_split: str = "train"
    text_field: str = "text"
    id_field: str = "id"
    max_documents: int | None = None
    tokenizer: str = "bpe"
    vocab_size: int = 4096
    val_fraction: float = 0.05
    test_fraction: float = 0.0
    split_salt: str = "attnres"
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("source", "tokenizer", "cache_dir"):
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, name, os.fspath(value))
        if not _nonempty_str(self.source):
            raise DataError(f"DataConfig.source must be {SOURCE_HELP}; got {self.source!r}")
        if self.source.startswith("hf:") and not self.source[3:].strip():
            raise DataError(f"DataConfig.source 'hf:' needs a dataset after the colon, e.g. 'hf:user/name' "
                            f"or 'hf:/path/to/dir'; got {self.source!r}")
        if self.hf_config is not None and not _nonempty_str(self.hf_config):
            raise DataError(f"DataConfig.hf_config must be None or a non-empty string, got {self.hf_config!r}")
        for name in ("hf_split", "text_field", "id_field"):
            if not _nonempty_str(getattr(self, name)):
                raise DataError(f"DataConfig.{name} must be a non-empty string, got {getattr(self, name)!r}")
        check_int(self.max_documents, "DataConfig.max_documents", allow_none=True, error=DataError)
        if self.source == "fineweb-edu" and self.max_documents is None:
            # The sample-10BT config alone is ~10 billion tokens: without a cap prepare_data would
            # stream it for days; an explicit number keeps the cost visible in the config.
            raise DataError("DataConfig.max_documents is required with source='fineweb-edu' (a positive "
                            "integer, e.g. 100000): the stream has millions of documents")
        if not _nonempty_str(self.tokenizer):
            raise DataError(f"DataConfig.tokenizer must be {TOKENIZER_HELP}; got {self.tokenizer!r}")
        check_int(self.vocab_size, "DataConfig.vocab_size", minimum=MIN_BPE_VOCAB,
                  why=" (256 bytes + <|endoftext|> + merges)", error=DataError)
        fraction = self.val_fraction
        if not is_number(fraction) or not 0.0 < fraction < 1.0:
            raise DataError(f"DataConfig.val_fraction must be a number with 0 < val_fraction < 1, got {fraction!r}")
        test = self.test_fraction
        if not is_number(test) or not 0.0 <= test < 1.0 - fraction:
            raise DataError(f"DataConfig.test_fraction must be a number with 0 <= test_fraction < 1 - val_fraction "
                            f"(= {1.0 - fraction:g}), got {test!r}")
        if not isinstance(self.split_salt, str):
            raise DataError(f"DataConfig.split_salt must be a string, got {self.split_salt!r}")
        if self.cache_dir is not None and not _nonempty_str(self.cache_dir):
            raise DataError(f"DataConfig.cache_dir must be None or a non-empty path string, got {self.cache_dir!r}")

    def cache_root(self) -> Path:
        """The cache directory: `cache_dir`, else $ATTNRES_CACHE, else ~/.cache/attnres (not created)."""
        if self.cache_dir is not None:
            return Path(self.cache_dir).expanduser()
        env = os.environ.get(CACHE_ENV)
        if env:
            return Path(env).expanduser()
        return Path.home() / ".cache" / "attnres"

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (JSON/YAML-serialisable)."""
        return asdict(self)


def _nonempty_str(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())
