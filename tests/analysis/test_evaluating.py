"""attnres.analysis.evaluating.evaluating: eval mode for a block, then the hooks gone and the flag restored."""

import pytest
import torch
from torch import nn

from attnres.analysis.evaluating import evaluating


@pytest.mark.parametrize("training", [True, False])
def test_the_block_runs_in_eval_mode_and_the_flag_and_hooks_are_restored_after_an_error(training):
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    model.train(training)
    seen = []
    with pytest.raises(RuntimeError, match="boom"):
        with evaluating(model) as hooks:
            hooks.append(model.register_forward_hook(lambda m, i, o: seen.append(o.requires_grad)))
            assert not model.training and not model[1].training and not torch.is_grad_enabled()
            model(torch.ones(1, 3))
            raise RuntimeError("boom")
    assert model.training == training and model[1].training == training
    model(torch.ones(1, 3))
    assert seen == [False]  # the hook saw the block's forward only, without gradients


def test_grad_keeps_gradients_on():
    model = nn.Linear(2, 2)
    with evaluating(model, grad=True):
        assert torch.is_grad_enabled() and model(torch.ones(1, 2)).requires_grad
