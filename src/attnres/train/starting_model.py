"""The starting model of a run: built from the run's seed, a pretrained (converted) model's weights, and
the router-query initialisation."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from attnres.checkpoint import CheckpointError
from attnres.checkpoint.weights import weights_misfit
from attnres.model import AttnResLM
from attnres.routing import resolve_impl
from attnres.train.run_config import RunConfig


def build_model(run: RunConfig, vocab_size: int, device: torch.device) -> AttnResLM:
    """The run's model on `device`, initialised from the run's seed (vocab_size fills "auto")."""
    torch.manual_seed(run.train.seed)
    model = AttnResLM(run.model.with_vocab_size(vocab_size)).to(device)
    model.set_routing(run.train.routing_impl, run.train.routing_chunk_size)
    # Resolved now, not at the first step: routing_impl 'fused' builds its kernel here or is refused
    # (no compiler, an unusable extensions folder) before the run writes anything.
    resolve_impl(model.residual.impl, device, quiet=True)
    model.activation_checkpointing = run.train.activation_checkpointing
    return model


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
            raise CheckpointError(f"init_from: {file} is corrupt or unreadable ({error}); convert the model again, "
                                  f"or give another checkpoint") from None
    if model.config.tie_embeddings:
        state.pop("lm_head.weight", None)  # the same tensor as the embedding
    misfit, absent_routing = weights_misfit(model, {name: tensor.shape for name, tensor in state.items()})
    if misfit:  # every tensor or none: the check `generate` and `lm-eval` make on the headers (check_model_dir)
        raise CheckpointError(f"init_from: weights in {directory} do not fit the model: {misfit}")
    try:
        model.load_state_dict(state, strict=False)
    except RuntimeError as error:  # names and shapes fit: a dtype torch cannot copy from
        raise CheckpointError(f"init_from: weights in {directory} do not fit the model: {error}") from None
    return absent_routing


def draw_normal_queries(model: AttnResLM, std: float = 0.02) -> None:
    """Router queries from N(0, std), as the public research code leaves them (for ablations)."""
    for mixer in model.routers:
        mixer.draw_queries(std)
