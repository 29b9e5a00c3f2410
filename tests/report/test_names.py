"""One slug for figure names (lower case) and compare run folders (case kept), as before the merge."""

from attnres.compare.presets import variant_slug
from attnres.report.names import slug, unique_name


def test_figure_names_are_lower_case():
    assert slug("block_attnres (N=2) step 6", fallback="checkpoint") == "block_attnres-n-2-step-6"
    assert slug("delta <block> (N=2)", fallback="variant") == "delta-block-n-2"
    assert slug("(((", fallback="checkpoint") == "checkpoint"


def test_run_folders_keep_case():
    assert slug("block_attnres (N=4)", keep_case=True) == "block_attnres-N-4"
    assert variant_slug({"residual": "block_attnres", "num_blocks": 4}) == "block_attnres-N-4"
    assert variant_slug({"residual": "block_attnres", "residual_options": {"num_blocks": 4}}) == "block_attnres-N-4"
    assert variant_slug({"residual": "delta_block", "num_blocks": 8, "query_init": "normal"}) == \
        "delta_block-N-8-q-N-0-0-02"
    assert variant_slug({"residual": "standard"}) == "standard"


def test_unique_name_appends_x_until_free():
    taken: set[str] = set()
    assert [unique_name("a", taken) for _ in range(3)] == ["a", "a-x", "a-x-x"]
    assert taken == {"a", "a-x", "a-x-x"}
