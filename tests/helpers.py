"""Helpers shared by tests in several packages."""

import pytest
import torch

from attnres.common import toolchain
from attnres.methods import EXACT_CONVERSIONS
from attnres.routing import fused_cpu

# Tests of the fused CPU routing kernel (routing_impl "fused") run where it is built or can be built
# (a C++ compiler is there: a failed build then fails them); elsewhere they are skipped, saying why.
_FUSED_CPU_MISSING = fused_cpu.unavailable_reason()
needs_fused_cpu = pytest.mark.skipif(_FUSED_CPU_MISSING is not None,
                                     reason=f"the fused CPU routing kernel is not built: {_FUSED_CPU_MISSING}")
# Tests that compile with torch.compile's inductor on CPU need the C++ compiler inductor calls.
needs_inductor_cpu = pytest.mark.skipif(toolchain.inductor_compiler() is None,
                                        reason=f"torch.compile's inductor on CPU needs a C++ compiler: "
                                               f"{toolchain.missing('g++')}")


def options_of(**values) -> dict:
    """A variant's options (`ModelConfig.residual_options`) from keywords, leaving out those set to None
    (a parametrised case's "not this variant's option")."""
    return {name: value for name, value in values.items() if value is not None}


def exact_conversions(variant) -> tuple[str, ...]:
    """The exact conversions (method §4) a row of the variant table accepts: every one where its
    options have `exact_conversion`, none elsewhere."""
    return EXACT_CONVERSIONS if "exact_conversion" in variant.options.names() else ()


def activate_routing(routers, gate: float = 0.5) -> None:
    """Non-zero routing: queries from N(0, 1) (input-dependent query maps from N(0, 1 / D)), gates at
    `gate`, DenseFormer's weights and the stream mixers' coefficients moved, so a lost or unused router shows."""
    with torch.no_grad():
        for router in routers:
            if hasattr(router, "alpha"):  # DenseFormer's average: weights of any sign around the identity
                router.alpha.add_(0.5 * torch.randn_like(router.alpha))
                continue
            if router.mixes_streams:  # hyper-connections, mHC: every coefficient moved off its start
                for param in router.parameters():
                    param.add_(0.3 * torch.randn_like(param))
                continue
            router.query.normal_()
            if getattr(router, "query_proj", None) is not None:
                router.query_proj.normal_(0.0, router.query_proj.shape[0] ** -0.5)
            if router.gate is not None:
                router.gate.fill_(gate)


def train_losses(model, batch, steps: int, lr: float = 3e-3, weight_decay: float = 0.01) -> list[float]:
    """Train `model` on one (B, T) batch for `steps` AdamW steps; the loss before each step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    for _ in range(steps):
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses



class Float64Torch:
    """Stands for `torch` inside a transformers modeling module: its `float32` (and `float`) is float64,
    all else is torch's, so the reference's casts to fp32 (norms, softmax, routers, the delta rule)
    keep float64."""

    float32 = torch.float64
    float = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


def reference_in_float64(monkeypatch, module) -> None:
    """Make transformers' modeling `module` compute in float64 where it casts to fp32 by name
    (`torch.float32`, `torch.float`, `Tensor.float()`), which would round a float64 comparison to ~1e-7."""
    monkeypatch.setattr(module, "torch", Float64Torch())
    monkeypatch.setattr(torch.Tensor, "float", torch.Tensor.double)


def kimi_linear_in_float64(monkeypatch) -> None:
    """Make transformers' Kimi Linear compute in float64 for the test: its `torch.float32` casts and
    `Tensor.float()` calls would otherwise round a float64 comparison to ~1e-7. Its hub-kernel
    decorators must fall back to PyTorch: `fla` and `causal_conv1d`, which they would call instead, are
    not installed. (`kernels` may be: transformers 5.25 requires it, and it replaces a layer only when
    a model is kernelized, which these tests never ask for.)"""
    import importlib.util

    from transformers.models.kimi_linear import modeling_kimi_linear

    for package in ("fla", "causal_conv1d"):
        assert importlib.util.find_spec(package) is None, f"{package} installed: the reference would not be PyTorch"
    reference_in_float64(monkeypatch, modeling_kimi_linear)
