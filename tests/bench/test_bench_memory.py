"""attnres bench refuses, before building a model, variants whose training states cannot all fit the
machine at once, with the same estimate `attnres train` uses (attnres.model.memory_need)."""

import pytest
import torch

from attnres.bench import model_bench
from attnres.bench.bench_config import resolve_config
from attnres.common.errors import InputError
from attnres.model import memory_need
from attnres.model.flops import parameter_count
from attnres.model.memory_need import training_state_bytes
from attnres.train.step_cost import check_runners_fit


def never_built(*args, **kwargs):
    raise AssertionError("a model was built before the memory check")


@pytest.mark.parametrize("bench", [model_bench.run_model_bench, model_bench.run_depth_sweep])
def test_variants_that_cannot_fit_together_are_refused_before_any_is_built(bench, monkeypatch):
    config = resolve_config("cpu", quick=True, hidden_size=32, variants="block_attnres", depths="2", precision="fp32")
    monkeypatch.setattr(memory_need, "machine_memory_bytes", lambda device: 2 ** 20)  # a 1 MiB machine
    monkeypatch.setattr(model_bench, "VariantRunner", never_built)
    with pytest.raises(InputError, match=r"^2 models held at once \(the largest, \w+, [\d,]+ parameters\), with their "
                                         r"gradients and AdamW's two moments \(fp32\), need [\d.]+ GiB, more than the "
                                         r"0\.0 GiB of memory this machine has; measure a smaller model"):
        bench(config, log=lambda line: None)


def test_the_bench_estimate_is_the_sum_of_the_training_states(monkeypatch):
    config = resolve_config("cpu", quick=True, hidden_size=32, variants="block_attnres", precision="fp32")
    configs = {name: model_bench.build_model_config(config, name, 32, 4, 64) for name in ("standard", "block_attnres")}
    need = sum(training_state_bytes(parameter_count(c).total) for c in configs.values())
    monkeypatch.setattr(memory_need, "machine_memory_bytes", lambda device: need)
    check_runners_fit(configs, torch.device("cpu"))  # exactly enough
    monkeypatch.setattr(memory_need, "machine_memory_bytes", lambda device: need - 1)
    with pytest.raises(InputError, match="2 models held at once"):
        check_runners_fit(configs, torch.device("cpu"))
