"""One look per variant: the colour, marker and line style a variant has in every figure of every report.

`variant_style` is a pure function of the variant (its residual, its options' labels and its
query_init), never of which other variants a figure happens to draw, so orange is Block AttnRes in
the comparison report, in `attnres analyze` and in the study's figures alike. The colour comes from
the variant's row; a size among its option labels ("(N=4)") shades it (smaller lighter, larger
darker) and changes the marker; a tag ("[gate]") and `query_init: normal` change the line style
(and hollow the marker), so the 13 variants of the study preset stay apart; each router ablation
(method §7) has its own line style and marker.
"""

from __future__ import annotations

import math
import re
import zlib

from matplotlib.colors import to_hex, to_rgb

from attnres.report.variant_names import entry_options
from attnres.residual import VARIANTS

# A variant's colour is its row's (`Variant.color`: tab10 for the built-in ones); a variant without
# one, or one no longer in the table, gets one of these, chosen by a hash of the name (the same in every run).
SPARE_COLORS = ("#bcbd22", "#17becf", "#aec7e8", "#98df8a")
BLOCK_MARKERS = {None: "o", 1: "v", 2: "^", 4: "s", 8: "D", 16: "P", 32: "X"}
SPARE_MARKERS = ("<", ">", "h", "p", "*", "8", "d")
# A variant's look comes from its options' labels (`VariantOptions.labels`): a size, "(N=4)", shades
# the colour and picks the marker; a tag, "[gate]", changes the line style and hollows the marker,
# with a look of its own for these ones (Delta Block's conversions, the router ablations).
SIZE_LABEL = re.compile(r"\(\w+=(\d+)\)")
LINESTYLES = {None: "-", "gate": "-.", "partial": ":"}
NORMAL_QUERY_LINESTYLE = "--"
# Tags with their own (line style, marker), keeping the marker solid; the first one wins.
ABLATION_LOOKS = {"input query": ((0, (3, 1, 1, 1, 1, 1)), "*"), "sigmoid": ((0, (1, 1)), "d"),
                  "no key norm": ((0, (5, 2)), "p")}
SHADE_PER_DOUBLING = 0.15  # how much lighter each halving of the size below 8 makes the colour
BASE_SIZE = 8  # the size drawn in the residual's own colour (the papers' usual block count)


def _stable_pick(options: tuple, key: str):
    return options[zlib.crc32(key.encode()) % len(options)]


def _shade(color: str, amount: float) -> str:
    """`color` mixed towards white (amount > 0) or black (amount < 0) by |amount| (0..1)."""
    rgb = to_rgb(color)
    target = 1.0 if amount > 0 else 0.0
    return to_hex(tuple(c + (target - c) * abs(amount) for c in rgb))


def variant_style(residual: str, size: int | None = None, tags: tuple[str, ...] = (),
                  query_init: str | None = None) -> dict:
    """Matplotlib keyword arguments of one variant's lines and points: {"color", "marker", "linestyle",
    "markerfacecolor"} (bars use "color"), from its residual, the size and tags of its option labels
    (`style_of`) and its query initialisation. The same variant gets the same style in every figure."""
    row = VARIANTS.get(residual)
    color = (row.color if row is not None else None) or _stable_pick(SPARE_COLORS, residual)
    if size:
        # log2: 8 keeps the colour, each halving lightens it, each doubling darkens it
        amount = SHADE_PER_DOUBLING * (math.log2(BASE_SIZE) - math.log2(size))
        color = _shade(color, max(-0.45, min(0.5, amount)))
    marker = BLOCK_MARKERS.get(size) or _stable_pick(SPARE_MARKERS, str(size))
    line_tags = [tag for tag in tags if tag not in ABLATION_LOOKS]
    line_tag = line_tags[0] if line_tags else None
    linestyle = LINESTYLES.get(line_tag) or _stable_pick(("-.", ":"), str(line_tag))
    normal_queries = query_init == "normal"
    if normal_queries:
        linestyle = NORMAL_QUERY_LINESTYLE
    for tag in tags:
        if tag in ABLATION_LOOKS:
            linestyle, marker = ABLATION_LOOKS[tag]
            break
    return {"color": color, "marker": marker, "linestyle": linestyle,
            "markerfacecolor": "white" if normal_queries or line_tag else color}


def style_of(fields: dict) -> dict:
    """`variant_style` of a mapping with the variant's fields (a preset variant, a comparison summary
    entry, an `attnres analyze` checkpoint entry): residual, its options (flat or under
    residual_options, `entry_options`) and optionally query_init."""
    options = entry_options(fields)
    labels = options.labels() if options else []
    sizes = [int(match.group(1)) for label in labels if (match := SIZE_LABEL.fullmatch(label))]
    tags = tuple(label.strip("[]") for label in labels if label.startswith("["))
    return variant_style(fields["residual"], sizes[0] if sizes else None, tags, fields.get("query_init"))


REPEAT_LINESTYLES = ("--", ":", "-.", (0, (5, 1, 1, 1)))


def series_styles(series: dict[str, dict]) -> dict[str, dict]:
    """Styles of named series, name -> variant fields (as `style_of` takes). A series whose variant's
    style is taken already (two checkpoints of one run, say) keeps its colour and marker and gets the
    first of REPEAT_LINESTYLES, with a hollow marker, that no earlier series has, so no two look alike."""
    styles, used = {}, set()
    for name, fields in series.items():
        style = style_of(fields)
        for linestyle in REPEAT_LINESTYLES:
            if _key(style) not in used:
                break
            style = {**style, "linestyle": linestyle, "markerfacecolor": "white"}
        used.add(_key(style))
        styles[name] = style
    return styles


def _key(style: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in style.items()))
