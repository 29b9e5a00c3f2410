"""GGUF input: a Llama GGUF file (written here with the `gguf` package, as llama.cpp lays it out)
converts to the same logits as the transformers model it was written from."""

import re

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")

import attnres.hf  # noqa: E402,F401  (registers the Auto classes)
from attnres.cli import main  # noqa: E402
from tests.hf.helpers import (assert_converts_to_source_logits, assert_generates_like_the_source,  # noqa: E402
                              greedy_eos_setup)

PROMPT = torch.tensor([[5, 17, 42, 8, 23]])


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp stores q/k rows interleaved per head; transformers undoes it when reading."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, sd: dict, eos: int, drop: tuple[str, ...] = (), extra: dict | None = None,
               tokenizer: bool = True) -> None:
    """The tiny Llama `sd` as llama.cpp lays it out, without the tensors named in `drop` (GGUF names)
    and with the `extra` ones; without tokenizer metadata when not `tokenizer`."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_context_length(64)
    writer.add_embedding_length(32)
    writer.add_feed_forward_length(48)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(8)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(64)
    if tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list([f"t{i}" for i in range(64)])
        writer.add_token_types([1] * 64)
        writer.add_token_merges([])
        writer.add_token_scores([0.0] * 64)
    writer.add_eos_token_id(eos)
    writer.add_bos_token_id(1)
    writer.add_pad_token_id(0)
    tensors = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"],
               "output.weight": sd["lm_head.weight"]}
    names = {"attn_norm": "input_layernorm", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    for i in range(2):
        pre = f"model.layers.{i}."
        tensors[f"blk.{i}.attn_q.weight"] = llama_cpp_permute(sd[pre + "self_attn.q_proj.weight"], 4)
        tensors[f"blk.{i}.attn_k.weight"] = llama_cpp_permute(sd[pre + "self_attn.k_proj.weight"], 2)
        for ours, theirs in names.items():
            tensors[f"blk.{i}.{ours}.weight"] = sd[pre + theirs + ".weight"]
    for name, value in {**tensors, **(extra or {})}.items():
        if name not in drop:
            writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                                      tie_word_embeddings=False, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # realistic activation scales (method §4: RMSNorm eps)
        for p in model.parameters():
            p.mul_(10.0 if p.dim() > 1 else 1.0)
    _, eos = greedy_eos_setup(model, PROMPT)  # an EOS that greedy decoding reaches at step 3
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    write_gguf(root / "tiny.gguf", sd, eos)
    return root / "tiny.gguf", model, sd, eos


@pytest.mark.parametrize("args", [["--residual", "standard"],
                                  ["--residual", "delta_block", "--option", "num_blocks=2",
                                   "--option", "exact_conversion=gate"]])
def test_gguf_converts_to_the_source_logits(tmp_path, gguf_file, args):
    path, source, _, _ = gguf_file  # the GGUF's embedded tokenizer is saved beside the model
    assert_converts_to_source_logits(path, source, args, tmp_path / "out", vocab_size=64)


def test_missing_gguf_file_is_a_clear_error(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "nope.gguf"), "--out", str(tmp_path / "o")]) == 2
    assert "nope.gguf does not exist" in capsys.readouterr().err


def test_gguf_conversion_keeps_the_special_tokens_and_stops_at_eos(tmp_path, gguf_file):
    path, *_ = gguf_file
    # The reference is transformers' own reading of the GGUF file: its config's ids and its generate.
    source = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                               dtype=torch.float32).eval()
    assert (source.config.bos_token_id, source.config.pad_token_id) == (1, 0)
    assert main(["convert", str(path), "--out", str(tmp_path / "out")]) == 0
    assert_generates_like_the_source(source, tmp_path / "out", PROMPT)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tokenizer.eos_token_id == source.config.eos_token_id


def test_a_gguf_missing_layer_tensors_is_refused_even_when_junk_makes_up_the_weight_count(tmp_path, gguf_file,
                                                                                           capsys):
    """transformers would fill the missing layers with random weights at the metadata's sizes."""
    _, _, sd, eos = gguf_file
    layer = [f"blk.1.{part}.weight" for part in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                                 "ffn_down")]
    junk = np.ones((64, 200), dtype=np.float32)  # more weights than the dropped tensors hold
    write_gguf(tmp_path / "holed.gguf", sd, eos, drop=tuple(layer), extra={"junk.weight": junk})
    assert main(["convert", str(tmp_path / "holed.gguf"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "lacks 7 of the tensors its metadata's model needs (model.layers.1." in err
    assert not (tmp_path / "out").exists()


def test_a_gguf_with_nan_weights_is_refused_naming_the_tensor(tmp_path, gguf_file, capsys):
    _, _, sd, eos = gguf_file
    poisoned = {**sd, "model.norm.weight": np.full_like(sd["model.norm.weight"], np.nan)}
    write_gguf(tmp_path / "nan.gguf", poisoned, eos)
    assert main(["convert", str(tmp_path / "nan.gguf"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "tensor norm.weight (in attnres' names) holds 32 NaN or infinite values" in err
    assert not (tmp_path / "out").exists()


def test_a_gguf_without_a_tokenizer_is_refused_before_its_weights_are_read(tmp_path, gguf_file, capsys, monkeypatch):
    _, _, sd, eos = gguf_file
    write_gguf(tmp_path / "bare.gguf", sd, eos, tokenizer=False)
    import attnres.hf.gguf as reader

    def must_not_run(*args, **kwargs):
        raise AssertionError("the weights were read before the tokenizer was checked")

    monkeypatch.setattr(reader, "read_gguf_weights", must_not_run)
    monkeypatch.setattr("attnres.hf.convert.read_gguf_weights", must_not_run)
    assert main(["convert", str(tmp_path / "bare.gguf"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"GGUF file {tmp_path / 'bare.gguf'} holds no tokenizer transformers can rebuild" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("tensor, shape, message", [
    ("blk.0.attn_k.weight", (32, 32), r"holds 1 tensor\(s\) of another shape than its metadata's model: "
                                      r"model\.layers\.0\.self_attn\.k_proj\.weight \(32, 32\) where the model has "
                                      r"\(16, 32\) \(in transformers' names\)"),
    # a size the metadata's head count cannot split: transformers' reshape of the query fails
    ("blk.0.attn_q.weight", (33, 32), r"a tensor does not fit the shape the metadata's model gives it \(cannot "
                                      r"reshape array of size 1056"),
])
def test_a_gguf_tensor_of_another_size_than_its_metadata_is_refused_in_one_line(tmp_path, gguf_file, capsys, tensor,
                                                                               shape, message):
    _, _, sd, eos = gguf_file
    write_gguf(tmp_path / "odd.gguf", sd, eos, extra={tensor: np.ones(shape, dtype=np.float32)})
    assert main(["convert", str(tmp_path / "odd.gguf"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.search(message, err) and err.endswith("the file is damaged or not of this architecture"), err
    assert not (tmp_path / "out").exists()
