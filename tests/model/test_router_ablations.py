"""The router ablations in the whole model (method §7; the options query, weights and key_norm of
ModelConfig.residual_options): valid for every routed variant, refused by name elsewhere; at initialisation the
input-dependent query and raw keys leave the model unchanged; they train, run under bf16 autocast
and torch.compile, save and load, and decode like the eager model.
"""

import copy

import pytest
import torch

from attnres import AttnResLM, ConfigError, ModelConfig
from attnres.common.errors import InputError
from attnres.report.variant_names import variant_name
from attnres.generation.fast_generator import FastGenerator
from attnres.residual import VARIANTS, check_routing
from attnres.methods import Router
from tests.helpers import activate_routing, options_of, train_losses
from tests.generation.test_fast_generator import eager_greedy, prompt

ROUTED = [(name, 3 if v.uses_blocks else None) for name, v in VARIANTS.items()
          if v.mode != "none" and issubclass(v.mixer, Router)]
ABLATIONS = [dict(query="input_dependent"), dict(weights="sigmoid"), dict(key_norm=False)]
ABLATION_IDS = ["input_query", "sigmoid", "raw_keys"]
VOCAB = 64


def config(residual="full_attnres", num_blocks=None, **options):
    return ModelConfig(vocab_size=VOCAB, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2,
                       intermediate_size=48, residual=residual,
                       residual_options=options_of(num_blocks=num_blocks, **options), max_seq_len=96,
                       tie_embeddings=False)


def active_model(residual, num_blocks, ablation, seed=0):
    torch.manual_seed(seed)
    model = AttnResLM(config(residual, num_blocks, **ablation)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1 and not any(p is r for r in model.residual.parameters()):
                p.mul_(8.0)  # logits far from ties, as in the generation tests
    activate_routing(model.routers)
    return model


def ids(batch=2, length=9, seed=3):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("residual, num_blocks", ROUTED)
@pytest.mark.parametrize("ablation", [ABLATIONS[0], ABLATIONS[2]], ids=["input_query", "raw_keys"])
def test_at_initialisation_the_model_is_the_method_model(residual, num_blocks, ablation):
    torch.manual_seed(0)
    method = AttnResLM(config(residual, num_blocks)).set_routing("reference")
    torch.manual_seed(0)
    ablated = AttnResLM(config(residual, num_blocks, **ablation))
    missing, unexpected = ablated.load_state_dict(method.state_dict(), strict=False)
    assert all(".query_proj" in name for name in missing) and all(".key_norm." in name for name in unexpected)
    x = ids()
    with torch.no_grad():
        assert torch.equal(ablated(x).logits, method(x).logits)
    extra = sum(p.numel() for p in ablated.parameters()) - sum(p.numel() for p in method.parameters())
    per_router = 32 * 32 if "query" in ablation else -32  # W_q (D, D), or no key gain (D,)
    assert extra == per_router * len(method.routers)


@pytest.mark.parametrize("residual, num_blocks", ROUTED)
def test_sigmoid_routing_at_initialisation_halves_every_source(residual, num_blocks):
    torch.manual_seed(0)
    model = AttnResLM(config(residual, num_blocks, weights="sigmoid"))
    out = model(ids(), return_routing=True)
    for weights in out.routing:
        assert torch.equal(weights, torch.full_like(weights, 0.5))


@pytest.mark.parametrize("residual, num_blocks", ROUTED)
@pytest.mark.parametrize("ablation", ABLATIONS, ids=ABLATION_IDS)
def test_every_routed_variant_trains_with_every_ablation(residual, num_blocks, ablation):
    torch.manual_seed(0)
    model = AttnResLM(config(residual, num_blocks, **ablation))
    batch = ids(4, 16)
    if "query" in ablation:
        model(batch, labels=batch).loss.backward()
        # the zero map's gradient is d q (x) unit_rms(x_s): non-zero wherever a router has two sources
        names = model.residual.source_names()
        grads = [r.query_proj.grad for r, seen in zip(model.routers, names) if len(seen) > 1]
        assert grads and all(g is not None and torch.count_nonzero(g) > 0 for g in grads)
        model.zero_grad()
    losses = train_losses(model, batch, 8)
    assert losses[-1] < losses[0] - 0.3


@pytest.mark.parametrize("ablation", ABLATIONS, ids=ABLATION_IDS)
def test_bf16_autocast_stays_close_to_fp32_and_routes_in_fp32(ablation):
    torch.manual_seed(0)
    model = AttnResLM(config("block_attnres", 3, **ablation)).eval()
    activate_routing(model.routers)
    with torch.no_grad():  # routing of moderate sharpness: a near-tie would amplify any rounding
        for router in model.routers:
            router.query.mul_(0.2)
    x = ids()
    with torch.no_grad():
        fp32 = model(x, return_routing=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = model(x, return_routing=True)
    assert all(w.dtype == torch.float32 for w in bf16.routing)
    for low, high in zip(bf16.routing, fp32.routing):
        assert (low - high).abs().max() < 0.05  # the sub-layers' bf16 rounding moves weights a little
    # bf16 keeps 8 bits of mantissa: a few percent of the logits' spread
    assert (bf16.logits.float() - fp32.logits).abs().max() < 0.05 * fp32.logits.abs().max()


def test_ablations_are_refused_where_they_mean_nothing_with_the_field_named():
    with pytest.raises(ConfigError, match=r"ModelConfig.residual_options: unknown option\(s\) \['query'\] "
                                          r"of residual='standard'; its options: \[\]"):
        config("standard", query="input_dependent")
    routed = r"\['full_attnres', 'block_attnres', 'delta_attnres', 'delta_block'\]"
    # a YAML `model:` section or a config written before the options were typed: the old names
    with pytest.raises(ConfigError, match=rf"ModelConfig.router_query applies only to residual in {routed}"):
        ModelConfig.from_dict({**config("standard").to_dict(), "router_query": "input_dependent"})
    with pytest.raises(ConfigError, match=rf"ModelConfig.router_key_norm applies only to residual in {routed}"):
        ModelConfig.from_dict({**config("standard").to_dict(), "router_key_norm": False})
    with pytest.raises(ConfigError, match=r"ModelConfig.residual_options.weights must be one of "
                                          r"\['softmax', 'sigmoid'\]"):
        config(weights="relu")
    with pytest.raises(ConfigError, match=r"ModelConfig.residual_options.key_norm must be True or False, got .yes."):
        config(key_norm="yes")
    # the fast paths serve the method's router only: routing_impl (a run setting) is refused by name
    sigmoid = config(weights="sigmoid")
    with pytest.raises(InputError, match=r"routing_impl must be one of \['auto', 'reference'\], got 'lean'"):
        AttnResLM(sigmoid).set_routing("lean")
    with pytest.raises(InputError, match=r"train.routing_impl='lean'.*allowed values: \['auto', 'reference'\]"):
        check_routing(sigmoid.residual, sigmoid.residual_options, sigmoid.num_layers, "lean", prefix="train.")
    model = AttnResLM(sigmoid).set_routing("reference")
    assert model.config.residual_options.weights == "sigmoid" and model.residual.impl == "reference"


def test_variant_names_say_which_ablation():
    assert variant_name(config(query="input_dependent").to_dict()) == "full_attnres [input query]"
    fields = config("block_attnres", 3, weights="sigmoid", key_norm=False).to_dict()
    assert variant_name(fields) == "block_attnres (N=3) [sigmoid] [no key norm]"


@pytest.mark.parametrize("residual, num_blocks", ROUTED)
@pytest.mark.parametrize("ablation", ABLATIONS, ids=ABLATION_IDS)
def test_the_fixed_shape_decode_step_decodes_like_the_eager_model(residual, num_blocks, ablation):
    model = active_model(residual, num_blocks, ablation)
    expected = eager_greedy(model, prompt(), 14)
    assert len(set(expected[:, 6:].flatten().tolist())) >= 4  # not one repeated token
    assert FastGenerator(model, compile=False).generate(prompt(), 14).sequences.tolist() == expected.tolist()


def test_hugging_face_round_trip_and_cached_generate(tmp_path):
    transformers = pytest.importorskip("transformers")
    from attnres.hf import AttnResConfig, AttnResForCausalLM

    hf_config = AttnResConfig.from_model_config(
        config("delta_block", 3, query="input_dependent", weights="sigmoid", key_norm=False))
    torch.manual_seed(0)
    model = AttnResForCausalLM(hf_config).eval()
    activate_routing(model.model.routers)
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.to_model_config() == model.config.to_model_config()
    options = loaded.config.residual_options
    assert options["query"] == "input_dependent" and options["key_norm"] is False
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    x = ids()
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, model(x).logits)
    start = ids(1, 5)
    generated = loaded.generate(start, max_new_tokens=8, do_sample=False, use_cache=True)
    seq = start
    with torch.no_grad():
        for _ in range(8):
            seq = torch.cat([seq, loaded(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(generated, seq)


@pytest.mark.compile
@pytest.mark.parametrize("ablation", ABLATIONS, ids=ABLATION_IDS)
def test_torch_compile_fullgraph_equals_eager_forward_and_backward(ablation):
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = AttnResLM(config("full_attnres", **ablation))
    activate_routing(eager.routers)
    compiled_model = copy.deepcopy(eager)
    # aot_eager traces forward and backward as inductor does, without its code generation (whose
    # fused kernels reorder fp32 sums), so eager and compiled agree to rounding.
    compiled = torch.compile(compiled_model, fullgraph=True, backend="aot_eager")
    x = ids()
    loss = eager(x, labels=x).loss
    loss.backward()
    compiled_loss = compiled(x, labels=x).loss
    compiled_loss.backward()
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), compiled_model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.compile
def test_the_compiled_decode_step_is_one_graph_with_every_ablation_at_once():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    model = active_model("block_attnres", 3, dict(query="input_dependent", weights="sigmoid", key_norm=False))
    counter = CompileCounterWithBackend("aot_eager")
    result = FastGenerator(model, backend=counter).generate(prompt(), 12)  # fullgraph=True
    assert result.sequences.tolist() == eager_greedy(model, prompt(), 12).tolist()
    assert counter.frame_count == 1
