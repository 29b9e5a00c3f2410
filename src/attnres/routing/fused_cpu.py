"""Fused CPU routing: `route_sources_fused`, lean.route_sources's contract in one C++ pass over memory,
and `merge_sources_fused`, two-phase routing's phase 2 likewise.

Why: on CPU the lean op reads every source twice (logits, then the mixture), its `addcmul_`
mixture reads and writes the (S, B, T, D) fp32 accumulator once per source, and it converts bf16
sources to fp32 copies; it reached 0.19 of the copy bandwidth in fp32 and 0.07 in bf16. The kernel
in csrc/route_cpu.cpp works on tiles of tokens whose rows of all n sources fit in L2: the logits
pass reads a tile from memory, the mixture (or, in backward, d queries) reads it again from cache,
and each output row is accumulated in registers, a few vectors at a time over all n sources, and
written once. bf16/fp16 sources are converted a tile
at a time into a per-thread buffer, never into full-size copies. Statistics and accumulation are
fp32 (float64 when a source is float64); autocast does not apply (the kernel calls no ATen op).
Threads: at::parallel_for over tiles, i.e. torch's intra-op thread count.

Backward is one C++ pass too: it recomputes <q_s, v_i> and <g_s, v_i>, writes d sources and
d inv, and accumulates d queries (per group of tiles, summed in a fixed order: deterministic for
a given thread count). Saved for backward: references to queries, sources and inv, and the
(S, B, T, n) weights, as in the lean op. `centered=False` drops the softmax-centring term of the
mixture's part of d logits (d logit_i = alpha_i (<g, v_i> + g_lse) + softmax-backward(g_weights)).

Build: the extension is compiled with torch.utils.cpp_extension (g++ -O3 -march=native -fopenmp,
ninja) into a cache folder keyed by the source, the flags, torch, Python and the CPU, so a
different machine or a changed source builds anew and a stale binary is never loaded.
`python -m attnres.routing.fused_cpu_build` builds it; tools/setup_env.sh runs that after
installing attnres (about 20 s on 2 cores). Importing this module loads the binary when the cache
has it (about 1 ms); nothing else is looked up later, so `fused_available()` traces under
torch.compile. routing_impl "auto" picks "fused" on CPU only when the binary is loaded: it never
starts a build. Asking for "fused" explicitly builds it on first use (one line on stderr says so),
and a failed build raises with the compiler's output. -march=native: the binary uses the build
machine's vector instructions and is only loaded on a CPU with the same flags (the key includes them).
The kernel is optional: without a C++ compiler (`find_compiler`, the one torch.utils.cpp_extension
would call) nothing is built, "auto" routes with the lean ops, and an explicit "fused" is refused
with one line naming what to install (`unavailable_reason`, `how_to_build`).

`inv=None` with `eps`: the kernel computes each source's inverse RMS itself, in the pass that
reads the rows anyway, and backward folds its gradient into d sources. A caller without cached
inverse RMS (a lone Router call, the router micro-benchmark) then skips inv_rms's own pass over
every source and, in backward, its extra read, write and gradient accumulation.

`merge_sources_fused` is phase 2 of two-phase routing (two_phase.merge_sources with impl "fused"):
one router's phase-1 mixture and log-sum-exp merged with j later sources by online softmax, the
function of two_phase._merge_forward / _merge_backward. Why: those are a dozen PyTorch ops, each a
pass over a (B, T, D) tensor; the kernel does the merge in one pass per token row (the mixture and
each source read once, the output written once, the row reused from L1), backward likewise (d mixed,
d sources written once, d query summed per group of tiles in a fixed order). It saves what the
PyTorch merge saves: the output, keep and take, and references, never the mixture. inv=None with
eps works as for routing.

Under `torch.compile` forward and backward are `torch.library.custom_op`s with fake
implementations (fullgraph works; the forward ops' autograd from `fast_op.compiled_op`). In eager mode with gradients they are the extension's own ops
`route` / `merge`, whose autograd nodes are C++ (route_cpu.cpp): a Python autograd.Function cost
about 0.1 ms a call in each direction, a third of Block AttnRes's training overhead at 24 x 256.
Without gradients the forward kernels run directly. Not twice differentiable.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import threading
import warnings
from pathlib import Path

import torch
from torch import Tensor

from attnres.common.run_options import check_out_dir
from attnres.common.toolchain import extension_compiler, missing
from attnres.routing.fast_op import compiled_op
from attnres.routing.lean import compute_dtype

__all__ = ["build_extension", "collect_source", "extension_path", "find_compiler", "fused_available",
           "how_to_build", "merge_sources_fused", "route_sources_fused", "route_sources_fused_split",
           "unavailable_reason"]

SOURCE = Path(__file__).with_name("csrc") / "route_cpu.cpp"
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno")  # no errno checks, so the loops vectorise
LDFLAGS = ("-fopenmp",)  # resolves to the libgomp that torch already loaded (same soname)
SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_NAMESPACE = "attnres_fused_cpu"

_lock = threading.Lock()
_state = {"loaded": False}


# ---------------------------------------------------------------- building and loading the extension

def _cpu_fingerprint() -> str:
    """The CPU's model and feature flags (what -march=native compiles for)."""
    try:
        with open("/proc/cpuinfo") as info:
            lines = [line for line in info if line.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def _build_key() -> str:
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), repr((CFLAGS, LDFLAGS)).encode(), torch.__version__.encode(),
                 sys.version.encode(), _cpu_fingerprint().encode()):
        digest.update(part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def extensions_dir() -> Path:
    """Where built extensions live: $ATTNRES_EXTENSIONS_DIR, else $XDG_CACHE_HOME (or ~/.cache)/attnres/extensions."""
    if os.environ.get("ATTNRES_EXTENSIONS_DIR"):
        return Path(os.environ["ATTNRES_EXTENSIONS_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "attnres" / "extensions"


def _check_extensions_dir() -> None:
    """InputError in one line where the extensions folder cannot be made or written (a file, a dangling
    link, no write access), naming $ATTNRES_EXTENSIONS_DIR where it chose the folder."""
    chosen = bool(os.environ.get("ATTNRES_EXTENSIONS_DIR"))
    what = "$ATTNRES_EXTENSIONS_DIR" if chosen else "the extensions folder (set $ATTNRES_EXTENSIONS_DIR to move it)"
    check_out_dir(extensions_dir(), what)


def _name() -> str:
    return f"attnres_route_cpu_{_build_key()}"


def extension_path() -> Path:
    """The shared library this source, these flags, this torch, Python and CPU build to (it may not exist yet)."""
    name = _name()
    return extensions_dir() / name / f"{name}.so"


def _load_library(path: Path) -> None:
    torch.ops.load_library(str(path))
    _loaded()


def _loaded() -> None:
    """Mark the extension loaded and give its forward ops fake implementations: a compiled step
    without gradients calls them directly (an extern call from the generated code), skipping the
    Python custom op around them, which costs about 0.1 ms a call (docs/explanation/fast-paths.md)."""
    _state["loaded"] = True
    for name, fake in (("route_forward", _route_fake), ("route_forward_into", _route_into_fake),
                       ("merge_forward", _merge_fake)):
        torch.library.register_fake(f"{_NAMESPACE}::{name}", fake)


def fused_available() -> bool:
    """True when the compiled extension is loaded: it was in the cache when this module was imported,
    or it has been built since. Never builds, never touches the file system (so it traces under
    torch.compile, where `resolve_impl` calls it)."""
    return _state["loaded"]


def find_compiler() -> str | None:
    """The C++ compiler a build would call, as a path, or None when there is none: torch.utils.
    cpp_extension's rule ($CXX's first word, else c++, on PATH; attnres.common.toolchain), which
    tools/setup_env.sh applies too."""
    return extension_compiler()


def _no_compiler() -> str:
    """Why find_compiler() found nothing, in words."""
    return missing("c++")


def unavailable_reason() -> str | None:
    """Why the fused kernel cannot run in this process, or None when it can: it is loaded, or a
    compiler is there to build it (a build may still fail, with the compiler's output)."""
    if fused_available() or find_compiler() is not None or extension_path().is_file():
        return None
    return _no_compiler()


def how_to_build() -> str:
    """What to do to get the fused kernel, in one sentence (for messages)."""
    command = "`python -m attnres.routing.fused_cpu_build` (in a checkout, tools/setup_env.sh runs it)"
    if find_compiler() is None:
        return f"install a C++ compiler with OpenMP (Debian/Ubuntu: apt-get install g++), then run {command}"
    return f"run {command}"


def _probe() -> None:
    """At import: load the built extension if the cache has it (about 1 ms)."""
    path = extension_path()
    try:
        if path.is_file():
            _load_library(path)
    except (OSError, RuntimeError) as err:  # e.g. a file left half-written by an interrupted build
        warnings.warn(f"attnres: the fused CPU routing extension {path} does not load ({err}); rebuild it with "
                      "`python -m attnres.routing.fused_cpu_build`. routing_impl 'auto' uses the lean ops meanwhile.")


def build_extension(verbose: bool = False) -> Path:
    """Compile the extension into the cache unless it is there, load it, and return its path.

    Needs a C++ compiler with OpenMP (g++; see `find_compiler`), ninja and the Python headers.
    Raises RuntimeError: one line when there is no compiler, the compiler's output when the build fails.
    """
    path = extension_path()
    with _lock:
        if _state["loaded"]:
            return path
        if not path.is_file():
            if find_compiler() is None:
                raise RuntimeError(f"the fused CPU routing kernel is not built and cannot be ({_no_compiler()}); "
                                   f"{how_to_build()}, or use routing_impl 'auto' or 'lean'")
            _check_extensions_dir()
            from torch.utils import cpp_extension  # imported here: it is slow to import and rarely needed

            # A ninja installed in the virtual environment is on PATH only when it is activated.
            bin_dir = os.path.dirname(sys.executable)
            if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
                os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                cpp_extension.load(name=_name(), sources=[str(SOURCE)], extra_cflags=list(CFLAGS),
                                   extra_ldflags=list(LDFLAGS), build_directory=str(path.parent),
                                   is_python_module=False, verbose=verbose)
            except Exception as err:
                raise RuntimeError(f"building the fused CPU routing extension failed ({err}). It needs g++, ninja "
                                   "and the Python headers; retry with `python -m attnres.routing.fused_cpu_build "
                                   "--verbose`, or use routing_impl 'auto' or 'lean' (tools/setup_env.sh skips "
                                   "the build with ATTNRES_BUILD_FUSED_CPU=0)") from err
            _loaded()  # cpp_extension.load loaded it
        else:
            _load_library(path)
    return path


def _ops():
    """The extension's ops, building the extension first (once, with a note on stderr) if needed."""
    if not fused_available():
        if not extension_path().is_file() and find_compiler() is not None:
            print(f"attnres: building the fused CPU routing extension into {extension_path().parent} (once; about "
                  "a minute). tools/setup_env.sh does this at install time.", file=sys.stderr, flush=True)
        build_extension()  # loads a built one; without a compiler, raises a one-line error
    return getattr(torch.ops, _NAMESPACE)


# ---------------------------------------------------------------- the op

def _check(queries: Tensor, sources: list[Tensor], inv: list[Tensor], what: str = "route_sources_fused") -> None:
    """Clear errors for bad inputs of op `what`. The C++ op checks the same (cheaply); this runs when
    tracing, where errors should name the inputs at trace time, and when the op fails, to explain why."""
    if not sources:
        raise ValueError(f"{what} needs at least one source, got none")
    if inv and len(inv) != len(sources):
        raise ValueError(f"{what} needs one inv per source, got {len(inv)} for {len(sources)} sources")
    shape = sources[0].shape
    if queries.dim() != 2 or queries.shape[1] != shape[-1]:
        raise ValueError(f"queries must be (S, {shape[-1]}), got {tuple(queries.shape)}")
    for i, v in enumerate(sources):
        if v.shape != shape or (inv and inv[i].shape != shape[:-1]):
            raise ValueError(f"source {i} {tuple(v.shape)} / inv {tuple(inv[i].shape) if inv else None}: every "
                             f"source must be {tuple(shape)} and every inv {tuple(shape[:-1])}")
        if v.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"source {i} has dtype {v.dtype}; the fused CPU router reads {list(SUPPORTED_DTYPES)}")
    for t in (queries, *sources, *inv):
        if t.device.type != "cpu":
            raise ValueError(f"{what} runs on CPU tensors, got one on {t.device}; use routing_impl "
                             "'auto', 'lean' or 'triton' there")


def _check_merge(mixed: Tensor, lse: Tensor, query: Tensor, sources: list[Tensor], inv: list[Tensor]) -> None:
    """`_check` for merge_sources_fused: query (D,), mixed like the sources, lse their (...) shape."""
    if query.dim() != 1:
        raise ValueError(f"merge_sources_fused needs a query (D,), got {tuple(query.shape)}")
    _check(query[None], sources, inv, "merge_sources_fused")
    shape = sources[0].shape
    if mixed.shape != shape or lse.shape != shape[:-1]:
        raise ValueError(f"merge_sources_fused needs mixed {tuple(shape)} and lse {tuple(shape[:-1])}, got "
                         f"{tuple(mixed.shape)} and {tuple(lse.shape)}")
    if mixed.dtype not in SUPPORTED_DTYPES or mixed.device.type != "cpu" or lse.device.type != "cpu":
        raise ValueError(f"merge_sources_fused needs a CPU mixture of dtype {list(SUPPORTED_DTYPES)}, got "
                         f"{mixed.dtype} on {mixed.device} (lse on {lse.device})")


def _call(run, check):
    """run(), and on failure check() first, to raise a clearer error where it finds one."""
    try:
        return run()
    except (RuntimeError, NotImplementedError):  # e.g. the dispatcher's "could not run ... CUDA backend"
        check()
        raise


def _route_forward(queries: Tensor, sources: list[Tensor], inv: list[Tensor],
                   eps: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    # The C++ op converts and checks its inputs (non-contiguous ones are read through contiguous copies).
    # inv == []: the kernel computes each source's inverse RMS with eps.
    forward = _ops().route_forward
    return _call(lambda: forward(queries, sources, inv, eps), lambda: _check(queries, sources, inv))


def _route_backward(queries: Tensor, weights: Tensor, sources: list[Tensor], inv: list[Tensor],
                    grad_mixed: Tensor | None, grad_lse: Tensor | None, grad_weights: Tensor | None,
                    centered: bool = True, eps: float = 0.0) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """Gradients w.r.t. (queries, sources, inv) from the saved weights, as lean._route_backward; one C++ pass.

    queries (S, D), weights (S, B, T, n), sources n x (B, T, D), inv n x (B, T) (or [] with eps:
    computed in the kernel, its gradient added to d sources); the upstream gradients may be None.
    Returns (d queries (S, D) in the queries' dtype, d sources (B, T, D) each in its source's dtype,
    d inv (B, T) each in its inv's dtype, [] when inv is []). centered=False: see the module docstring.
    """
    backward = _ops().route_backward
    return _call(lambda: backward(queries, weights, sources, inv, grad_mixed, grad_lse, grad_weights, centered, eps),
                 lambda: _check(queries, sources, inv))


def _route_fake(queries: Tensor, sources: list[Tensor], inv: list[Tensor], eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """Shapes and dtypes of the forward's results, for tracing (the custom op and the C++ op alike)."""
    out_dtype, compute = compute_dtype(sources)
    shape = (queries.shape[0], *sources[0].shape[:-1])
    return (sources[0].new_empty((*shape, queries.shape[1]), dtype=out_dtype),
            sources[0].new_empty(shape, dtype=compute),
            sources[0].new_empty((*shape, len(sources)), dtype=compute))


def _route_into_fake(queries: Tensor, sources: list[Tensor], inv: list[Tensor], eps: float, mixed: list[Tensor],
                     lse: list[Tensor]) -> Tensor:
    return _route_fake(queries, sources, inv, eps)[2]


@torch.library.custom_op("attnres::route_sources_fused_backward", mutates_args=())
def _route_backward_op(queries: Tensor, weights: Tensor, sources: list[Tensor], inv: list[Tensor],
                       grad_mixed: Tensor | None, grad_lse: Tensor | None, grad_weights: Tensor | None,
                       centered: bool, eps: float) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    # Traced by AOTAutograd as an opaque op: the kernel reads addresses, which fake tensors have not.
    return _route_backward(queries, weights, sources, inv, grad_mixed, grad_lse, grad_weights, centered, eps)


@_route_backward_op.register_fake
def _(queries, weights, sources, inv, grad_mixed, grad_lse, grad_weights, centered, eps):
    return (torch.empty_like(queries), [torch.empty_like(v) for v in sources], [torch.empty_like(r) for r in inv])


def _route_op_forward(queries: Tensor, sources: list[Tensor], inv: list[Tensor], centered: bool,
                      eps: float) -> tuple[Tensor, Tensor, Tensor]:
    return _route_forward(queries, sources, inv, eps)


def _route_op_save(inputs, output) -> tuple:
    queries, sources, inv, centered, eps = inputs
    return queries, output[2], sources, inv, centered, eps  # references and per-token weights only


def _route_op_backward(saved, grad_mixed, grad_lse, grad_weights):
    queries, weights, sources, inv, centered, eps = saved
    grad_q, grad_sources, grad_inv = _route_backward_op(queries, weights, sources, inv, grad_mixed, grad_lse,
                                                        grad_weights, centered, eps)
    return grad_q, grad_sources, grad_inv, None, None


_route_op = compiled_op("attnres::route_sources_fused", _route_op_forward,
                        fake=lambda queries, sources, inv, centered, eps: _route_fake(queries, sources, inv, eps),
                        save=_route_op_save, backward=_route_op_backward)


def route_sources_fused(queries: Tensor, sources: list[Tensor], inv: list[Tensor] | None, *,
                        centered: bool = True, eps: float | None = None,
                        each: bool = False) -> tuple[Tensor | tuple[Tensor, ...], Tensor, Tensor]:
    """lean.route_sources on CPU in one fused C++ pass: S routers over the same n sources.

    queries (S, D): effective queries w * g; sources: n CPU tensors (B, T, D), fp32 / float64 /
    bf16 / fp16, possibly mixed; inv: n tensors (B, T) from `inv_rms`, or None with `eps`: then the
    kernel computes each source's inverse RMS, rsqrt(mean(v^2) + eps), in the pass that reads it
    anyway, and backward adds its gradient to d sources (what `inv_rms` then `route_sources` give,
    without inv_rms's own reads and writes of every source). Returns mixed (S, B, T, D) in the
    sources' promoted dtype, lse (S, B, T) and weights (S, B, T, n) in fp32 (float64 for float64
    sources). Backward keeps the weights and references to the inputs. Non-contiguous inputs are
    read through contiguous copies. Builds the extension on first use if it is not built.
    each=True: mixed comes as S tensors (B, T, D), in eager training each its own allocation, so that
    a router's input holds no other router's memory and its gradient reaches the kernel unstacked.
    """
    sources, inv = list(sources), [] if inv is None else list(inv)
    if not inv and eps is None:
        raise ValueError("route_sources_fused needs inv, or eps to compute it")
    eps = 0.0 if eps is None else float(eps)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (queries, *sources, *inv))
    if torch.compiler.is_compiling():
        _check(queries, sources, inv)
        result = _ops().route_forward(queries, sources, inv, eps) if not needs_grad else \
            _route_op(queries, sources, inv, centered, eps)
    elif not needs_grad:
        result = _route_forward(queries, sources, inv, eps)
    else:  # forward and backward in C++ (the kernel's autograd node), each router's mixture its own with `each`
        route = _ops().route_each if each else _ops().route
        mixed, lse, weights = _call(lambda: route(queries, sources, inv, eps, centered, _sinks(sources)),
                                    lambda: _check(queries, sources, inv))
        return (tuple(mixed) if each else mixed), lse, weights
    mixed, lse, weights = result
    return (mixed.unbind() if each else mixed), lse, weights



def route_sources_fused_split(queries: Tensor, sources: list[Tensor], inv: list[Tensor] | None, *,
                              eps: float | None = None) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...], Tensor]:
    """route_sources_fused without gradients, each router's results in tensors of their own: S mixtures
    (B, T, D), S log-sum-exps (B, T) and the weights (S, B, T, n). In a compiled step each router's
    results then start at offset 0 of their own buffers, so the code inductor generates around every
    router of a group is the same kernel, compiled once (decoding; docs/explanation/fast-paths.md).
    The buffers are allocated here and filled by the op, whose one tensor result (the weights) lets
    inductor's C++ wrapper call it without Python."""
    sources, inv = list(sources), [] if inv is None else list(inv)
    if not inv and eps is None:
        raise ValueError("route_sources_fused_split needs inv, or eps to compute it")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (queries, *sources, *inv)):
        raise ValueError("route_sources_fused_split computes no gradients; use route_sources_fused")
    if torch.compiler.is_compiling():
        _check(queries, sources, inv)
    out_dtype, compute = compute_dtype(sources)
    mixed = [sources[0].new_empty(sources[0].shape, dtype=out_dtype) for _ in range(queries.shape[0])]
    lse = [sources[0].new_empty(sources[0].shape[:-1], dtype=compute) for _ in range(queries.shape[0])]
    into = _ops().route_forward_into
    weights = _call(lambda: into(queries, sources, inv, 0.0 if eps is None else float(eps), mixed, lse),
                    lambda: _check(queries, sources, inv))
    return tuple(mixed), tuple(lse), weights


# ---------------------------------------------------------------- phase 2 of two-phase routing: the merge

def _merge_forward(mixed: Tensor, lse: Tensor, query: Tensor, sources: list[Tensor], inv: list[Tensor],
                   eps: float = 0.0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    forward = _ops().merge_forward
    return _call(lambda: forward(mixed, lse, query, sources, inv, eps),
                 lambda: _check_merge(mixed, lse, query, sources, inv))


def _merge_backward(query: Tensor, out: Tensor, keep: Tensor, take: Tensor, sources: list[Tensor],
                    inv: list[Tensor], mixed_dtype: torch.dtype, grad_out: Tensor | None, grad_total: Tensor | None,
                    grad_keep: Tensor | None, grad_take: Tensor | None, eps: float = 0.0):
    """two_phase._merge_backward in one C++ pass: gradients w.r.t. (mixed, lse, query, sources, inv).

    query (D,), out (..., D), keep (...), take (..., j), sources j x (..., D), inv j x (...) or []
    (computed in the kernel with eps, its gradient added to d sources); upstream gradients may be None.
    Returns (d mixed in mixed_dtype or None without grad_out, d lse, d query, d sources, d inv ([] when inv is [])).
    """
    backward = _ops().merge_backward
    grad_mixed, *rest = _call(
        lambda: backward(query, out, keep, take, sources, inv, grad_out, grad_total, grad_keep, grad_take,
                         mixed_dtype, eps),
        lambda: _check_merge(out, keep, query, sources, inv))
    return (grad_mixed[0] if grad_mixed else None), *rest


def _merge_fake_dtypes(mixed: Tensor, lse: Tensor, sources: list[Tensor]) -> tuple[torch.dtype, torch.dtype]:
    """(out's dtype, the statistics' dtype), as the kernel promotes them."""
    out_dtype, compute = compute_dtype([mixed, *sources])
    return out_dtype, torch.promote_types(compute, lse.dtype)


def _merge_fake(mixed: Tensor, lse: Tensor, query: Tensor, sources: list[Tensor], inv: list[Tensor],
                eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Shapes and dtypes of the merge's results, for tracing (the custom op and the C++ op alike)."""
    out_dtype, compute = _merge_fake_dtypes(mixed, lse, sources)
    return (mixed.new_empty(mixed.shape, dtype=out_dtype), lse.new_empty(lse.shape, dtype=compute),
            lse.new_empty(lse.shape, dtype=compute), lse.new_empty((*lse.shape, len(sources)), dtype=compute))


@torch.library.custom_op("attnres::merge_sources_fused_backward", mutates_args=())
def _merge_backward_op(query: Tensor, out: Tensor, keep: Tensor, take: Tensor, sources: list[Tensor],
                       inv: list[Tensor], grad_out: Tensor | None, grad_total: Tensor | None,
                       grad_keep: Tensor | None, grad_take: Tensor | None, mixed_dtype: torch.dtype,
                       eps: float) -> tuple[list[Tensor], Tensor, Tensor, list[Tensor], list[Tensor]]:
    # A custom op returns no optional tensor: d mixed comes as a list of zero or one.
    grad_mixed, *rest = _merge_backward(query, out, keep, take, sources, inv, mixed_dtype, grad_out, grad_total,
                                        grad_keep, grad_take, eps)
    return ([] if grad_mixed is None else [grad_mixed]), *rest


@_merge_backward_op.register_fake
def _(query, out, keep, take, sources, inv, grad_out, grad_total, grad_keep, grad_take, mixed_dtype, eps):
    grad_mixed = [] if grad_out is None else [out.new_empty(out.shape, dtype=mixed_dtype)]
    return (grad_mixed, torch.empty_like(keep), torch.empty_like(query), [torch.empty_like(v) for v in sources],
            [torch.empty_like(r) for r in inv])


def _merge_op_forward(mixed: Tensor, lse: Tensor, query: Tensor, sources: list[Tensor], inv: list[Tensor],
                      eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _merge_forward(mixed, lse, query, sources, inv, eps)


def _merge_op_save(inputs, output) -> tuple:
    mixed, _, query, sources, inv, eps = inputs
    out, _, keep, take = output
    return query, out, keep, take, sources, inv, mixed.dtype, eps  # never the mixture


def _merge_op_backward(saved, grad_out, grad_total, grad_keep, grad_take):
    query, out, keep, take, sources, inv, mixed_dtype, eps = saved
    grad_mixed, grad_lse, grad_q, grad_sources, grad_inv = _merge_backward_op(
        query, out, keep, take, sources, inv, grad_out, grad_total, grad_keep, grad_take, mixed_dtype, eps)
    return (grad_mixed[0] if grad_mixed else None), grad_lse, grad_q, grad_sources, grad_inv, None


_merge_op = compiled_op("attnres::merge_sources_fused", _merge_op_forward, fake=_merge_fake, save=_merge_op_save,
                        backward=_merge_op_backward)


def merge_sources_fused(mixed: Tensor, lse: Tensor, query: Tensor, sources: list[Tensor], inv: list[Tensor] | None,
                        *, eps: float | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Phase 2 of two-phase routing (two_phase._merge_forward's function) in one fused C++ pass.

    mixed (B, T, D) and lse (B, T): one router's phase-1 mixture and log-sum-exp; query (D,) its
    effective query; sources: j >= 1 CPU tensors (B, T, D) (fp32 / float64 / bf16 / fp16, possibly
    mixed); inv: j tensors (B, T), or None with `eps`: computed in the kernel, rsqrt(mean(v^2) + eps),
    its gradient added to d sources. Logits l_i = inv_i <query, v_i>. Returns (out (B, T, D) in the
    promoted dtype of mixed and the sources, total = logaddexp(lse, logsumexp_i l_i) (B, T),
    keep = exp(lse - total) (B, T), take = exp(l - total) (B, T, j)); statistics in fp32 (float64
    when an input is float64). Backward keeps out, keep, take and references to query, sources and
    inv, never the mixture.
    """
    sources, inv = list(sources), [] if inv is None else list(inv)
    if not inv and eps is None:
        raise ValueError("merge_sources_fused needs inv, or eps to compute it")
    eps = 0.0 if eps is None else float(eps)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (mixed, lse, query, *sources, *inv))
    if torch.compiler.is_compiling():
        _check_merge(mixed, lse, query, sources, inv)
        if not needs_grad:
            return _ops().merge_forward(mixed, lse, query, sources, inv, eps)
        return _merge_op(mixed, lse, query, sources, inv, eps)
    if not needs_grad:
        return _merge_forward(mixed, lse, query, sources, inv, eps)
    merge = _ops().merge  # forward and backward in C++ (the kernel's autograd node)
    into = _sinks(sources)
    return _call(lambda: merge(mixed, lse, query, sources, inv, eps, into),
                 lambda: _check_merge(mixed, lse, query, sources, inv))


# ---------------------------------------------------------------- gradient sinks

_SINK = "_attnres_gradient_sink"


def collect_source(source: Tensor) -> Tensor:
    """`source` as a view whose gradient from the fused kernels is summed in one buffer (eager training).

    A source that many routing calls read (a sub-layer output under Full or Delta AttnRes is read by
    every later chunk's phase 1 and by the merges of its own chunk) gets one gradient per call, which
    autograd adds one by one, each written, read back and added in the source's dtype: in bf16 that was
    about a quarter of Full AttnRes's routing cost. A collected source carries a sink, an empty buffer
    in the compute dtype (fp32, float64 for float64); each call's backward adds d source into it in
    its own pass (the first one writes), and the view's backward node hands the sum on once, in the
    source's dtype, then frees it. The kernels use a sink only in a backward that runs every node
    (loss.backward()); `autograd.grad` and backward(inputs=...) get d sources as before.
    Returns `source` itself where this does not apply: no gradient needed, under torch.compile, a
    source off the CPU or of a dtype the kernels do not read.
    """
    if (not torch.is_grad_enabled() or not source.requires_grad or torch.compiler.is_compiling()
            or source.device.type != "cpu" or source.dtype not in SUPPORTED_DTYPES or not fused_available()):
        return source
    sink = source.new_empty(0, dtype=compute_dtype([source])[1])
    collected = _ops().collect(source, sink)
    setattr(collected, _SINK, sink)
    return collected


def _sinks(sources: list[Tensor]) -> list[Tensor | None]:
    """Each source's gradient sink (`collect_source`), or None."""
    return [getattr(v, _SINK, None) for v in sources]


_probe()
