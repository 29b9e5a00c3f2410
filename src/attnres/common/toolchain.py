"""The C++ compiler torch would call, found as torch finds it, so that a feature that needs one can
say in one line what is missing instead of failing deep inside torch.

Two features compile C++ on this machine, and torch finds their compiler by two rules:
- the fused CPU routing kernel (torch.utils.cpp_extension): $CXX when set, else `c++`; ninja runs
  it through the shell, so the first word of $CXX is the program (`ccache g++` works);
- torch.compile's inductor on CPU (torch._inductor.config.cpp.cxx): $CXX as it was when torch read
  its config, else `g++`, run as one program.
Neither is needed by the rest of attnres: without a compiler, models train and decode eagerly.
"""

from __future__ import annotations

import os
import shutil

from attnres.common.errors import InputError

INSTALL_HINT = "install g++ (Debian/Ubuntu: apt-get install g++)"


def extension_compiler() -> str | None:
    """The compiler torch.utils.cpp_extension builds with, as a path, or None when there is none."""
    words = os.environ.get("CXX", "c++").split()
    return shutil.which(words[0]) if words else None


def inductor_compiler() -> str | None:
    """The compiler torch.compile's inductor calls for CPU code, as a path, or None when there is none."""
    from torch._inductor import config  # imported here: only a caller about to compile pays for it

    for cxx in config.cpp.cxx:  # None: a compiler inductor fetches with conda when asked to; not counted
        if cxx is not None and shutil.which(cxx):
            return shutil.which(cxx)
    return None


def missing(default: str) -> str:
    """Why no compiler was found, for the rule whose fallback (without $CXX) is `default`."""
    cxx = os.environ.get("CXX")
    if cxx is None:
        return f"no C++ compiler found: CXX is unset and {default} is not on PATH"
    return f"no C++ compiler found: CXX={cxx!r} is not on PATH"


def require_inductor_compiler(what: str, instead: str) -> None:
    """Raise InputError, one line, when torch.compile's inductor has no compiler for CPU code.

    what: the feature that compiles ("the compiled decode step"); instead: how to do without ("...").
    """
    if inductor_compiler() is None:
        raise InputError(f"{what} is compiled by torch.compile's inductor, which on CPU needs a C++ compiler "
                         f"({missing('g++')}); {INSTALL_HINT}, or {instead}")


__all__ = ["INSTALL_HINT", "extension_compiler", "inductor_compiler", "missing", "require_inductor_compiler"]
