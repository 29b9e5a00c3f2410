"""`python -m tools.pages [--check] [--root DIR]`: regenerate the pages' generated blocks from results/,
or (--check) fail naming every page and block that differs from its result files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.pages.figures import handwritten_figures
from tools.pages.render import PageError, check_pages, write_pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.pages", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("."),
                        help="the repository: README.md, docs/ and results/ (default: the current directory)")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a page differs from its result files or quotes a "
                             "measured figure outside a generated block (default: write the blocks)")
    args = parser.parse_args(argv)
    if not (args.root / "README.md").is_file() or not (args.root / "results").is_dir():
        print(f"error: {args.root} is not the attnres repository (it needs README.md and results/)", file=sys.stderr)
        return 2
    try:
        if args.check:
            problems = [f"{line} (run `python -m tools.pages` to regenerate)" for line in check_pages(args.root)]
            problems += [str(f) for f in handwritten_figures(args.root)]
            for line in problems:
                print(line, file=sys.stderr)
            print(f"pages: {'current' if not problems else f'{len(problems)} problem(s)'}")
            return 1 if problems else 0
        changed = write_pages(args.root)
    except PageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"pages: {len(changed)} rewritten" + "".join(f"\n  {p.relative_to(args.root)}" for p in changed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
