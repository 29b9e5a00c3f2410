"""attnres.hf.convert_options: --option items, and 0.1.0's --num-blocks / --exact merged in with a note."""

import pytest

from attnres.common.errors import InputError
from attnres.hf.convert_options import convert_options


def test_options_are_name_value_items():
    assert convert_options(["num_blocks=4", "query=static"]) == {"num_blocks": 4, "query": "static"}  # YAML values


def test_a_deprecated_flag_sets_its_option_with_a_note_naming_option():
    notes = []
    options = convert_options([], {"num_blocks": 4, "exact_conversion": None}, note=notes.append)
    assert options == {"num_blocks": 4}
    assert notes == ["attnres convert: --num-blocks 4 is deprecated since attnres 0.2.0 and will be removed in "
                     "0.3.0; use --option num_blocks=4"]


def test_a_deprecated_flag_that_contradicts_an_option_is_refused():
    with pytest.raises(InputError, match=r"--exact gate contradicts --option exact_conversion=none; give one"):
        convert_options(["exact_conversion=none"], {"exact_conversion": "gate"}, note=lambda line: None)
