"""The reporting layer: figures and Markdown/HTML/JSON documents built from `attnres.analysis` statistics.

- `document`: the block renderer (Markdown and HTML from one list of blocks), `fmt`, strict JSON.
- `names`: `slug`, the one way a label or variant name becomes a file or folder name.
- `variant_names`: `variant_name`, a variant's display name from a result file's or preset's entry.
- `folder`: a report folder is replaced only by the command that wrote it, or with --force.
- `plots`, `depth_analysis_plots`: one PNG per function (matplotlib, imported only by these two and `style`).
- `style`: `variant_style`, the one colour, marker and line style of each variant in every figure.
- `depth_analysis`, `depth_analysis_report`: the `attnres analyze` command and the report it writes.
- `compare_summary`, `compare_report`: statistics over seeds and the report of `attnres compare`.

Only the light, dependency-free helpers are imported here; the rest from their modules.
"""

from attnres.report.document import dumps_json, fmt, jsonable, render_html, render_markdown
from attnres.report.names import slug, unique_name

__all__ = ["dumps_json", "fmt", "jsonable", "render_html", "render_markdown", "slug", "unique_name"]
