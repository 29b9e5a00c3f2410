"""Helpers shared by tests in several packages."""

import torch


def activate_routing(routers, gate: float = 0.5) -> None:
    """Non-zero routing: queries from N(0, 1) and gates at `gate`, so a lost or unused router shows."""
    with torch.no_grad():
        for router in routers:
            router.query.normal_()
            if router.gate is not None:
                router.gate.fill_(gate)
