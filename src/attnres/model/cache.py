"""KVCache: keys and values of earlier positions, per layer, for incremental decoding.

Routing needs no cache of its own: it mixes depth sources per token, so only attention looks
across positions. The interface (`update(k, v, layer_idx)`, `get_seq_length()`) is the one Hugging
Face's Cache classes have, so either can be passed to AttnResLM.
"""

from __future__ import annotations

import torch


class KVCache:
    """Growing per-layer key/value tensors of shape (B, H_kv, T_cached, hd)."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *unused) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new positions' k, v (B, H_kv, T_new, hd); return all positions' k, v."""
        if layer_idx == len(self.keys):
            self.keys.append(k)
            self.values.append(v)
        else:
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], k], dim=2)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], v], dim=2)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Number of cached positions."""
        return self.keys[layer_idx].shape[2] if len(self.keys) > layer_idx else 0
