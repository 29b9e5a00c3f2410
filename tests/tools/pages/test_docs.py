"""The pages as a reader meets them: the README answers within its first screen, pages stay short,
relative links resolve, and every Python example runs."""

import re
from pathlib import Path

import pytest

from tools.pages.markers import BEGIN, END
from tools.pages.render import pages

ROOT = Path(__file__).resolve().parents[3]
PAGES = [p.relative_to(ROOT).as_posix() for p in pages(ROOT)]
README_LINES, FIRST_SCREEN, PAGE_LINES = 200, 40, 210
SKIP = re.compile(r"^<!-- example: skip \((.+)\) -->$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def test_the_readme_is_short_and_answers_on_its_first_screen():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_LINES
    for name in ("recommendation-text", "recommendation"):  # the headline, then the table
        assert lines.index(END.format(name=name)) < FIRST_SCREEN, f"{name} must end within the first 40 lines"
    headline = lines[lines.index(BEGIN.format(name="recommendation-text")) + 1]
    assert headline.startswith(("**Use ", "**No variant wins everywhere at this scale.**",  # drawn by the rule
                                "**No variant is recommended yet.**"))
    begin = lines.index(BEGIN.format(name="recommendation"))
    table = [line for line in lines[begin + 1:lines.index(END.format(name="recommendation"))] if line.startswith("|")]
    assert len(table) >= 10  # header, rule, and a row per built-in variant
    assert all(column in table[0] for column in ("second corpus", "Kimi Linear", "equal time", "train step",
                                                 "parameters"))
    at_scale = "\n".join(lines[lines.index(BEGIN.format(name="at-scale")):lines.index(END.format(name="at-scale"))])
    assert all(source in at_scale for source in ("Kimi", "Delta paper", "Hyper-Connections", "mHC", "nanochat", "marin"))


@pytest.mark.parametrize("page", [p for p in PAGES if p != "README.md"])
def test_every_page_is_short(page):
    assert len((ROOT / page).read_text().splitlines()) <= PAGE_LINES


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen, out, in_code = {}, set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            base = slug(line.lstrip("#"))
            n = seen.get(base, 0)
            out.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    return out


def links(path: Path) -> list[str]:
    """The link targets of a page's prose (not of its code blocks)."""
    out, in_code = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code:
            out += [a or b for a, b in LINK.findall(re.sub(r"`[^`]*`", "", line))]
    return out


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_resolve(page):
    path = ROOT / page
    broken = []
    for target in links(path):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor}")
    assert not broken, broken


def examples(path: Path) -> list[str]:
    """The page's ```python blocks in order, without those marked `<!-- example: skip (why) -->`."""
    blocks, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            end = lines.index("```", i + 1)
            skipped = i > 0 and SKIP.match(lines[i - 1].strip())
            if not skipped:
                blocks.append("\n".join(lines[i + 1:end]))
            i = end
        i += 1
    return blocks


EXAMPLE_PAGES = [p for p in PAGES if examples(ROOT / p)]


@pytest.mark.parametrize("page", EXAMPLE_PAGES)
def test_python_examples_run(page, tmp_path, monkeypatch, capsys):
    """A page's examples in order, in one fresh namespace, in an empty working directory (in this
    process: importing torch once for all pages keeps the suite short)."""
    monkeypatch.chdir(tmp_path)
    code = compile("\n\n".join(examples(ROOT / page)), f"{page} (its python blocks)", "exec")
    exec(code, {"__name__": "__main__"})


def test_skipped_examples_say_why():
    for page in PAGES:
        for line in (ROOT / page).read_text().splitlines():
            if line.startswith("<!-- example:"):
                assert SKIP.match(line.strip()), f"{page}: {line!r} (write <!-- example: skip (REASON) -->)"
