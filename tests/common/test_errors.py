"""InputError: one base class for the user's bad input, apart from the ValueErrors that guard invariants."""

import pytest
import torch

import attnres
from attnres.checkpoint.format import CheckpointError
from attnres.common.checks import check_bool, check_choice, check_int, check_positive_number
from attnres.common.config_files import parse_assignment, read_yaml_mapping
from attnres.common.errors import InputError
from attnres.data import DataError
from attnres.distributed.pipeline_layout import PipelineConfigError
from attnres.hf.conversion_error import ConversionError
from attnres.model import ConfigError
from attnres.scaling.fit import FitError
from attnres.scaling.preset import ScalingPresetError
from attnres.train import RunConfigError, TrainingError
from attnres.train.train_config import TrainConfigError
from tools.pages.markers import MarkerError
from tools.pages.render import PageError

INPUT_ERRORS = [ConfigError, ConversionError, RunConfigError, TrainConfigError, DataError, PipelineConfigError,
                FitError, ScalingPresetError, PageError, MarkerError]


@pytest.mark.parametrize("error", INPUT_ERRORS, ids=lambda e: e.__name__)
def test_every_package_error_is_an_input_error_and_still_a_value_error(error):
    assert issubclass(error, InputError) and issubclass(error, ValueError)


def test_failed_runs_are_not_input_errors():
    assert not issubclass(CheckpointError, InputError) and not issubclass(TrainingError, InputError)


def test_the_package_exports_it():
    assert attnres.InputError is InputError and "InputError" in attnres.__all__


@pytest.mark.parametrize("check, args", [
    (check_int, (0, "--repeats")),
    (check_positive_number, (-1.0, "train.lr")),
    (check_choice, ("fp16", "--precision", ["bf16", "fp32"])),
    (check_bool, ("yes", "train.compile")),
])
def test_checks_raise_input_error_by_default_and_the_callers_class_when_given(check, args):
    with pytest.raises(InputError, match=f"^{args[1]} must be "):
        check(*args)
    with pytest.raises(RunConfigError, match=f"^{args[1]} must be "):
        check(*args, error=RunConfigError)


def test_settings_files_raise_input_error(tmp_path):
    binary = tmp_path / "run.yaml"
    binary.write_bytes(b"\xff\xfe\x00binary")  # not text: a one-line input error, not a UnicodeDecodeError
    with pytest.raises(InputError, match=r"^run config .*run\.yaml is not valid YAML"):
        read_yaml_mapping(binary, "run config")
    with pytest.raises(InputError, match="^--set 'lr' must look like key=value"):
        parse_assignment("lr", "--set", "key=value")


def _model():
    return attnres.AttnResLM(attnres.ModelConfig(vocab_size=32, hidden_size=16, num_layers=2, num_heads=2,
                                                 num_kv_heads=2, intermediate_size=32, residual="full_attnres"))


def test_bad_arguments_of_the_public_api_are_input_errors():
    with pytest.raises(InputError, match=r"input_ids must have shape \(batch, seq_len\)"):
        _model()(torch.zeros(4, dtype=torch.long))
    with pytest.raises(InputError, match="routing_impl must be one of"):
        attnres.routing.resolve_impl("fastest", torch.device("cpu"))
    with pytest.raises(InputError, match="num_blocks is required"):
        attnres.build_residual("block_attnres", num_layers=2, hidden_size=16)


def test_broken_internal_invariants_stay_plain_value_errors():
    # The kernels' shape checks guard what attnres's own code hands them: a failure there is a bug.
    with pytest.raises(ValueError, match="route_reference needs at least one source") as raised:
        attnres.routing.route_reference(torch.zeros(8), None, [], eps=1e-6)
    assert not isinstance(raised.value, InputError)
