"""`attnres convert` keeps what generation needs: the source's special-token ids, its generation
defaults (an eos list included) and its tokenizer with the chat template, so the converted model
stops at its end token exactly where the source model does."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnres.hf  # noqa: E402,F401  (registers the Auto classes)
from attnres.cli import main  # noqa: E402
from tests.hf.helpers import assert_generates_like_the_source, greedy_eos_setup  # noqa: E402

CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
PROMPT = torch.tensor([[5, 17, 42, 8, 23]])


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A tiny transformers Llama with an eos list that greedy decoding reaches at step 3, a
    generation_config.json with sampling defaults, and tokenizer files with a chat template."""
    root = tmp_path_factory.mktemp("llama")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # realistic activation scales (RMSNorm eps, docs/explanation/method.md §4)
        for p in model.parameters():
            p.mul_(10.0 if p.dim() > 1 else 1.0)
    _, eos = greedy_eos_setup(model, PROMPT)
    never = next(t for t in range(64) if t not in PROMPT[0].tolist() and t != eos)
    ids = dict(bos_token_id=1, eos_token_id=[never, eos], pad_token_id=0)
    for key, value in ids.items():
        setattr(model.config, key, value)
    model.generation_config = transformers.GenerationConfig(**ids, temperature=0.6, top_p=0.9, do_sample=True)
    model.save_pretrained(root)
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end|>", "bos_token": "<|start|>",
                                                            "chat_template": CHAT_TEMPLATE}))
    (root / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (root / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|end|>"}))
    return root, model


@pytest.mark.parametrize("args", [["--residual", "standard"],
                                  ["--residual", "block_attnres", "--option", "num_blocks=2"],
                                  ["--residual", "delta_block", "--option", "num_blocks=2",
                                   "--option", "exact_conversion=gate"]])
def test_converted_model_stops_at_the_sources_eos(tmp_path, llama_dir, args):
    source_dir, source = llama_dir
    assert main(["convert", str(source_dir), *args, "--out", str(tmp_path / "out")]) == 0
    loaded = assert_generates_like_the_source(source, tmp_path / "out", PROMPT)
    # Every generation default, sampling ones included, is the source's.
    for key in ("temperature", "top_p", "do_sample"):
        assert getattr(loaded.generation_config, key) == getattr(source.generation_config, key)
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["eos_token_id"] == source.config.eos_token_id and saved["bos_token_id"] == 1


def test_tokenizer_files_and_chat_template_are_kept(tmp_path, llama_dir):
    source_dir, _ = llama_dir
    assert main(["convert", str(source_dir), "--out", str(tmp_path / "out")]) == 0
    for name in ("tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        assert (tmp_path / "out" / name).read_bytes() == (source_dir / name).read_bytes(), name


def test_convert_refuses_a_non_empty_output_directory(tmp_path, llama_dir, capsys):
    source_dir, _ = llama_dir
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["convert", str(source_dir), "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]  # nothing was lost or added
    assert not list(tmp_path.glob(".out.*"))  # no temporary directory left behind


def test_bf16_conversion_writes_bf16_weights(tmp_path, llama_dir):
    from safetensors import safe_open

    source_dir, _ = llama_dir
    assert main(["convert", str(source_dir), "--dtype", "bf16", "--out", str(tmp_path / "bf16")]) == 0
    assert main(["convert", str(source_dir), "--out", str(tmp_path / "fp32")]) == 0
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "pt") as handle:
        assert {handle.get_tensor(k).dtype for k in handle.keys()} == {torch.bfloat16}
    sizes = [(tmp_path / d / "model.safetensors").stat().st_size for d in ("bf16", "fp32")]
    assert sizes[0] < 0.6 * sizes[1]
