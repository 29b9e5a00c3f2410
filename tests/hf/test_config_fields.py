"""ModelConfig's fields are the one table of config fields: AttnResConfig's fields and their Hugging Face
names are generated from it, so a field added on a ModelConfig subclass round-trips through
to_hf_dict / from_hf_dict, an HF config's save_pretrained / from_pretrained and a model's, with no
edit to attnres.hf. The one reader of JSON object files refuses each problem in one message form."""

import dataclasses
import json
from dataclasses import dataclass

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnres.hf  # noqa: E402, F401  (registers the Auto classes)
from attnres.common.errors import InputError  # noqa: E402
from attnres.common.json_files import JSONFileError, read_json_object  # noqa: E402
from attnres.hf import AttnResConfig, AttnResForCausalLM, ConversionError  # noqa: E402
from attnres.model import ConfigError, ModelConfig  # noqa: E402
from attnres.model.model_config import HF_NAMES, hf_field, hf_names  # noqa: E402

SHAPE = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=48)


@dataclass(frozen=True, kw_only=True)
class WindowConfig(ModelConfig):
    """A ModelConfig with fields of its own: one under its own name, one renamed for Hugging Face."""

    window: int = 16
    sink_tokens: int = hf_field("attention_sinks", default=0)


def test_attnres_config_fields_are_model_config_fields_under_hf_names():
    generated = {f.name: f for f in dataclasses.fields(AttnResConfig)}
    for f in dataclasses.fields(ModelConfig):
        name = HF_NAMES.get(f.name, f.name)
        default = f.metadata.get("hf_default", f.default)
        assert generated[name].default == default, name
    # the names and defaults transformers' utilities read, as before the fields were generated
    assert HF_NAMES == {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                        "num_kv_heads": "num_key_value_heads", "tie_embeddings": "tie_word_embeddings",
                        "rope_theta": "attnres_rope_theta", "norm_eps": "rms_norm_eps",
                        "max_seq_len": "max_position_embeddings", "init_std": "initializer_range"}
    config = AttnResConfig()
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.intermediate_size) == (32000, 512, 8, 8, 8, 1536)
    assert config.use_cache and config.eos_token_id is None and config.head_dim == 64


def test_a_subclass_field_round_trips_through_the_hf_dict():
    config = WindowConfig(**SHAPE, window=5, sink_tokens=2)
    values = config.to_hf_dict()
    assert values["window"] == 5 and values["attention_sinks"] == 2 and "sink_tokens" not in values
    assert hf_names(WindowConfig) == {**HF_NAMES, "sink_tokens": "attention_sinks"}
    assert WindowConfig.from_hf_dict(values) == config
    assert ModelConfig.from_hf_dict(values) == ModelConfig(**SHAPE)  # other keys of a config.json are ignored


def test_a_subclass_field_round_trips_through_the_hf_config(tmp_path):
    config = WindowConfig(**SHAPE, window=5, sink_tokens=2)
    hf_config = AttnResConfig.from_model_config(config, eos_token_id=3)
    kind = AttnResConfig.for_model_config_class(WindowConfig)
    assert type(hf_config) is kind and issubclass(kind, AttnResConfig)
    assert AttnResConfig.for_model_config_class(WindowConfig) is kind  # one class per ModelConfig class
    assert AttnResConfig.for_model_config_class(ModelConfig) is AttnResConfig
    assert kind().window == 16 and kind().attention_sinks == 0  # the defaults are the field's
    assert hf_config.window == 5 and hf_config.attention_sinks == 2 and hf_config.to_model_config() == config
    hf_config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["window"] == 5 and saved["attention_sinks"] == 2 and saved["model_type"] == "attnres"
    loaded = kind.from_pretrained(tmp_path)
    assert type(loaded) is kind and loaded.to_model_config() == config and loaded.eos_token_id == 3
    # AutoConfig knows model_type "attnres" only: a plain AttnResConfig, the extra fields as attributes
    plain = transformers.AutoConfig.from_pretrained(tmp_path)
    assert type(plain) is AttnResConfig and plain.window == 5
    assert plain.to_model_config() == ModelConfig(**SHAPE)


def test_a_subclass_field_round_trips_through_a_model(tmp_path):
    torch.manual_seed(0)
    config = WindowConfig(**SHAPE, window=7)
    model = AttnResForCausalLM(AttnResConfig.from_model_config(config)).eval()
    assert model.model.config == config
    model.save_pretrained(tmp_path)
    kind = AttnResConfig.for_model_config_class(WindowConfig)
    loaded = AttnResForCausalLM.from_pretrained(tmp_path, config=kind.from_pretrained(tmp_path)).eval()
    assert loaded.config.window == 7 and loaded.model.config == config
    ids = torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_a_subclass_may_change_a_default():
    @dataclass(frozen=True, kw_only=True)
    class Deeper(ModelConfig):
        num_layers: int = hf_field("num_hidden_layers", default=4)

    kind = AttnResConfig.for_model_config_class(Deeper)
    assert kind().num_hidden_layers == 4 and kind().to_model_config().num_layers == 4
    with pytest.raises(ConfigError, match="takes ModelConfig or a subclass of it, got <class 'dict'>"):
        AttnResConfig.for_model_config_class(dict)
    with pytest.raises(ConfigError, match="got {}"):
        AttnResConfig.for_model_config_class({})


@pytest.mark.parametrize("content, problem", [
    (None, "does not exist"),
    ("{not json", r"is not valid JSON \(Expecting"),
    (b"\xff\xfe", r"is not valid JSON \("),
    ("[1, 2]", "must hold a JSON object, got an array"),
    ("null", "must hold a JSON object, got null"),
    ("", r"is not valid JSON \("),
])
def test_the_json_reader_names_the_file_and_the_problem(tmp_path, content, problem):
    path = tmp_path / "config.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(JSONFileError, match=rf"^checkpoint: {path} {problem}.*; give a checkpoint$") as caught:
        read_json_object(path, "checkpoint", hint="give a checkpoint")
    assert isinstance(caught.value, InputError) and "\n" not in str(caught.value)
    with pytest.raises(ConversionError, match=rf"^checkpoint: {path} {problem}"):  # a package's own error type
        read_json_object(path, "checkpoint", error=ConversionError)


def test_the_json_reader_refuses_a_folder_and_reads_an_object(tmp_path):
    with pytest.raises(JSONFileError, match=rf"^model: {tmp_path} is a folder, not a file$"):
        read_json_object(tmp_path, "model")
    (tmp_path / "config.json").write_text('{"a": [1]}')
    assert read_json_object(tmp_path / "config.json", "model") == {"a": [1]}
