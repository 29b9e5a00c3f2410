"""The `attnres` command line: thin argument parsing over the packages."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields


def _demo(args: argparse.Namespace) -> int:
    from attnres.demo import DemoSettings, format_table, run_demo

    settings = DemoSettings(**{f.name: getattr(args, f.name) for f in fields(DemoSettings)})
    print(f"attnres demo: {settings.num_layers} layers x {settings.hidden_size} wide, {settings.steps} AdamW "
          f"steps of {settings.batch_size} x {settings.seq_len} generated tokens per variant (seed {settings.seed})")
    rows = run_demo(settings)
    print()
    print(format_table(rows))
    print("\nmax weight: token-mean of each router's largest softmax weight (1/n = uniform, 1 = one source),"
          "\naveraged over routers with two or more sources; '-' where the variant has none.")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"settings": settings.__dict__, "results": rows}, handle, indent=2)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="attnres", description="Depth routing residuals for language models.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a tiny model of each variant on generated data and compare")
    from attnres.demo import DemoSettings

    defaults = DemoSettings()
    for f in fields(DemoSettings):
        demo.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=type(getattr(defaults, f.name)),
                          default=getattr(defaults, f.name), help=f"default: {getattr(defaults, f.name)}")
    demo.add_argument("--json", help="also write the results to this JSON file")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `attnres` command."""
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except ValueError as error:
        print(f"attnres {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
