"""Fuzzing every reader of safetensors files: the header length, the header's JSON (dtypes, shapes,
data offsets, extra and missing keys) and the data after it, starting from the valid file of a tiny
model. A header claiming 10^12 bytes, or shapes and offsets past the file, must be refused before
anything that size is allocated."""

import json
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import save

from attnres.checkpoint import CheckpointError
from attnres.checkpoint.format import Checkpoint
from attnres.checkpoint.single import restore_model, restore_training
from attnres.common.errors import InputError
from attnres.hf.convert import _load_safetensors, read_hf_checkpoint
from attnres.hf.model_dir import check_model_dir
from attnres.model import AttnResLM, ModelConfig
from attnres.train.starting_model import load_initial_weights
from tests.fuzz.helpers import HUGE, check_reader, json_keys, json_values, mutated, u64, unchanged

ERRORS = (CheckpointError, InputError)
DTYPES = ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "U64",
          "F128", "f32", "", "C64")
CONFIG = ModelConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=8,
                     max_seq_len=16, residual="block_attnres", residual_options={"num_blocks": 1})


def _model() -> AttnResLM:
    torch.manual_seed(0)
    return AttnResLM(CONFIG)


def _split(blob: bytes) -> tuple[dict, bytes]:
    """(header, data) of a safetensors file's bytes."""
    length = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8:8 + length]), blob[8 + length:]


MODEL_HEADER, MODEL_DATA = _split(save({k: v.clone() for k, v in _model().state_dict().items()}))
# The same decoder as a Hugging Face Qwen3 checkpoint, for conversion's reader.
QWEN3_CONFIG = {"model_type": "qwen3", "vocab_size": 16, "hidden_size": 8, "num_hidden_layers": 1,
                "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 8,
                "max_position_embeddings": 16, "tie_word_embeddings": False, "rms_norm_eps": 1e-6}
HF_HEADER, HF_DATA = _split(save({(k if k == "lm_head.weight" else f"model.{k}"): v.clone()
                                  for k, v in _model().state_dict().items() if not k.startswith("residual.")}))
TRAINER_HEADER, TRAINER_DATA = _split(save({"optim.0.step": torch.tensor(1.0), "optim.0.exp_avg": torch.zeros(16, 8),
                                            "rng.torch": torch.get_rng_state()}))

dims = st.one_of(st.integers(0, 20), st.sampled_from([-1, 2**31, 2**32, 2**63 - 1, 2**64 - 1, 2**64, HUGE]))
offsets = st.one_of(st.integers(0, 4000), st.sampled_from([-1, 2**32, 2**63, 2**64 - 1, 2**64, HUGE]))


def _entry(entry: dict):
    """One tensor's header entry with its dtype, shape or offsets changed (or all kept)."""
    return st.fixed_dictionaries({
        "dtype": st.one_of(st.just(entry["dtype"]), st.sampled_from(DTYPES), json_values),
        "shape": st.one_of(st.just(entry["shape"]), st.lists(dims, max_size=4), json_values),
        "data_offsets": st.one_of(st.just(entry["data_offsets"]), st.lists(offsets, min_size=0, max_size=3),
                                  json_values)})


@st.composite
def safetensors_files(draw, header: dict, data: bytes) -> bytes:
    """A safetensors file from a valid (header, data): entries changed, dropped or added, the header's
    JSON mutated or replaced, the length field and the data cut, extended or replaced."""
    header = dict(header)
    for name in draw(st.lists(st.sampled_from(sorted(header)), max_size=3, unique=True)):
        header[name] = draw(_entry(header[name]) if name != "__metadata__" else json_values)
    if draw(st.booleans()):
        header = draw(mutated(header, json_values, json_keys))
    text = json.dumps(header).encode()
    text = draw(st.one_of(st.just(text), st.just(text + b" " * draw(st.integers(0, 8))), st.binary(max_size=40),
                          st.just(text[:draw(st.integers(0, len(text)))])))
    length = draw(st.one_of(st.just(len(text)), st.integers(0, len(text) + 16),
                            st.sampled_from([HUGE, 2**63, 2**64 - 1, 100_000_001])))
    body = draw(st.one_of(st.just(data), st.just(data[:draw(st.integers(0, len(data)))]),
                          st.just(data + b"\0" * draw(st.integers(1, 64))), st.binary(max_size=64)))
    blob = u64(length) + text + body
    return draw(st.one_of(st.just(blob), st.just(blob[:draw(st.integers(0, len(blob)))])))


def _write(directory: Path, name: str, blob: bytes) -> Path:
    (directory / name).write_bytes(blob)
    return directory / name


@given(safetensors_files(MODEL_HEADER, MODEL_DATA))
def test_model_weight_readers(blob):
    """The readers of a model's weights: conversion's, init_from's, a checkpoint's restore, the
    model-directory check of generate / lm-eval."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        file = _write(directory, "model.safetensors", blob)
        (directory / "config.json").write_text(json.dumps(CONFIG.to_hf_dict()))
        with unchanged(directory):
            loaded = check_reader(lambda: _load_safetensors(file), ERRORS)
            assert isinstance(loaded, (dict, InputError))
            check_reader(lambda: load_initial_weights(_model(), directory), ERRORS)
            check_reader(lambda: restore_model(Checkpoint(directory, {}), _model()), ERRORS)
            check_reader(lambda: check_model_dir(directory), ERRORS)


@given(safetensors_files(HF_HEADER, HF_DATA))
def test_conversion_reader(blob):
    """`attnres convert`'s reader of a Hugging Face checkpoint directory."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        _write(directory, "model.safetensors", blob)
        (directory / "config.json").write_text(json.dumps(QWEN3_CONFIG))
        with unchanged(directory):
            result = check_reader(lambda: read_hf_checkpoint(directory), ERRORS)
        assert isinstance(result, (tuple, InputError))


@given(safetensors_files(TRAINER_HEADER, TRAINER_DATA))
def test_trainer_state_reader(blob):
    """trainer.safetensors (optimizer moments, RNG state) as a resumed run reads it."""
    model = torch.nn.Linear(8, 16, bias=False)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    state = {"optimizer": {"param_groups": optimizer.state_dict()["param_groups"], "scalars": {}},
             "scheduler": scheduler.state_dict()}
    state = json.loads(json.dumps(state))
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        _write(directory, "trainer.safetensors", blob)
        with unchanged(directory):
            check_reader(lambda: restore_training(Checkpoint(directory, state), optimizer, scheduler), ERRORS)


@pytest.mark.parametrize("claimed", [HUGE, 2**63, 2**64 - 1])
def test_huge_header_length_is_refused(claimed):
    """A header length of 10^12 bytes (or more) in a file of a few bytes: refused by every reader."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        file = _write(directory, "model.safetensors", u64(claimed) + b'{"a": 1}')
        (directory / "config.json").write_text(json.dumps(CONFIG.to_hf_dict()))
        for read in (lambda: _load_safetensors(file), lambda: load_initial_weights(_model(), directory),
                     lambda: restore_model(Checkpoint(directory, {}), _model()), lambda: check_model_dir(directory)):
            assert isinstance(check_reader(read, ERRORS), ERRORS)
