"""tools.pages.markers: generated blocks are found, replaced in place, and refused when unpaired."""

import pytest

from tools.pages.markers import MarkerError, find_blocks, outside_blocks, replace_blocks

PAGE = """# Title
text before
<!-- attnres:begin one -->
old one
<!-- attnres:end one -->
middle
<!-- attnres:begin two -->
<!-- attnres:end two -->
after
"""


def test_blocks_are_found_in_order_with_their_contents():
    blocks = find_blocks(PAGE)
    assert [b.name for b in blocks] == ["one", "two"]
    assert PAGE[blocks[0].start:blocks[0].end] == "old one\n" and PAGE[blocks[1].start:blocks[1].end] == ""


def test_replacing_changes_only_the_named_blocks_contents():
    new = replace_blocks(PAGE, {"two": "| a |\n|---|"})
    assert new == PAGE.replace("<!-- attnres:begin two -->\n", "<!-- attnres:begin two -->\n| a |\n|---|\n")
    assert replace_blocks(new, {"two": "| a |\n|---|"}) == new  # idempotent


def test_outside_blocks_keeps_the_hand_written_text_only():
    text = outside_blocks(PAGE)
    assert "old one" not in text and "text before" in text and "after" in text


@pytest.mark.parametrize("page, message", [
    ("<!-- attnres:begin a -->\n", "no end marker"),
    ("<!-- attnres:end a -->\n", "without its begin"),
    ("<!-- attnres:begin a -->\n<!-- attnres:begin b -->\n<!-- attnres:end b -->\n<!-- attnres:end a -->\n",
     "begins inside block 'a'"),
    ("<!-- attnres:begin a -->\n<!-- attnres:end b -->\n", "line 2"),
])
def test_unpaired_markers_are_refused_naming_the_line_or_block(page, message):
    with pytest.raises(MarkerError, match=message):
        find_blocks(page)
