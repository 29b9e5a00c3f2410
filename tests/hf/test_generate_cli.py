"""`attnres generate MODEL --prompt TEXT`: a converted tiny model decodes the text plain `generate` does,
and prints prefill, compile and decode figures."""

import json
import random

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnres.hf  # noqa: E402,F401  (registers the Auto classes)
from attnres.cli import main  # noqa: E402
from attnres.data import train_bpe  # noqa: E402
from tests.helpers import needs_inductor_cpu  # noqa: E402
from tests.train.conftest import WORDS  # noqa: E402

PROMPT = "the king of the city"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A tiny transformers Llama with a BPE tokenizer, converted by `attnres convert` to Block AttnRes."""
    root = tmp_path_factory.mktemp("generate")
    rng = random.Random(0)
    tokenizer = train_bpe([" ".join(rng.choice(WORDS) for _ in range(200)) for _ in range(20)], vocab_size=300)
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      tie_word_embeddings=False, rms_norm_eps=1e-6, eos_token_id=299)
    torch.manual_seed(0)
    source = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # weights large enough that greedy decoding is far from ties and varied
        for p in source.parameters():
            p.mul_(8.0 if p.dim() > 1 else 1.0)
    source.save_pretrained(root / "llama")
    tokenizer.save(root / "llama")
    out = root / "converted"
    assert main(["convert", str(root / "llama"), "--residual", "block_attnres", "--option", "num_blocks=2",
                 "--out", str(out)]) == 0
    return out


def plain_greedy_text(model_dir, new_tokens):
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        new = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)[0, ids.shape[1]:]
    assert len(set(new.tolist())) >= 4  # a varied continuation, not one token repeated
    return tokenizer.decode(new, skip_special_tokens=True)


def test_generate_prints_the_greedy_text_and_the_figures(converted, capsys):
    expected = plain_greedy_text(converted, 12)
    assert main(["generate", str(converted), "--prompt", PROMPT, "--max-new-tokens", "12", "--no-compile",
                 "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    assert out == expected + "\n"
    assert "prefill" in err and "tokens/s" in err and "compile: none (--no-compile" in err
    assert "decode: 11 tokens in" in err and "12 new tokens in all, weights fp32, precision fp32, 1 threads" in err
    assert "of weights and KV cache read per step" in err and "read bandwidth" in err
    # how routing is computed is chosen per run, not stored with the model: the same text
    assert main(["generate", str(converted), "--prompt", PROMPT, "--max-new-tokens", "12", "--no-compile",
                 "--threads", "1", "--routing-impl", "reference"]) == 0
    assert capsys.readouterr().out == expected + "\n"


@pytest.mark.compile
@needs_inductor_cpu
def test_generate_compiles_the_step_and_prints_the_same_text(converted, capsys):
    torch._dynamo.reset()
    expected = plain_greedy_text(converted, 10)
    assert main(["generate", str(converted), "--prompt", PROMPT, "--max-new-tokens", "10", "--compile"]) == 0
    out, err = capsys.readouterr()
    assert out == expected + "\n"
    assert "the first decode step: torch.compile, mode 'default+no_size_asserts'" in err and "decode: 8 tokens in" in err
    # a forced compile also says first what it is doing, how long it should take and how to skip it
    assert err.index("compiling the decode step: about") < err.index("compile: ")
    assert "cached for later runs (--no-compile" in err


def test_generate_does_not_compile_where_it_would_not_pay(converted, capsys, tmp_path, monkeypatch):
    """Without --compile or --no-compile, a short request decodes eagerly and says why (no compile
    measured here yet: the prior of 1.5 s per sub-layer is far above what 10 tokens save)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    expected = plain_greedy_text(converted, 10)
    assert main(["generate", str(converted), "--prompt", PROMPT, "--max-new-tokens", "10", "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    assert out == expected + "\n"
    assert "compile: none (eager: compiling would take about" in err and "(a first estimate)" in err
    assert "--compile forces it)" in err and "compiling the decode step" not in err


def test_generate_refuses_what_it_cannot_load_or_use(converted, tmp_path, capsys):
    assert main(["generate", str(tmp_path / "none"), "--prompt", "x"]) == 2
    assert "none/config.json does not exist; give a directory written by" in capsys.readouterr().err
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert main(["generate", str(tmp_path / "llama"), "--prompt", "x"]) == 2
    assert "holds a 'llama' model, not an attnres one; convert it first" in capsys.readouterr().err
    assert main(["generate", str(converted), "--prompt", "x", "--temperature", "0.5"]) == 2
    assert "--temperature only apply with --sample" in capsys.readouterr().err
    assert main(["generate", str(converted), "--prompt", "x", "--max-new-tokens", "0"]) == 2
    assert "--max-new-tokens must be a positive integer, got 0" in capsys.readouterr().err
    assert main(["generate", str(converted), "--prompt", "", "--no-compile"]) == 2
    assert "--prompt must be a non-empty text" in capsys.readouterr().err


def test_generate_with_bf16_weights_reads_half_the_bytes(converted, capsys):
    """--dtype bf16 loads the weights in bf16: every weight and cache byte a step reads halves."""
    read = {}
    for dtype in ("fp32", "bf16"):
        assert main(["generate", str(converted), "--prompt", PROMPT, "--max-new-tokens", "6", "--no-compile",
                     "--threads", "1", "--dtype", dtype]) == 0
        out, err = capsys.readouterr()
        assert out.strip() and f"weights {dtype}, precision fp32" in err
        line = next(line for line in err.splitlines() if line.startswith("memory: "))
        read[dtype] = float(line.split()[1])  # "memory: 83 kB of weights and KV cache read per step, ..."
        assert line.split()[2] == "kB"
    assert read["bf16"] == pytest.approx(read["fp32"] / 2, abs=1)
