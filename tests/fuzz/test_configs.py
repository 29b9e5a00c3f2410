"""Fuzzing the config readers: YAML run configs and presets, `--set` overrides, and every config
dataclass built from a dict (any nesting, types and unicode; valid configs with keys dropped, added
or given other values)."""

import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from attnres.bench import bench_config
from attnres.common.config_files import bundled_config_dir, parse_assignment, read_yaml_mapping
from attnres.common.errors import InputError
from attnres.compare import presets as compare_presets
from attnres.data import DataConfig
from attnres.model import ModelConfig
from attnres.model.attention_config import KDAConfig, MLAConfig
from attnres.model.moe_config import MoEConfig
from attnres.scaling import preset as scaling_presets
from attnres.train.train_config import TrainConfig
from attnres.train.run_config import RunConfig, load_run_config
from tests.fuzz.helpers import (WORDS, alias_bomb, check_reader, garbage_bytes, mutated, unchanged, yaml_keys,
                                yaml_text, yaml_values)

ERRORS = (InputError,)


def _bundled(kind: str, name: str) -> dict:
    return yaml.safe_load((bundled_config_dir(kind) / f"{name}.yaml").read_text())


RUN = yaml.safe_load((bundled_config_dir("") / "cpu-tiny.yaml").read_text())
MOE = {"num_experts": 8, "experts_per_token": 2, "expert_size": 16, "shared_experts": 1, "scoring": "sigmoid",
       "num_groups": 2, "groups_per_token": 1, "score_bias": True, "dense_layers": 1}
MLA = {"kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, "q_lora_rank": 16}
KDA = {"num_heads": 2, "head_dim": 8, "short_conv_kernel_size": 4}
MODEL = {**RUN["model"], "moe": MOE, "mla": MLA, "kda": KDA,
         "layer_types": ["linear_attention", "linear_attention", "linear_attention", "latent_attention"] * 2}
HF_MODEL = ModelConfig.from_dict({**RUN["model"], "vocab_size": 512}).to_hf_dict()

# `key=value` items: known and unknown keys, values as YAML text (or anything).
_FIELDS = sorted({*RUN["model"], *RUN["data"], *RUN["train"], "residual_options.num_blocks", "pipeline.schedule",
                  "moe.num_experts", "cost.repeats", "rules.head_dim", "repeats", "depths", "variants", "options"})
override_keys = st.one_of(st.builds(lambda s, f: f"{s}.{f}", st.sampled_from(["model", "data", "train", "cost",
                                                                                "rules", "x"]), st.sampled_from(_FIELDS)),
                          st.sampled_from(["out_dir", *_FIELDS]), st.text(max_size=10))
override_values = st.one_of(yaml_values.map(lambda v: yaml.safe_dump(v, default_flow_style=True, width=10**6)
                                            .strip().removesuffix("...").strip()),
                            st.sampled_from(WORDS), st.text(max_size=12))
overrides = st.lists(st.one_of(st.builds(lambda k, v: f"{k}={v}", override_keys, override_values),
                               st.text(max_size=16)), max_size=4)


def _yaml_file(directory: Path, content) -> Path:
    path = directory / "config.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else yaml_text(content), encoding="utf-8")
    return path


yaml_documents = st.one_of(yaml_values, garbage_bytes, st.text(max_size=80))


@given(yaml_documents)
def test_read_yaml_mapping(content):
    with tempfile.TemporaryDirectory() as tmp:
        path = _yaml_file(Path(tmp), content)
        with unchanged(Path(tmp)):
            result = check_reader(lambda: read_yaml_mapping(path, "config file"), ERRORS)
        assert isinstance(result, (dict, InputError))


@given(st.one_of(override_keys.flatmap(lambda k: override_values.map(lambda v: f"{k}={v}")), st.text(max_size=30)))
def test_parse_assignment(item):
    result = check_reader(lambda: parse_assignment(item, "--set", "key=value"), ERRORS)
    assert isinstance(result, (tuple, InputError))


@given(st.one_of(mutated(RUN), yaml_values, garbage_bytes), overrides)
def test_load_run_config(content, items):
    with tempfile.TemporaryDirectory() as tmp:
        path = _yaml_file(Path(tmp), content)
        with unchanged(Path(tmp)):
            result = check_reader(lambda: load_run_config(path, items), ERRORS)
        assert isinstance(result, (RunConfig, InputError))


@given(st.one_of(mutated(RUN), yaml_values))
def test_run_config_from_dict(values):
    result = check_reader(lambda: RunConfig.from_dict(values), ERRORS)
    if isinstance(result, RunConfig):  # what it accepts, it writes back and reads again
        assert RunConfig.from_dict(result.to_dict()) == result


@given(st.one_of(mutated(MODEL), mutated(RUN["model"]), yaml_values))
def test_model_config_from_dict(values):
    result = check_reader(lambda: ModelConfig.from_dict(values), ERRORS)
    assert isinstance(result, (ModelConfig, InputError))


@given(st.one_of(mutated(HF_MODEL), yaml_values))
def test_model_config_from_hf_dict(values):
    result = check_reader(lambda: ModelConfig.from_hf_dict(values), ERRORS)
    assert isinstance(result, (ModelConfig, InputError))


@pytest.mark.parametrize("kind, base", [(MoEConfig, MOE), (MLAConfig, MLA), (KDAConfig, KDA)],
                         ids=["moe", "mla", "kda"])
@given(data=st.data())
def test_sub_configs_from_dict(kind, base, data):
    values = data.draw(st.one_of(mutated(base), yaml_values))
    result = check_reader(lambda: kind.from_dict(values), ERRORS)
    assert isinstance(result, (kind, InputError))


@pytest.mark.parametrize("kind, section", [(TrainConfig, "train"), (DataConfig, "data")])
@given(data=st.data())
def test_sections_from_dict(kind, section, data):
    values = data.draw(st.one_of(mutated(RUN[section]), yaml_values))
    result = check_reader(lambda: RunConfig.from_dict({"model": RUN["model"], section: values}), ERRORS)
    assert isinstance(result, (RunConfig, InputError))


@pytest.mark.parametrize("module, name", [(compare_presets, "smoke"), (scaling_presets, "tiny")],
                         ids=["compare", "scaling"])
@given(data=st.data())
def test_compare_and_scaling_presets(module, name, data):
    content = data.draw(st.one_of(mutated(_bundled(module.__name__.split(".")[1], name)), yaml_values, garbage_bytes))
    items = data.draw(overrides)
    with tempfile.TemporaryDirectory() as tmp:
        path = _yaml_file(Path(tmp), content)
        with unchanged(Path(tmp)):
            result = check_reader(lambda: module.load_preset(str(path), items), ERRORS)
        assert isinstance(result, (module.ComparePreset if module is compare_presets else module.ScalingPreset,
                                   InputError))


@given(st.one_of(mutated(_bundled("bench", "cpu")), yaml_values, garbage_bytes), overrides)
def test_bench_presets(content, items):
    with tempfile.TemporaryDirectory() as tmp:
        path = _yaml_file(Path(tmp), content)
        with unchanged(Path(tmp)):
            result = check_reader(lambda: bench_config.resolve_config(str(path), set_args=items), ERRORS)
        assert isinstance(result, (bench_config.BenchConfig, InputError))


@given(st.dictionaries(yaml_keys, yaml_values, max_size=3))
def test_non_string_keys(values):
    """Keys YAML may write that are not strings (1, true, null, 1.5) next to string ones."""
    for build in (RunConfig.from_dict, ModelConfig.from_dict, MoEConfig.from_dict):
        check_reader(lambda: build({**values, "hidden_size": 64}), ERRORS)


def test_alias_bomb_is_refused_quickly():
    """A 'billion laughs' YAML (aliases expanding to 10^9 leaves) is refused without expanding it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = _yaml_file(Path(tmp), alias_bomb())
        for read in (lambda: read_yaml_mapping(path, "config file"), lambda: load_run_config(path),
                     lambda: compare_presets.load_preset(str(path)), lambda: bench_config.load_settings(path)):
            assert isinstance(check_reader(read, ERRORS), InputError)
        assert isinstance(check_reader(lambda: parse_assignment("model.hidden_size=" + alias_bomb().replace(
            "\n", ", ").replace("a0:", "{a0:", 1).rstrip(", ") + "}", "--set", "k=v"), ERRORS), (InputError, tuple))


@pytest.mark.parametrize("values", [
    {"num_layers": 10**9},  # a router per sub-layer is built to check the routing settings
    {"num_layers": 10**9, "residual": "standard", "num_blocks": None},
    {"num_heads": 10**12, "num_kv_heads": 7, "head_dim": 8},  # the message lists the divisors of num_heads
    {"moe": {"num_experts": 10**12, "experts_per_token": 1, "expert_size": 4, "num_groups": 7}},
    {"num_layers": 10**9, "num_blocks": 7},  # ... and the valid block counts
    {"num_layers": 10**9, "kda": {"num_heads": 2, "head_dim": 8}},  # a layer type per layer
], ids=["layers", "layers-standard", "heads", "experts", "blocks", "layer-types"])
def test_huge_sizes_are_refused_quickly(values):
    """Sizes whose checks (or their messages) would take time or memory in proportion to the number."""
    run = {**RUN, "model": {**RUN["model"], **values}}
    assert isinstance(check_reader(lambda: RunConfig.from_dict(run), ERRORS), InputError)


@given(st.sampled_from(["model", "data", "train", "out_dir"]), st.sampled_from(["twice", "null", "list"]))
def test_run_configs_with_a_section_given_twice_null_or_of_another_type(section, how):
    """A section given twice is refused naming it and both lines; a null or wrong-typed section is
    refused (or, where null means "the defaults", accepted), never a traceback."""
    text = yaml_text(RUN)
    if how == "twice":
        text += yaml_text({section: RUN[section]})
    else:
        text = yaml_text({**RUN, section: None if how == "null" else [RUN[section]]})
    with tempfile.TemporaryDirectory() as tmp:
        path = _yaml_file(Path(tmp), text)
        result = check_reader(lambda: load_run_config(path), ERRORS)
    if how == "twice":
        assert isinstance(result, InputError) and f"key {section!r} is given twice, on lines" in str(result)
