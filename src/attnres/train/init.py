"""Starting weights of a run: a pretrained (converted) model, and the router-query initialisation."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from attnres.model import AttnResLM
from attnres.train.checkpoint import CheckpointError


def load_initial_weights(model: AttnResLM, directory: str | Path) -> list[str]:
    """Load the weights of a Hugging Face-format attnres directory into `model`.

    Accepts `attnres convert` output (names prefixed `model.`) and training checkpoints (no
    prefix), single or sharded safetensors. Every sub-layer parameter must be present with its
    shape; routing parameters may be absent (a standard source): they keep their zero init.
    Returns the names of the routing parameters that were not in the directory.
    """
    files = sorted(Path(directory).glob("*.safetensors"))
    files = [f for f in files if f.name != "trainer.safetensors"]
    if not files:
        raise CheckpointError(f"init_from: no .safetensors weights in {directory}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update({k.removeprefix("model."): v for k, v in load_file(str(file)).items()})
        except SafetensorError as error:
            raise CheckpointError(f"init_from: {file} is corrupt or unreadable ({error})") from None
    if model.config.tie_embeddings:
        state.pop("lm_head.weight", None)  # the same tensor as the embedding
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as error:
        raise CheckpointError(f"init_from: weights in {directory} do not fit the model: {error}") from None
    missing = [k for k in result.missing_keys if not (k == "lm_head.weight" and model.config.tie_embeddings)]
    not_routing = [k for k in missing if not k.startswith("residual.routers.")]
    if not_routing or result.unexpected_keys:
        raise CheckpointError(f"init_from: weights in {directory} do not fit the model: missing {not_routing}, "
                              f"unexpected {sorted(result.unexpected_keys)}")
    return missing


def draw_normal_queries(model: AttnResLM, std: float = 0.02) -> None:
    """Router queries from N(0, std), as the public research code leaves them (for ablations)."""
    with torch.no_grad():
        for router in model.routers:
            router.query.normal_(0.0, std)
