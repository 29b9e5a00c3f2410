"""The mixture-of-experts feed-forward (attnres.model.moe) equals transformers' own blocks in float64,
outputs and gradients: Kimi Linear's sigmoid, grouped, biased, scaled form (`KimiLinearMoE`) and
Qwen3-MoE's softmax top-k form (`Qwen3MoeSparseMoeBlock`), at several shapes; bad configurations
fail at construction, naming the field."""

import pytest
import torch

from attnres.common.errors import InputError
from attnres.model.moe import MixtureOfExperts, MoEConfig
from tests.helpers import kimi_linear_in_float64, reference_in_float64

transformers = pytest.importorskip("transformers")
from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearMoE  # noqa: E402
from transformers.models.qwen3_moe import modeling_qwen3_moe  # noqa: E402
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock  # noqa: E402

KIMI_SHAPES = [  # (hidden, expert width, experts, top-k, shared, groups, groups per token, normalise)
    (16, 8, 8, 2, 1, 1, 1, True),
    (12, 6, 16, 4, 2, 4, 2, True),
    (8, 4, 6, 3, 1, 3, 3, False),
]
QWEN_SHAPES = [(16, 8, 8, 2, True), (12, 10, 6, 3, False), (8, 4, 4, 4, True)]


def randomise(module: torch.nn.Module, seed: int) -> None:
    """Every parameter and buffer random (the references start with zero routers and biases)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            tensor.copy_(torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype) * 0.5)


def assert_same_outputs_and_gradients(ours, reference, names: dict, hidden: int, seed: int = 0):
    """Load the reference's weights into ours (names: our name -> theirs), then compare the output
    and the gradients of the input and of every parameter for a (3, 5, hidden) float64 input."""
    theirs = reference.state_dict()
    ours.load_state_dict({name: theirs[names.get(name, name)] for name in ours.state_dict()})
    x = torch.randn(3, 5, hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    x_ours, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours, y_ref = ours(x_ours), reference(x_ref)
    torch.testing.assert_close(y_ours, y_ref, rtol=1e-12, atol=1e-12)
    weight = torch.randn_like(y_ref)  # a loss that reaches every output value differently
    (y_ours * weight).sum().backward()
    (y_ref * weight).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_ref.grad, rtol=1e-12, atol=1e-12)
    reference_parameters = dict(reference.named_parameters())
    for name, parameter in ours.named_parameters():
        torch.testing.assert_close(parameter.grad, reference_parameters[names.get(name, name)].grad,
                                   rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.parametrize("hidden, width, experts, k, shared, groups, per_token, normalise", KIMI_SHAPES)
def test_kimi_linear_moe_in_float64(hidden, width, experts, k, shared, groups, per_token, normalise, monkeypatch):
    kimi_linear_in_float64(monkeypatch)  # its router casts to fp32; ours computes a float64 model's in float64
    config = transformers.KimiLinearConfig(
        hidden_size=hidden, moe_intermediate_size=width, num_local_experts=experts, num_experts_per_tok=k,
        n_shared_experts=shared, n_group=groups, topk_group=per_token, norm_topk_prob=normalise,
        routed_scaling_factor=2.446, experts_implementation="eager")
    reference = KimiLinearMoE(config).double()
    randomise(reference, seed=experts)
    ours = MixtureOfExperts(hidden, MoEConfig(
        num_experts=experts, experts_per_token=k, expert_size=width, shared_experts=shared, scoring="sigmoid",
        normalize_top_k=normalise, routed_scale=2.446, num_groups=groups, groups_per_token=per_token,
        score_bias=True, router_numerics="deepseek")).double()
    assert_same_outputs_and_gradients(ours, reference, {"gate.score_bias": "gate.e_score_correction_bias"}, hidden)


@pytest.mark.parametrize("hidden, width, experts, k, normalise", QWEN_SHAPES)
def test_qwen3_moe_sparse_block_in_float64(hidden, width, experts, k, normalise, monkeypatch):
    reference_in_float64(monkeypatch, modeling_qwen3_moe)
    config = transformers.Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=width, num_experts=experts,
                                         num_experts_per_tok=k, norm_topk_prob=normalise,
                                         experts_implementation="eager")
    reference = Qwen3MoeSparseMoeBlock(config).double()
    randomise(reference, seed=experts)
    ours = MixtureOfExperts(hidden, MoEConfig(num_experts=experts, experts_per_token=k, expert_size=width,
                                              scoring="softmax", normalize_top_k=normalise,
                                              router_numerics="qwen3")).double()
    assert_same_outputs_and_gradients(ours, reference, {}, hidden)


def test_the_score_bias_picks_experts_and_never_weighs_them():
    config = MoEConfig(num_experts=4, experts_per_token=1, expert_size=4, scoring="sigmoid", score_bias=True,
                       normalize_top_k=False)
    moe = MixtureOfExperts(8, config).double()
    randomise(moe, seed=0)
    x = torch.randn(6, 8, dtype=torch.float64)
    with torch.no_grad():
        moe.gate.score_bias.zero_()
        moe.gate.score_bias[2] = 10.0  # expert 2 wins every choice
        weights, experts, scores = moe.gate(x)
    assert experts.flatten().tolist() == [2] * 6
    torch.testing.assert_close(weights[:, 0], scores[:, 2].to(weights.dtype))  # weighed by its score alone


def test_dispatch_sorts_by_expert_and_matches_a_loop_over_tokens():
    moe = MixtureOfExperts(8, MoEConfig(num_experts=5, experts_per_token=2, expert_size=6)).double()
    randomise(moe, seed=3)
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    flat = x.reshape(-1, 8)
    weights, experts, _ = moe.gate(flat)
    expected = torch.zeros_like(flat)
    for t in range(flat.shape[0]):  # the naive form: every token through its experts, one at a time
        for j in range(2):
            e = experts[t, j]
            gate, up = (moe.experts.gate_up_proj[e] @ flat[t]).chunk(2)
            expected[t] += weights[t, j] * (moe.experts.down_proj[e] @ (torch.nn.functional.silu(gate) * up))
    torch.testing.assert_close(moe(x).reshape(-1, 8), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fields, named", [
    ({"num_experts": 0}, "MoEConfig.num_experts"),
    ({"scoring": "relu"}, "MoEConfig.scoring"),
    ({"router_numerics": "fp32"}, "MoEConfig.router_numerics"),
    ({"num_groups": 3}, "MoEConfig.num_groups must divide num_experts=8"),
    ({"num_groups": 8}, "MoEConfig.num_groups must divide num_experts=8 and leave at least 2 experts per group"),
    ({"num_groups": 2, "groups_per_token": 3}, "MoEConfig.groups_per_token"),
    ({"num_groups": 4, "groups_per_token": 1, "experts_per_token": 3}, "MoEConfig.experts_per_token"),
    ({"routed_scale": 0}, "MoEConfig.routed_scale"),
    ({"shared_experts": -1}, "MoEConfig.shared_experts"),
])
def test_a_bad_configuration_fails_at_construction_naming_the_field(fields, named):
    if fields == {"num_groups": 8}:  # the values it lists are the ones it accepts
        with pytest.raises(InputError, match=r"allowed values: \[1, 2, 4\], got 8"):
            MoEConfig(num_experts=8, experts_per_token=2, expert_size=4, num_groups=8)
        for groups in (1, 2, 4):
            MoEConfig(num_experts=8, experts_per_token=2, expert_size=4, num_groups=groups)
    values = {"num_experts": 8, "experts_per_token": 2, "expert_size": 4, **fields}
    with pytest.raises(InputError, match=named.replace(".", r"\.").replace("(", r"\(")):
        MoEConfig(**values)
    with pytest.raises(InputError, match="unknown field"):
        MoEConfig.from_dict({"num_experts": 8, "experts_per_token": 2, "expert_size": 4, "top_k": 2})
