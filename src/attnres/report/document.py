"""Report documents: Markdown and HTML rendered from one list of blocks, and strict JSON.

A document is a list of blocks: ("h1", text), ("h2", text), ("p", text), ("code", text),
("table", header, rows, numeric), ("figure", path, alt, caption); numeric right-aligns every table
column after the first. Shared by the comparison report and `attnres analyze`, so Markdown and
HTML carry the same content. The HTML is laid out for phones as well as desktops (see CSS).
`write_document` writes a report's JSON, Markdown and HTML files atomically.
"""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

from attnres.common.atomic import write_atomic


def fmt(value, spec: str, suffix: str = "") -> str:
    """A table cell: `value` formatted with `spec` and `suffix`, or "-" for None."""
    return "-" if value is None else f"{value:{spec}}{suffix}"


def plus_minus(value, spread, spec: str) -> str:
    """A table cell "value ± spread" (both formatted with `spec`); the value alone without a spread."""
    if value is None or spread is None:
        return fmt(value, spec)
    return f"{fmt(value, spec)} ± {fmt(spread, spec)}"


def compact(value) -> str:
    """A table cell for a setting: text as it is, anything else as compact JSON ({"a":1}, [12,24])."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)


def _md_cell(text: str) -> str:
    # A pipe would end the cell; < and > would be read as HTML by Markdown renderers.
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def render_markdown(blocks: list[tuple]) -> str:
    """The document as Markdown (GitHub tables, figures as images with an italic caption)."""
    out = []
    for kind, *rest in blocks:
        if kind == "h1":
            out.append(f"# {_md_cell(rest[0])}")
        elif kind == "h2":
            out.append(f"## {_md_cell(rest[0])}")
        elif kind == "p":
            out.append(_md_cell(rest[0]))
        elif kind == "code":
            out.append(f"```\n{rest[0]}\n```")
        elif kind == "table":
            header, rows, numeric = rest
            lines = ["| " + " | ".join(map(_md_cell, header)) + " |",
                     "|---|" + ("---:|" if numeric else "---|") * (len(header) - 1)]
            lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in rows]
            out.append("\n".join(lines))
        elif kind == "figure":
            path, alt, caption = rest
            out.append(f"![{_md_cell(alt)}]({path})\n\n*{_md_cell(caption)}*")
    return "\n\n".join(out) + "\n"


# Laid out for a phone as well as a desktop: the page is as wide as the device (the viewport meta),
# a table wider than the screen scrolls sideways inside its own container (.table-scroll) instead
# of widening the page, commands and long words wrap, and figures scale down to the screen's width
# (at most 640 px, so a figure's text is as large as the page's; see attnres.report.plots).
CSS = """body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}p,figcaption,h1,h2{overflow-wrap:anywhere}
.table-scroll{overflow-x:auto;margin:1em 0;max-width:100%}table{border-collapse:collapse}
th,td{border:1px solid #ccc;padding:.3em .6em}.numeric td{white-space:nowrap}
.numeric td:not(:first-child){text-align:right;font-variant-numeric:tabular-nums}code{font-size:.95em}
th{background:#f3f3f3}pre{background:#f6f6f6;padding:.6em;white-space:pre-wrap;overflow-wrap:anywhere}
figure{margin:1.5em 0}img{display:block;width:100%;max-width:640px;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:.95em;max-width:640px}"""
VIEWPORT = '<meta name="viewport" content="width=device-width, initial-scale=1">'
TABLE_CONTAINER = "table-scroll"  # the class of the scrolling box around every table
_BOLD = re.compile(r"\*\*([^*]+)\*\*")  # **text** is bold, as in the Markdown (a table's chosen cell)
_INLINE_CODE = re.compile(r"`([^`]+)`")


def _bold(text: str) -> str:
    return _BOLD.sub(r"<strong>\1</strong>", text)


def render_html(blocks: list[tuple]) -> str:
    """The document as one self-contained HTML page (inline CSS; figures referenced by relative path).

    Every table is wrapped in <div class="table-scroll">, the only element allowed to be wider than
    a phone's screen (it scrolls sideways); figures carry their alt text and caption.
    """
    esc = html.escape
    title = next((rest[0] for kind, *rest in blocks if kind == "h1"), "attnres comparison")
    body = []
    for kind, *rest in blocks:
        if kind in ("h1", "h2"):
            body.append(f"<{kind}>{esc(rest[0])}</{kind}>")
        elif kind == "p":  # `text` in backticks is code, as in the Markdown
            body.append("<p>" + _INLINE_CODE.sub(r"<code>\1</code>", esc(rest[0])) + "</p>")
        elif kind == "code":
            body.append(f"<pre><code>{esc(rest[0])}</code></pre>")
        elif kind == "table":
            header, rows, numeric = rest
            head = "".join(f"<th>{esc(h)}</th>" for h in header)
            cells = "".join("<tr>" + "".join(f"<td>{_bold(esc(c))}</td>" for c in row) + "</tr>\n" for row in rows)
            attrs = ' class="numeric"' if numeric else ""
            body.append(f'<div class="{TABLE_CONTAINER}"><table{attrs}>\n<thead><tr>{head}</tr></thead>\n<tbody>\n'
                        f"{cells}</tbody>\n</table></div>")
        elif kind == "figure":
            path, alt, caption = rest
            body.append(f'<figure><img src="{esc(path)}" alt="{esc(alt)}">'
                        f"<figcaption>{esc(caption)}</figcaption></figure>")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"{VIEWPORT}\n<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")


def jsonable(obj):
    """Plain JSON types; non-finite floats become null so the file is strict JSON."""
    if hasattr(obj, "to_dict"):
        obj = obj.to_dict()
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()  # numpy / torch scalars
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def dumps_json(obj, indent: int = 0) -> str:
    """JSON with dicts indented one key per line and lists of plain values (curves, weights) on one line."""
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(k)}: {dumps_json(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(obj, list) and any(isinstance(v, dict) for v in obj):
        return "[\n" + ",\n".join(inner + dumps_json(v, indent + 1) for v in obj) + f"\n{pad}]"
    return json.dumps(obj, allow_nan=False, separators=(", ", ": "))


def write_document(out_dir: Path, data, blocks: list[tuple], json_name: str = "results.json",
                   markdown_name: str = "report.md") -> list[Path]:
    """Write `data` as strict JSON (`jsonable`, `dumps_json`) and `blocks` as Markdown and index.html into
    `out_dir` (created if need be), each atomically; returns the three paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [write_atomic(out_dir / json_name, dumps_json(jsonable(data)) + "\n"),
            write_atomic(out_dir / markdown_name, render_markdown(blocks)),
            write_atomic(out_dir / "index.html", render_html(blocks))]
