"""Hyper-connections and mHC as residual variants (method §7.3): their configuration, the start
the papers give, the recomputing fast path against the reference one, what they refuse, and the
causal check over streams. The logits against an independent float64 reference are in
test_variants.py; compile, cache, Hugging Face and analysis take them from the variant table."""

import pytest
import torch

from attnres import AttnResLM, ConfigError, ModelConfig
from attnres.common.errors import InputError
from attnres.analysis.causal import collect_causal_routing
from attnres.distributed.pipeline_layout import PipelineConfig, PipelineConfigError, build_layout
from attnres.report.variant_names import variant_name
from attnres.methods.hyper_connections import HyperConnectionOptions
from attnres.methods.mhc import ManifoldHyperConnectionOptions
from attnres.methods.options import VariantOptions
from attnres.train.train_config import TrainConfig
from attnres.train.run_config import RunConfig, RunConfigError
from attnres.train.memory import measure_step_memory
from tests.helpers import activate_routing, train_losses


SHAPE = dict(vocab_size=64, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2, intermediate_size=64,
             max_seq_len=32)


def config(residual="hyper_connections", residual_options=None, **fields):
    return ModelConfig(**{**SHAPE, **fields}, residual=residual, residual_options=residual_options)


def test_defaults_are_the_papers_and_apply_only_where_they_mean_something():
    hc, mhc, std = config(), config("mhc"), config("standard")
    assert hc.residual_options == HyperConnectionOptions(streams=4, dynamic=True)
    assert hc.residual_options.to_dict() == {"streams": 4, "dynamic": True}
    assert mhc.residual_options == ManifoldHyperConnectionOptions(streams=4, sinkhorn_iters=20)
    assert mhc.residual_options.to_dict() == {"streams": 4, "sinkhorn_iters": 20}
    assert type(std.residual_options) is VariantOptions and std.residual_options.to_dict() == {}
    assert ModelConfig(**hc.to_dict()) == hc  # resolved values round-trip
    model = AttnResLM(config(residual_options={"streams": 3}))
    assert model.residual.source_names() == [["h1", "h2", "h3"]] * 7
    assert variant_name({"residual": "hyper_connections", "hc_dynamic": False}) == "hyper_connections [static]"
    assert variant_name({"residual": "hyper_connections", "residual_options": {"dynamic": False}}) \
        == "hyper_connections [static]"
    assert variant_name(mhc.to_dict()) == "mhc"
    assert variant_name(config("mhc", {"streams": 2}).to_dict()) == "mhc (n=2)"


@pytest.mark.parametrize("residual, options, match", [
    ("standard", {"streams": 4}, r"ModelConfig.residual_options: unknown option\(s\) \['streams'\] of "
                                 r"residual='standard'; its options: \[\]"),
    ("mhc", {"dynamic": False}, r"ModelConfig.residual_options: unknown option\(s\) \['dynamic'\] of "
                                r"residual='mhc'; its options: \['streams', 'sinkhorn_iters'\]"),
    ("hyper_connections", {"sinkhorn_iters": 5}, r"unknown option\(s\) \['sinkhorn_iters'\] of "
                                                 r"residual='hyper_connections'; its options: \['streams', 'dynamic'\]"),
    ("hyper_connections", {"streams": 0}, r"ModelConfig.residual_options.streams must be a positive integer"),
    ("hyper_connections", {"dynamic": "yes"}, r"ModelConfig.residual_options.dynamic"),
    ("hyper_connections", {"weights": "sigmoid"}, r"unknown option\(s\) \['weights'\] of "
                                                  r"residual='hyper_connections'"),
])
def test_bad_settings_fail_at_construction_by_name(residual, options, match):
    with pytest.raises(ConfigError, match=match):
        config(residual, options)


@pytest.mark.parametrize("fields, match", [
    (dict(residual="standard", hc_streams=4), r"ModelConfig.hc_streams applies only to residual in "
                                              r"\['hyper_connections', 'mhc'\]; leave it unset"),
    (dict(residual="mhc", hc_dynamic=False), r"ModelConfig.hc_dynamic applies only to residual in \['hyper_connections'\]"),
    (dict(hc_sinkhorn_iters=5), r"ModelConfig.hc_sinkhorn_iters applies only to residual in \['mhc'\]"),
    (dict(hc_streams=0), r"ModelConfig.residual_options.streams must be a positive integer"),
    (dict(hc_dynamic="yes"), r"ModelConfig.residual_options.dynamic"),
    (dict(router_weights="sigmoid"), r"ModelConfig.router_weights applies only to residual in \['full_attnres', "
                                     r"'block_attnres', 'delta_attnres', 'delta_block'\]"),
])
def test_bad_flat_fields_fail_by_name(fields, match):
    """The fields written before the options were typed (from_dict: YAML `model:` sections, old result
    files) are checked the same way, by their old names."""
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_dict({**SHAPE, "residual": "hyper_connections", **fields})


@pytest.mark.parametrize("settings, match", [
    (dict(routing_impl="fused"), r"routing_impl='fused'.*allowed values: \['auto', 'reference', 'lean'\]"),
    (dict(routing_chunk_size=2), r"routing_chunk_size applies only to"),
])
def test_bad_routing_settings_fail_by_name(settings, match):
    """How routing is computed is a run setting: a run's train section is checked against the variant
    (RunConfig), and a model's `set_routing` refuses what it cannot use."""
    with pytest.raises(RunConfigError, match="train." + match):
        RunConfig(model={**SHAPE, "residual": "hyper_connections"}, train=TrainConfig(seq_len=16, **settings))
    impl, chunk = settings.get("routing_impl", "auto"), settings.get("routing_chunk_size")
    with pytest.raises(InputError, match=r"routing_impl must be one of \['auto', 'reference', 'lean'\], got 'fused'"
                       if impl == "fused" else match):
        AttnResLM(config()).set_routing(impl, chunk)


def sublayer_inputs(model, ids):
    """Every sub-layer's input h_s (what its norm reads) and the final hidden state."""
    seen = []
    for layer in model.layers:
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    model.norm.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    with torch.no_grad():
        model(ids)
    return seen


@pytest.mark.parametrize("dynamic", [True, False])
def test_hyper_connections_start_as_the_standard_residual(dynamic):
    """Zhu et al.'s initialisation: every sub-layer input is the standard one bit for bit, and the
    final sum of the n streams is n times the standard hidden state (the final norm removes the
    factor up to its eps)."""
    torch.manual_seed(0)
    standard = AttnResLM(config("standard", init_std=0.2))
    hc = AttnResLM(config(residual_options={"dynamic": dynamic}, init_std=0.2))
    hc.load_state_dict(standard.state_dict(), strict=False)
    ids = torch.randint(0, 64, (2, 9))
    got, expected = sublayer_inputs(hc, ids), sublayer_inputs(standard, ids)
    assert all(torch.equal(a, b) for a, b in zip(got[:-1], expected[:-1]))
    torch.testing.assert_close(got[-1], 4 * expected[-1], rtol=1e-6, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(hc(ids).logits, standard(ids).logits, rtol=1e-5, atol=1e-5)


def zero_projections(model):
    with torch.no_grad():
        for mixer in model.routers:
            mixer.fn.zero_()


def test_mhc_with_zero_projections_is_the_standard_residual_up_to_its_eps():
    """fn = 0 (not the default start, which draws fn): a_pre = 1/2 + eps reads n/2 times the stream,
    which the sub-layer norm removes; A_res = 1/n keeps equal streams equal. In float64 with a tiny
    norm eps, mHC's own eps (hc_eps, 1e-6: column sums 1 - O(eps)) is the only difference: with it
    set to 0 the logits agree to 1e-10."""
    torch.manual_seed(0)
    standard = AttnResLM(config("standard", init_std=0.2, norm_eps=1e-12)).double()
    mhc = AttnResLM(config("mhc", init_std=0.2, norm_eps=1e-12)).double()
    mhc.load_state_dict(standard.state_dict(), strict=False)
    zero_projections(mhc)
    ids = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        expected, got = standard(ids).logits, mhc(ids).logits
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)  # measured 1.2e-5
        for mixer in mhc.routers:
            mixer.hc_eps = 0.0
        torch.testing.assert_close(mhc(ids).logits, expected, rtol=0, atol=1e-10)
    activate_routing(mhc.routers)
    with torch.no_grad():
        assert (mhc(ids).logits - expected).abs().max() > 1e-2  # guards the test


@pytest.mark.parametrize("residual", ["hyper_connections", "mhc"])
def test_lean_path_equals_the_reference_and_saves_less(residual):
    """routing_impl "lean" (and "auto") project the raw streams and collapse by a matrix product: the
    same loss and gradients as "reference" (float64), with fewer bytes saved for backward (no
    normalised copy of the streams; measured at this size: 0.76x for hyper-connections, 0.92x for
    mHC, whose Sinkhorn iterations weigh most at D = 32)."""
    torch.manual_seed(0)
    reference = AttnResLM(config(residual)).set_routing("reference").double()
    activate_routing(reference.routers)
    lean = AttnResLM(reference.config).set_routing("lean").double()
    lean.load_state_dict(reference.state_dict())
    ids = torch.randint(0, 64, (2, 11))
    results = []
    for model in (reference, lean):
        loss = model(ids, labels=ids).loss
        loss.backward()
        results.append((loss, {n: p.grad for n, p in model.named_parameters()}))
    (loss, grads), (lean_loss, lean_grads) = results
    torch.testing.assert_close(lean_loss, loss, rtol=1e-12, atol=1e-12)
    for name in grads:
        torch.testing.assert_close(lean_grads[name], grads[name], rtol=1e-10, atol=1e-12, msg=name)
    saved = [measure_step_memory(model.float(), ids, "fp32")["activation_bytes"] for model in (reference, lean)]
    assert saved[1] < 0.95 * saved[0], saved


def test_pipeline_stages_refuse_the_streams_by_name():
    with pytest.raises(PipelineConfigError, match=r"residual='mhc' keeps 4 residual streams"):
        build_layout(config("mhc", num_layers=4), PipelineConfig(microbatch_size=1, seq_len=8), 2)


def test_the_causal_check_ablates_one_stream_at_one_mixer():
    """Zero output projections: the streams are copies of the embedding at every mixer, so ablating
    one stream at a mixer changes the loss only through that mixer's read."""
    torch.manual_seed(0)
    model = AttnResLM(config("mhc"))
    activate_routing(model.routers)
    batches = [torch.randint(0, 64, (2, 9))]
    clean, results = collect_causal_routing(model, batches, routers=[0, len(model.routers) - 1])
    assert [r.router for r in results] == [0, len(model.routers) - 1]
    for r in results:
        assert r.source_names == ["h1", "h2", "h3", "h4"]
        assert any(abs(v) > 1e-4 for v in r.effect["zero"])


@pytest.mark.parametrize("residual", ["hyper_connections", "mhc"])
def test_bf16_autocast_is_close_to_fp32_and_trains(residual):
    """Under bf16 autocast the sub-layers compute in bf16 and the streams stay fp32: logits within
    bf16's precision of the fp32 ones, and a training step's gradients finite and non-zero."""
    torch.manual_seed(0)
    model = AttnResLM(config(residual))
    activate_routing(model.routers)
    ids = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        expected = model(ids).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = model(ids).logits
    assert (got.float() - expected).abs().max() < 0.05 * expected.abs().max()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(ids, labels=ids).loss
    loss.backward()
    grads = [p.grad for p in model.residual.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


def stream_spread(model, ids):
    """How far apart the mixers' read weights are across the n streams: max over mixers and tokens."""
    with torch.no_grad():
        routing = model(ids, return_routing=True).routing
    return max(float((w - w.mean(-1, keepdim=True)).abs().max()) for w in routing)


@pytest.mark.parametrize("zero_fn", [False, True], ids=["default-init", "zero-projections"])
def test_the_default_mhc_start_breaks_the_symmetry_of_equal_streams(zero_fn):
    """Why mHC draws its projections: from fn = 0 the n equal streams get equal coefficients and
    equal gradients, and stay equal through training; from the default start they part."""
    torch.manual_seed(0)
    model = AttnResLM(config("mhc"))
    if zero_fn:
        zero_projections(model)
    batch = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    train_losses(model, batch, 10)
    spread = stream_spread(model, batch)
    assert spread < 1e-5 if zero_fn else spread > 1e-2
