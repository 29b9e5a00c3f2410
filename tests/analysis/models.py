"""Tiny models and batches shared by the analysis tests."""

import torch

from attnres import AttnResLM, ModelConfig


def tiny_model(residual, num_blocks=None, seed=0, num_layers=2, routing_impl="auto", **options):
    """A 32-wide decoder of `num_layers` layers, seeded; `options`: the variant's options, routed with
    `routing_impl`."""
    torch.manual_seed(seed)
    if num_blocks is not None:
        options["num_blocks"] = num_blocks
    model = AttnResLM(ModelConfig(vocab_size=64, hidden_size=32, num_layers=num_layers, num_heads=4, num_kv_heads=2,
                                  intermediate_size=64, residual=residual, residual_options=options))
    return model.set_routing(routing_impl)


def randomize_routers(model, seed=1):
    """Queries from N(0, 1), so routing is far from uniform."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for router in model.routers:
            if hasattr(router, "alpha"):  # DenseFormer: its averaging weights instead
                router.alpha.add_(torch.randn(router.alpha.shape, generator=gen))
                continue
            if router.mixes_streams:  # hyper-connections, mHC: every coefficient parameter moved
                for param in router.parameters():
                    param.add_(0.5 * torch.randn(param.shape, generator=gen))
                continue
            router.query.copy_(torch.randn(router.query.shape, generator=gen))


def batches_of_different_sizes():
    """Two batches of different shapes (1 x 5 and 3 x 7 tokens), so token weighting shows."""
    gen = torch.Generator().manual_seed(2)
    return [torch.randint(0, 64, (1, 5), generator=gen), torch.randint(0, 64, (3, 7), generator=gen)]
