"""Build the fused CPU routing extension: `python -m attnres.routing.fused_cpu_build [--verbose] [--path]`.

A module of its own so that `python -m` does not run attnres.routing.fused_cpu a second time as
__main__ (it registers custom ops, which may be registered once per process). tools/setup_env.sh
calls it after installing attnres. Prints the built library's path on stdout.
"""

from __future__ import annotations

import argparse
import sys
import time

from attnres.common.atomic import write_atomic
from attnres.routing import fused_cpu


def main(argv: list[str] | None = None) -> int:
    """Build (or find) the extension and print its path; --path only prints where it would be. Returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m attnres.routing.fused_cpu_build",
                                     description="Build the fused CPU routing extension into the cache.")
    parser.add_argument("--verbose", action="store_true", help="show the compiler's commands and output")
    parser.add_argument("--path", action="store_true", help="print where the library is (or would be) and exit")
    parser.add_argument("--path-file", metavar="FILE", help="also write the built library's path to FILE")
    args = parser.parse_args(argv)
    if args.path:
        print(fused_cpu.extension_path())
        return 0
    start = time.perf_counter()
    built_before = fused_cpu.extension_path().is_file()
    try:
        path = fused_cpu.build_extension(verbose=args.verbose)
    except RuntimeError as err:
        print(f"attnres: {err}", file=sys.stderr)
        return 1
    what = "already built" if built_before else f"built in {time.perf_counter() - start:.0f} s"
    print(f"attnres: fused CPU routing extension {what}: {path}", file=sys.stderr)
    print(path)
    if args.path_file:
        write_atomic(args.path_file, f"{path}\n")  # never a partial path for setup_env.sh to record
    return 0


if __name__ == "__main__":
    sys.exit(main())
