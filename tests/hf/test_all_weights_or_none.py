"""All weights or none (issue 59, item 3): every command that loads a model directory refuses a missing,
an unexpected or a mis-shaped tensor in one line naming it.

Before, `generate` and `lm-eval` ran a directory with a missing tensor (transformers filled it with
random values, exit 0) and `generate` gave a traceback for a model.safetensors of other shapes, while
`analyze` and `finetune` refused the same folder. Now all four make one check (`weights_misfit`):
`generate` and `lm-eval` on the weight files' headers before transformers loads them, `analyze` and
`finetune` on the tensors they load. Bad input is exit 2 (InputError) for the first two, as their
other refusals of a model directory are; a checkpoint that does not fit its model is exit 1
(CheckpointError) for `analyze` and `finetune`, as their refusal of corrupt weights is.
"""

import random
import re
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402

import attnres.hf  # noqa: E402,F401  (registers the Auto classes)
from attnres.cli import main  # noqa: E402
from attnres.common.errors import InputError  # noqa: E402
from attnres.data import train_bpe  # noqa: E402
from attnres.hf import AttnResConfig, AttnResForCausalLM  # noqa: E402
from attnres.hf.model_dir import check_model_dir  # noqa: E402
from attnres.model import AttnResLM, ModelConfig  # noqa: E402
from attnres.train.starting_model import load_initial_weights  # noqa: E402
from tests.train.conftest import WORDS  # noqa: E402

SHAPE = dict(vocab_size=300, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=48, residual="block_attnres", residual_options={"num_blocks": 2},
             max_position_embeddings=128)
WEIGHTS = "model.safetensors"


def save_model_dir(directory, tokenizer, hidden_size=32, tie=False):
    """A tiny Block AttnRes model saved with save_pretrained (names prefixed `model.`) and its tokenizer."""
    torch.manual_seed(0)
    model = AttnResForCausalLM(AttnResConfig(hidden_size=hidden_size, tie_word_embeddings=tie, **SHAPE))
    model.save_pretrained(directory)
    tokenizer.save(directory)
    return directory


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("weights")
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(200)) for _ in range(30)]
    corpus = root / "corpus"
    corpus.mkdir()
    for i, text in enumerate(texts):
        (corpus / f"d{i:02d}.txt").write_text(text)
    tokenizer = train_bpe(texts, vocab_size=300)
    return {"root": root, "corpus": corpus, "model": save_model_dir(root / "model", tokenizer),
            "tied": save_model_dir(root / "tied", tokenizer, tie=True),
            "wide": save_model_dir(root / "wide", tokenizer, hidden_size=48)}


def edit_weights(directory, edit):
    """Rewrite the directory's model.safetensors with `edit(tensors)` applied."""
    tensors = load_file(str(directory / WEIGHTS))
    edit(tensors)
    save_file(tensors, str(directory / WEIGHTS), metadata={"format": "pt"})


def spoiled(world, tmp_path, spoil):
    copy = tmp_path / "model"
    shutil.copytree(world["model"], copy)
    spoil(copy, world)
    return copy


def drop(name):
    return lambda d, w: edit_weights(d, lambda t: t.pop(name))


def add(name):
    return lambda d, w: edit_weights(d, lambda t: t.update({name: torch.zeros(4, 4)}))


def narrow(name, rows):
    return lambda d, w: edit_weights(d, lambda t: t.update({name: t[name][:rows].clone()}))


def other_model(d, w):  # the weights of a wider model under this config.json
    shutil.copy(w["wide"] / WEIGHTS, d / WEIGHTS)


SPOILS = {
    "missing": (drop("model.layers.1.mlp.down_proj.weight"), r"missing layers\.1\.mlp\.down_proj\.weight(;|$)"),
    "unexpected": (add("model.layers.1.mlp.extra.weight"), r"unexpected layers\.1\.mlp\.extra\.weight(;|$)"),
    "mis-shaped": (narrow("model.layers.0.self_attn.q_proj.weight", 16),
                   r"mis-shaped layers\.0\.self_attn\.q_proj\.weight \[16, 32\] \(the model's: \[32, 32\]\)"),
    "other shapes": (other_model, r"mis-shaped embed_tokens\.weight \[300, 48\] \(the model's: \[300, 32\]\), "
                                  r".*\.\.\. \(\d+ more\)"),
}


def command_line(command, model_dir, world, tmp_path):
    return {"generate": ["generate", str(model_dir), "--prompt", "the king", "--max-new-tokens", "2",
                         "--no-compile", "--threads", "1"],
            "lm-eval": ["lm-eval", str(model_dir), "--tasks", "paper"],
            "analyze": ["analyze", str(model_dir), "--data", str(world["corpus"]), "--out", str(tmp_path / "out")],
            "finetune": ["finetune", str(model_dir), "--set", f"out_dir={tmp_path / 'out'}", "--set",
                         f"data.source={world['corpus']}", "--set", "train.seq_len=16", "--set",
                         "train.batch_size=2", "--set", "train.steps=2"]}[command]


# generate and lm-eval: bad input (InputError, exit 2); analyze and finetune: a checkpoint that does not
# fit its model (CheckpointError, exit 1), as each already says of corrupt weights
EXIT = {"generate": 2, "lm-eval": 2, "analyze": 1, "finetune": 1}


@pytest.mark.parametrize("command", list(EXIT))
@pytest.mark.parametrize("kind", list(SPOILS))
def test_every_command_refuses_a_tensor_that_does_not_fit_in_one_line_naming_it(
        world, tmp_path, monkeypatch, capsys, command, kind):
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(transformers.utils.logging, "_tqdm_active", False)
    spoil, message = SPOILS[kind]
    model_dir = spoiled(world, tmp_path, spoil)
    capsys.readouterr()
    code = main(command_line(command, model_dir, world, tmp_path))
    err = capsys.readouterr().err
    prefix = f"attnres {command}: error: "
    assert code == EXIT[command], err
    assert err.startswith(prefix) and err.count("\n") == 1, err
    assert re.search(message, err), f"{message!r} not in {err!r}"
    assert str(model_dir) in err
    assert not (tmp_path / "out").exists()  # nothing written


def test_a_missing_router_query_takes_the_methods_zero_init_in_every_command(world, tmp_path):
    """The one exception, as conversion from a standard model relies on it: a routing parameter that is
    absent keeps the method's initialisation (a zero query: the uniform average), identically in the
    transformers load (`generate`, `lm-eval`) and in `analyze` / `finetune`'s."""
    model_dir = spoiled(world, tmp_path, drop("model.residual.routers.1.query"))
    check_model_dir(model_dir)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    assert torch.equal(loaded.model.residual.routers[1].query, torch.zeros_like(loaded.model.residual.routers[1].query))
    ours = AttnResLM(ModelConfig.from_hf_dict(loaded.config.to_dict()))
    assert load_initial_weights(ours, model_dir) == ["residual.routers.1.query"]
    for name, tensor in ours.state_dict().items():
        torch.testing.assert_close(tensor, loaded.model.state_dict()[name], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["model", "tied"])
def test_whole_directories_pass_and_load_the_same_weights(world, name):
    """No false refusal: save_pretrained output (untied and tied: lm_head.weight written or not) passes
    the header check, and both loads give the same tensors."""
    model_dir = world[name]
    check_model_dir(model_dir)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    ours = AttnResLM(ModelConfig.from_hf_dict(loaded.config.to_dict()))
    assert load_initial_weights(ours, model_dir) == []
    for key, tensor in ours.state_dict().items():
        assert torch.equal(tensor, loaded.model.state_dict()[key]), key


def test_a_training_checkpoint_passes_and_a_spoiled_one_is_refused(tmp_path, monkeypatch):
    """Training checkpoints name tensors without the `model.` prefix (save_model of AttnResLM), tied."""
    from tests.train.conftest import tiny_run
    import yaml

    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(1)
    for i in range(20):
        (corpus / f"d{i:02d}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(150)))
    run = tiny_run(corpus, tmp_path / "run", steps=1, checkpoint_every=1, eval_every=1, eval_batches=1,
                   batch_size=2, seq_len=16)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
    assert main(["train", "--config", str(tmp_path / "run.yaml")]) == 0
    checkpoint = tmp_path / "run" / "checkpoints" / "step_00000001"
    check_model_dir(checkpoint)
    copy = tmp_path / "copy"
    shutil.copytree(checkpoint, copy)
    edit_weights(copy, lambda t: t.pop("norm.weight"))
    with pytest.raises(InputError, match=r"weights do not fit the model its config\.json describes: missing "
                                         r"norm\.weight; convert the model again"):
        check_model_dir(copy)


def test_pytorch_model_bin_weights_are_checked_too(world, tmp_path):
    """A directory with pytorch_model.bin instead of safetensors (transformers loads it as well)."""
    model_dir = tmp_path / "bin"
    shutil.copytree(world["model"], model_dir)
    tensors = load_file(str(model_dir / WEIGHTS))
    (model_dir / WEIGHTS).unlink()
    torch.save(tensors, model_dir / "pytorch_model.bin")
    check_model_dir(model_dir)
    del tensors["model.norm.weight"]
    torch.save(tensors, model_dir / "pytorch_model.bin")
    with pytest.raises(InputError, match=r"do not fit the model its config\.json describes: missing norm\.weight;"):
        check_model_dir(model_dir)
    (model_dir / "pytorch_model.bin").write_bytes(b"not a pickle")
    with pytest.raises(InputError, match=r"its pytorch_model\.bin weights cannot be read"):
        check_model_dir(model_dir)
