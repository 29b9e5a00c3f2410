"""attnres in transformers: Auto classes, save/load round trip, generate with a KV cache."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnres.hf  # noqa: E402  (registers the Auto classes)
from attnres import ConfigError  # noqa: E402
from attnres.hf import AttnResConfig, AttnResForCausalLM  # noqa: E402
from tests.helpers import activate_routing, options_of  # noqa: E402

VARIANTS = [("standard", None, None), ("full_attnres", None, None), ("block_attnres", 2, None),
            ("delta_attnres", None, None), ("delta_block", 2, "gate"), ("delta_block", 2, "partial"),
            ("denseformer", None, None), ("hyper_connections", None, None), ("mhc", None, None)]


def tiny(residual="standard", num_blocks=None, exact=None, tie=True, seed=0):
    torch.manual_seed(seed)
    config = AttnResConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=48, residual=residual,
                           residual_options=options_of(num_blocks=num_blocks, exact_conversion=exact),
                           tie_word_embeddings=tie, max_position_embeddings=64)
    model = AttnResForCausalLM(config).eval()
    activate_routing(model.model.routers)
    return model


@pytest.mark.parametrize("residual, num_blocks, exact", VARIANTS)
@pytest.mark.parametrize("tie", [True, False])
def test_save_pretrained_from_pretrained_round_trip_is_exact(tmp_path, residual, num_blocks, exact, tie):
    model = tiny(residual, num_blocks, exact, tie)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "config.json").is_file()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, AttnResForCausalLM)
    assert loaded.config.residual == residual and loaded.config.residual_options.get("num_blocks") == num_blocks
    assert loaded.config.residual_options.get("exact_conversion") == exact
    assert transformers.AutoConfig.from_pretrained(tmp_path).to_model_config() == model.config.to_model_config()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    ids = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


@pytest.mark.parametrize("residual, num_blocks, exact", VARIANTS)
def test_greedy_generate_with_cache_equals_stepwise_argmax_without(residual, num_blocks, exact):
    model = tiny(residual, num_blocks, exact)
    prompt = torch.randint(0, 64, (1, 5))
    generated = model.generate(prompt, max_new_tokens=8, do_sample=False, use_cache=True)
    ids = prompt
    with torch.no_grad():
        for _ in range(8):  # no cache: the whole sequence every step
            next_id = model(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, next_id], dim=1)
    assert torch.equal(generated, ids)


def test_forward_returns_loss_cache_and_routing():
    model = tiny("block_attnres", 2)
    ids = torch.randint(0, 64, (2, 6))
    out = model(ids, labels=ids, return_routing=True)
    assert out.loss is not None and out.cache.get_seq_length() == 6
    assert len(out["routing"]) == len(model.model.routers)


def test_bad_configs_are_refused():
    """(Padded batches are supported: tests/hf/test_padding.py.)"""
    with pytest.raises(ConfigError, match="ModelConfig.residual must be one of"):
        AttnResConfig(residual="attnres")
    with pytest.raises(ConfigError, match="num_blocks is required"):
        AttnResConfig(residual="delta_block")


def test_a_training_checkpoint_loads_with_from_pretrained(tmp_path, monkeypatch):
    """`attnres train` writes config.json into each checkpoint; transformers loads it as is."""
    from tests.train.conftest import tiny_run

    from attnres.train import RunConfig, train

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(40):
        (corpus / f"d{i}.txt").write_text(" ".join(f"word{(i * 7 + j) % 50} the of and" for j in range(60)))
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))
    result = train(RunConfig.from_dict(tiny_run(corpus, tmp_path / "run", steps=2, checkpoint_every=2)))
    checkpoint = tmp_path / "run" / "checkpoints" / "step_00000002"
    loaded = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    ids = torch.randint(0, result.model.config.vocab_size, (1, 10))
    result.model.eval()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, result.model(ids).logits)


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("bias", [False, True])
def test_one_initialisation_path_same_seed_same_weights(tie, bias):
    """AttnResForCausalLM initialises through AttnResLM's own path: built from the same seed, the two
    hold identical tensors (transformers' post_init draws nothing again), biases and gates zero."""
    from attnres import AttnResLM

    config = AttnResConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=48, residual="delta_block",
                           residual_options={"num_blocks": 2, "exact_conversion": "gate"}, tie_word_embeddings=tie,
                           attention_bias=bias)
    torch.manual_seed(5)
    plain = AttnResLM(config.to_model_config())
    torch.manual_seed(5)
    wrapped = AttnResForCausalLM(config).model
    assert plain.state_dict().keys() == wrapped.state_dict().keys()
    for name, tensor in plain.state_dict().items():
        assert torch.equal(wrapped.state_dict()[name], tensor), name
    assert tensor.abs().sum() > 0  # a real draw, not zeros everywhere
    biases = [p for n, p in plain.named_parameters() if n.endswith("bias")]
    assert len(biases) == (6 if bias else 0) and all(not b.any() for b in biases)
    assert all(r.gate.item() == 0 and not r.query.any() for r in plain.routers)


def test_from_pretrained_initialises_what_a_standard_checkpoint_lacks(tmp_path):
    """Routers missing from a checkpoint get method §2's initialisation through _init_weights."""
    standard = tiny("standard")
    standard.save_pretrained(tmp_path)
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    config.residual, config.residual_options = "delta_block", {"num_blocks": 2, "exact_conversion": "gate"}
    model = AttnResForCausalLM.from_pretrained(tmp_path, config=config).eval()
    assert all(r.gate.item() == 0 and not r.query.any() and bool((r.key_norm.weight == 1).all())
               for r in model.model.routers)
    ids = torch.randint(0, 64, (2, 9))
    with torch.no_grad():  # the gate at zero: the converted model is the standard one
        assert torch.allclose(model(ids).logits, standard(ids).logits, atol=1e-6)


def test_forward_refuses_what_it_does_not_do_and_misspelt_keywords():
    model = AttnResForCausalLM(AttnResConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                                             intermediate_size=64, residual="block_attnres",
                                             residual_options={"num_blocks": 2})).eval()
    ids = torch.randint(0, 64, (2, 5))
    with pytest.raises(TypeError, match="lables"):
        model(ids, lables=ids)  # a misspelt keyword is not silently ignored
    with pytest.raises(ValueError, match="output_hidden_states"):
        model(ids, output_hidden_states=True)
    with pytest.raises(ValueError, match="inputs_embeds"):
        model(inputs_embeds=torch.zeros(2, 5, 32))
    full = model(ids, cache_position=torch.arange(5), return_dict=True, output_attentions=False).logits
    assert torch.equal(model(ids, logits_to_keep=1).logits, full[:, -1:])
