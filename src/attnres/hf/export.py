"""Wrap an AttnResLM as AttnResForCausalLM and save it in Hugging Face format; `attnres convert` end to end."""

from __future__ import annotations

import errno
import glob
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import GenerationConfig

from attnres.checkpoint.hf_dir import generation_defaults, read_generation_config, special_token_ids
from attnres.common.atomic import apply_umask, publish
from attnres.common.json_files import CONFIG_FILE
from attnres.checkpoint.run_lock import LOCK_FILE, RunLock
from attnres.common.run_options import check_out_dir
from attnres.common.user_paths import user_path
from attnres.data.tiktoken_files import check_tiktoken_source
from attnres.data.tokenizer import copy_tokenizer_files
from attnres.hf.configuration import AttnResConfig
from attnres.hf.convert import ConversionError, convert_checkpoint, read_source_config
from attnres.hf.gguf import save_gguf_tokenizer
from attnres.hf.modeling import AttnResForCausalLM
from attnres.model import AttnResLM


def to_hf_model(model: AttnResLM, token_ids: dict | None = None, generation: dict | None = None
                ) -> AttnResForCausalLM:
    """An AttnResForCausalLM holding `model` itself (no copy of the weights).

    token_ids: bos/eos/pad ids for its config (`special_token_ids`); generation: a source model's
    generation_config.json fields (`generation_defaults` fills in the ids)."""
    ids = {key: value for key, value in (token_ids or {}).items() if value is not None}
    wrapper = AttnResForCausalLM(AttnResConfig.from_model_config(model.config, **ids))
    wrapper.model = model
    wrapper.generation_config = GenerationConfig.from_dict(generation_defaults(ids, generation))
    return wrapper.eval()


def check_new_dir(out_dir: str | Path) -> Path:
    """`out_dir` as a Path, `~` expanded; ConversionError in one line when it is empty, cannot be made
    (a file on its path, a dangling symlink, no write access), or exists and is not an empty
    directory (nothing is overwritten). An empty directory is fine, a mount point included: the
    model is published into it. attnres's own lock file, and what a killed conversion left, do not
    count; another conversion still building there is named."""
    out = user_path(out_dir, "--out", error=ConversionError)
    check_out_dir(out, "--out", error=ConversionError)
    builds = _builds(out)
    if out.is_dir() and any(path.name != LOCK_FILE and path not in builds for path in out.iterdir()):
        raise ConversionError(f"output directory {str(out)!r} already exists and is not empty; choose another "
                              f"--out or delete it")
    for pid in builds.values():
        if pid != os.getpid() and _running(pid):
            raise ConversionError(f"--out {str(out)!r} is being written by another conversion (pid {pid}); wait for "
                                  f"it to finish, or choose another --out")
    return out


def save_hf(model: AttnResLM, out_dir: str | Path, tokenizer_dir: str | Path | None = None,
            token_ids: dict | None = None, generation: dict | None = None) -> Path:
    """save_pretrained (model.safetensors, config.json, generation_config.json) plus the tokenizer
    files of tokenizer_dir (`TOKENIZER_FILES`, chat template included) into out_dir; returns it.
    out_dir holds a whole model or nothing, and one that is not empty is refused (`build_hf_dir`);
    token_ids and generation as in `to_hf_model`."""
    return build_hf_dir(out_dir, lambda tmp: to_hf_model(model, token_ids, generation).save_pretrained(tmp),
                        tokenizer_dir)


def build_hf_dir(out_dir: str | Path, write_model, tokenizer_dir: str | Path | None = None) -> Path:
    """`save_hf`'s directory handling with the model written by `write_model(tmp)` (weights, config.json,
    generation_config.json) and the tokenizer files of tokenizer_dir copied beside it; returns out_dir
    (`~` expanded, checked by `check_new_dir`; what killed conversions into it left is removed).

    A new out_dir is built in a temporary directory beside it and renamed into place: it appears whole
    or not at all, and of two conversions into one new out_dir the second fails in one line when it
    finds the first one's model there. An existing empty directory (a mount point, which cannot be
    renamed over) is built in a temporary directory inside it, whose files are then moved up under
    the folder's lock (`RunLock`), config.json last."""
    out = check_new_dir(out_dir)
    into_existing = out.is_dir()
    if not into_existing:
        out.parent.mkdir(parents=True, exist_ok=True)
    for path, pid in _builds(out).items():  # a killed conversion's half-built model: as large as the model
        if not _running(pid):
            shutil.rmtree(path, ignore_errors=True)
    where = out if into_existing else out.parent
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.{os.getpid()}.", suffix=".tmp", dir=where))
    try:
        write_model(tmp)
        if tokenizer_dir is not None:
            copy_tokenizer_files(tokenizer_dir, tmp)
        if into_existing:
            _publish_into(tmp, out)
        else:
            _publish_new(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _publish_new(tmp: Path, out: Path) -> None:
    """Rename the built `tmp` to `out`, which did not exist when the conversion began (a rename also
    replaces an empty directory made since); one line when another process filled `out` meanwhile."""
    try:
        publish(tmp, out)
    except OSError as failure:
        if failure.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.EBUSY):
            raise
        raise ConversionError(f"--out {str(out)!r} was filled by another process while this conversion ran (a "
                              f"second `attnres convert` into it?); nothing of this conversion was kept, and what "
                              f"is there was left as it is; choose another --out") from None


def _publish_into(tmp: Path, out: Path) -> None:
    """Move the files of `tmp` (built inside the existing directory `out`) up into `out`, holding its
    lock; config.json last, so `out` reads as a model only once it is whole."""
    with RunLock(out, field="--out"):
        builds = _builds(out)
        others = sorted(p.name for p in out.iterdir() if p.name != LOCK_FILE and p not in builds)
        if others:
            raise ConversionError(f"--out {str(out)!r} was filled by another process while this conversion ran "
                                  f"({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}); nothing of this "
                                  f"conversion was kept; choose another --out")
        apply_umask(tmp)
        for name in sorted(os.listdir(tmp), key=lambda name: name == CONFIG_FILE):
            os.replace(tmp / name, out / name)
        tmp.rmdir()


def _builds(out: Path) -> dict[Path, int]:
    """{temporary directory: pid} of the conversions building `out` (`.NAME.PID.*.tmp`, beside or in it)."""
    builds = {}
    for folder in (out.parent, out):
        for path in folder.glob(f".{glob.escape(out.name)}.*.tmp") if folder.is_dir() else ():
            parts = path.name[len(out.name) + 2:].split(".")  # PID, mkdtemp's random part, "tmp"
            if len(parts) == 3 and parts[0].isdigit() and path.is_dir():
                builds[path] = int(parts[0])
    return builds


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    return True


def convert_to_hf(source: str | Path, out_dir: str | Path, residual: str = "standard",
                  residual_options: dict | None = None, dtype: torch.dtype = torch.float32,
                  max_seq_len: int | None = None) -> tuple[Path, AttnResLM]:
    """Convert a Hugging Face checkpoint directory or a .gguf file (`convert_checkpoint`) and save it
    with `save_hf`, keeping what generation needs from the source: its special-token ids (config.json),
    its generation defaults (generation_config.json, eos lists included; for a GGUF file, those
    transformers derives from its metadata) and its tokenizer (copied, or the GGUF's embedded one
    saved), chat template included. Returns (out_dir, the converted model)."""
    check_new_dir(out_dir)  # now, not after the conversion
    check_tiktoken_source(source)  # so is a tiktoken tokenizer that cannot be rebuilt
    source_config = read_source_config(source)  # once: a GGUF file's metadata takes seconds to read
    ids = special_token_ids(source_config)

    def convert() -> AttnResLM:
        return convert_checkpoint(source, residual=residual, residual_options=residual_options, dtype=dtype,
                                  max_seq_len=max_seq_len, source_config=source_config)

    if str(source).endswith(".gguf"):
        with tempfile.TemporaryDirectory() as tokenizer_dir:
            save_gguf_tokenizer(source, tokenizer_dir)  # first: a GGUF without a tokenizer is refused before its weights
            model = convert()
            out = save_hf(model, out_dir, tokenizer_dir, ids)
    else:
        model = convert()
        out = save_hf(model, out_dir, source, ids, read_generation_config(source))
    return out, model
