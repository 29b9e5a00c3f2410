"""Helpers shared by tests in several packages."""

import torch


def activate_routing(routers, gate: float = 0.5) -> None:
    """Non-zero routing: queries from N(0, 1) (input-dependent query maps from N(0, 1 / D)) and gates at
    `gate`, so a lost or unused router shows."""
    with torch.no_grad():
        for router in routers:
            router.query.normal_()
            if getattr(router, "query_proj", None) is not None:
                router.query_proj.normal_(0.0, router.query_proj.shape[0] ** -0.5)
            if router.gate is not None:
                router.gate.fill_(gate)
