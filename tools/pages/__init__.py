"""The project's pages (README.md and docs/) with every measured figure generated from the committed
result files under results/: `python -m tools.pages` writes the generated blocks, `--check` fails
when a page differs from what its result files say.

A generated block sits between two markers in a page:

    <!-- attnres:begin NAME -->
    ...written by the generator of NAME (tools.pages.registry.BLOCKS)...
    <!-- attnres:end NAME -->
"""

from tools.pages.render import PageError, check_pages, render_pages, write_pages

__all__ = ["PageError", "check_pages", "render_pages", "write_pages"]
