"""Settings files as every command reads them: YAML mappings whose keys are given once."""

import pytest

from attnres.common.config_files import DuplicateKey, load_yaml, parse_assignment, read_yaml_mapping
from attnres.common.errors import InputError


def test_a_section_given_twice_is_refused_naming_the_key_and_both_lines(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  lr: 3.0e-3\nmodel:\n  hidden_size: 64\ntrain:\n  steps: 4\n")
    with pytest.raises(InputError, match=rf"config file {path} is not valid YAML: key 'train' is given twice, "
                                         r"on lines 1 and 5; keep one"):
        read_yaml_mapping(path, "config file")


def test_a_key_given_twice_inside_a_section_or_on_one_line_is_refused():
    with pytest.raises(DuplicateKey, match="key 'lr' is given twice, on lines 2 and 3"):
        load_yaml("train:\n  lr: 1\n  lr: 2\n")
    with pytest.raises(DuplicateKey, match="key 'x' is given twice, on line 1"):
        load_yaml("{x: 1, x: 2}")
    with pytest.raises(InputError, match="key 'num_experts' is given twice"):
        parse_assignment("model.moe={num_experts: 8, num_experts: 4}", "--set", "key=value")


def test_merge_keys_and_equal_keys_in_different_mappings_are_fine():
    assert load_yaml("base: &b {p: 1, q: 2}\nrun: {<<: *b, p: 3}\nother: {p: 4}\n") == {
        "base": {"p": 1, "q": 2}, "run": {"p": 3, "q": 2}, "other": {"p": 4}}
    assert load_yaml("[{a: 1}, {a: 1}]") == [{"a": 1}, {"a": 1}]
