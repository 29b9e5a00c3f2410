"""The Python API checks its arguments like config fields: one InputError naming the argument and
what would work, not an error from deep inside torch."""

import pytest
import torch

from attnres.common.errors import InputError
from attnres.model import AttnResLM, ModelConfig
from attnres.residual import build_residual


@pytest.mark.parametrize("fields, message", [
    (dict(num_layers=True, hidden_size=8), r"build_residual num_layers must be a positive integer, got True"),
    (dict(num_layers=0, hidden_size=8), r"build_residual num_layers must be a positive integer, got 0"),
    (dict(num_layers=2, hidden_size=-1), r"build_residual hidden_size must be a positive integer, got -1"),
    (dict(num_layers=2, hidden_size=8, eps=0.0), r"build_residual eps must be a positive number, got 0.0"),
])
def test_build_residual_refuses_bad_sizes_by_name(fields, message):
    with pytest.raises(InputError, match=message):
        build_residual("block_attnres", **fields)


def test_a_model_wants_a_model_config_and_says_how_to_make_one():
    with pytest.raises(InputError, match=r"AttnResLM takes a ModelConfig, got dict; .*ModelConfig.from_dict"):
        AttnResLM({"vocab_size": 64, "hidden_size": 16})


def test_labels_outside_the_vocabulary_are_named_with_the_range():
    model = AttnResLM(ModelConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=1, num_kv_heads=1,
                                  intermediate_size=32, max_seq_len=16))
    ids = torch.randint(0, 64, (2, 8))
    labels = ids.clone()
    labels[1, 5] = 99
    with pytest.raises(InputError, match=r"labels must be token ids in \[0, 64\) .* or -100 \(ignored\); got 99"):
        model(ids, labels=labels)
    labels[1, 5] = -100  # ignored, as documented
    assert torch.isfinite(model(ids, labels=labels).loss)
