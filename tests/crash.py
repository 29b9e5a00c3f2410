"""Kill an `attnres` command in the middle of a write, and check what it leaves: the crash-consistency tests.

`run_cli` runs `attnres ARGV` in a child process that can SIGKILL itself at a chosen write (`Kill`): a
real crash, nothing flushed or cleaned up, at a reproducible place. The child traces, through a Python
audit hook, every file opened for writing and every rename under a folder, so one uninterrupted run
also shows how each file reaches its final name (`non_atomic_writes`). Writes made outside Python
(safetensors' Rust writer) are not traced; attnres makes them inside temporary folders, whose rename is.

Children fork from a server that imported attnres, torch and transformers once (multiprocessing's
forkserver; the server only imports, so no thread pool exists when it forks), so a run costs its own
work, not the imports.

Where a test kills at a seeded random write, the seed is 0, or $ATTNRES_CRASH_SEED for a longer local
run over other points: `for s in $(seq 1 20); do ATTNRES_CRASH_SEED=$s pytest tests -k crash_consistency; done`.
"""

from __future__ import annotations

import fnmatch
import json
import multiprocessing
import os
import random
import signal
import struct
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from attnres.report.folder import MANIFEST

PRELOAD = ["attnres.cli", "attnres.compare.run_comparison", "attnres.report.compare_report", "attnres.scaling.sweep",
           "attnres.scaling.summary", "attnres.report.scaling_report", "attnres.bench", "attnres.hf.export",
           "attnres.hf.modeling", "tests.crash"]  # tests.crash: where each child's `_child` comes from
APPEND_LOGS = ("metrics.jsonl",)  # appended a line at a time; a resumed run rewrites it (atomically) first
PNG_END = b"IEND\xaeB`\x82"
SEED = int(os.environ.get("ATTNRES_CRASH_SEED", "0"))  # of the random kill points


@dataclass(frozen=True)
class Kill:
    """Where the child dies: at the `nth` event of kind `event` whose path matches the glob `path` (a `*`
    matches across folders).

    "open": a file opened for writing, killed before anything is written into it. "rename": a finished
    temporary file or folder about to be renamed to a final name (the path matched): its largest file is
    first cut to half its size, as a kill in the middle of writing it leaves it, then the child dies
    before the rename."""

    event: str
    path: str = "*"
    nth: int = 1
    exclude: str | None = None  # a glob of paths not counted

    def matches(self, kind: str, path: str) -> bool:
        return kind == self.event and fnmatch.fnmatchcase(path, self.path) and not (
            self.exclude and fnmatch.fnmatchcase(path, self.exclude))


@dataclass(frozen=True)
class Result:
    """A finished child: its exit status (-9: killed), output, and the traced events: ("open", path) for a
    file opened for writing, ("rename", destination, source), in order."""

    returncode: int
    stdout: str
    stderr: str
    events: list[tuple]

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL


def run_cli(argv: list[str], root: Path, env: dict[str, str], kill: Kill | None = None,
            timeout: float = 180) -> Result:
    """`attnres ARGV` in a child process with `env` added to its environment, tracing writes under `root`,
    killed at `kill` (None: runs to the end)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # read when the server starts: the first call of the session
    with tempfile.TemporaryDirectory() as logs:
        logs = Path(logs)
        child = context.Process(target=_child, args=(argv, str(Path(root).resolve()), env, kill, str(logs)))
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise AssertionError(f"attnres {' '.join(argv)} ran past {timeout} s")
        events = [tuple(json.loads(line)) for line in (logs / "trace").read_text().splitlines()]
        return Result(child.exitcode, (logs / "stdout").read_text(), (logs / "stderr").read_text(), events)


def _child(argv, root, env, kill, logs) -> None:
    os.environ.update(env)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        os.dup2(os.open(os.path.join(logs, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    # line-buffered: what a killed child printed before the kill is there to read
    sys.stdout, sys.stderr = open(1, "w", buffering=1, closefd=False), open(2, "w", buffering=1, closefd=False)
    trace = os.open(os.path.join(logs, "trace"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    from tqdm.std import TqdmDefaultWriteLock

    TqdmDefaultWriteLock.mp_lock = None  # no lock between processes: a killed child leaks no semaphore
    sys.addaudithook(_Tracer(root, trace, kill))
    from attnres.cli import main

    sys.exit(main(argv))


class _Tracer:
    """The audit hook: writes each traced event as a line (unbuffered: a kill loses none) and kills at `kill`."""

    def __init__(self, root: str, trace_fd: int, kill: Kill | None) -> None:
        self.root, self.trace_fd, self.kill, self.seen, self.busy = root + os.sep, trace_fd, kill, 0, False

    def __call__(self, event: str, args: tuple) -> None:
        if self.busy or event not in ("open", "os.rename"):
            return
        if event == "open":
            path, _, flags = args
            if not isinstance(path, (str, bytes, os.PathLike)) or not isinstance(flags, int) \
                    or not flags & (os.O_WRONLY | os.O_RDWR):
                return
            kind, source = "open", None
        else:
            kind, source, path = "rename", os.path.abspath(os.fsdecode(args[0])), args[1]
        path = os.path.abspath(os.fsdecode(path))
        if not path.startswith(self.root):
            return
        self.busy = True  # what the hook itself does raises audit events too
        try:
            os.write(self.trace_fd, (json.dumps([kind, path, source]) + "\n").encode())
            kill = self.kill
            if kill is not None and kill.matches(kind, path):
                self.seen += 1
                if self.seen == kill.nth:
                    if kind == "rename":
                        _cut_in_half(Path(source))
                    os.kill(os.getpid(), signal.SIGKILL)
        finally:
            self.busy = False


def _cut_in_half(path: Path) -> None:
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    if files:
        largest = max(files, key=lambda p: p.stat().st_size)
        os.truncate(largest, largest.stat().st_size // 2)


def random_kill(reference: Result, kind: str, path: str, exclude: str | None, reference_root: Path, root: Path,
                seed: int = SEED) -> Kill:
    """A kill at a seeded random one of the `kind` events whose path matches `path` (and not `exclude`) in
    `reference`, a run into `reference_root`; `path` and `exclude` are globs below the root folder
    ("/*"), and the kill is for a run into `root`."""
    ref, out = str(Path(reference_root).resolve()), str(Path(root).resolve())
    probe = Kill(kind, ref + path, exclude=exclude and ref + exclude)
    count = sum(probe.matches(event[0], event[1]) for event in reference.events)
    assert count, f"the reference run made no {kind} event matching {path!r}"
    return Kill(kind, out + path, random.Random(seed).randrange(count) + 1, exclude and out + exclude)


def shared_cache(tmp_path_factory) -> str:
    """One data cache for every crash test of the session: the demo corpus is prepared once."""
    path = tmp_path_factory.getbasetemp() / "crash-cache"
    path.mkdir(exist_ok=True)
    return str(path)


# ---------------------------------------------------------------- checks


def hidden(path: Path, root: Path) -> bool:
    """True for a path under a temporary name: a part below `root` starting with "." (attnres's
    temporary files and folders all do: `.NAME.*.tmp`, checkpoints' `.tmp-*`)."""
    return any(part.startswith(".") for part in Path(path).relative_to(root).parts)


def non_atomic_writes(result: Result, root: Path) -> list[str]:
    """The files `result` opened for writing under a final name below `root`, not renamed afterwards:
    each a window in which a kill leaves a partial file that a reader takes for the real one.
    `APPEND_LOGS` are allowed."""
    root = Path(root).resolve()
    renamed = {event[2] for event in result.events if event[0] == "rename"}
    return sorted({path for kind, path, *_ in result.events if kind == "open" and Path(path).is_relative_to(root)
                   and not hidden(Path(path), root) and path not in renamed and Path(path).name not in APPEND_LOGS})


def assert_whole(root: Path) -> list[Path]:
    """Check that every file under `root` with a final name reads whole: JSON, JSONL and YAML parse, a PNG
    ends with its IEND chunk, an HTML page with </html>, a safetensors file is as long as its header
    says, anything else is not empty. Returns the temporary (hidden) files and folders left there (not
    the lock files of `attnres.checkpoint.run_lock`, which a killed holder leaves by design)."""
    root = Path(root)
    leftovers = []
    for path in sorted(root.rglob("*")):
        if path.name == MANIFEST:  # a report folder's record of what wrote it: a final name, hidden
            _assert_file_whole(path)
        elif hidden(path, root):
            # a killed holder's lock file is no half-written file: the next holder takes it over
            if path.name.startswith(".") and not (path.name.startswith(".attnres.") and path.suffix == ".lock"):
                leftovers.append(path)
            continue
        if path.is_file():
            _assert_file_whole(path)
    return leftovers


def _assert_file_whole(path: Path) -> None:
    data = path.read_bytes()
    try:
        if path.suffix == ".json":
            json.loads(data)
        elif path.suffix == ".jsonl":
            for line in data.decode().splitlines():
                if line.strip():
                    json.loads(line)
        elif path.suffix in (".yaml", ".yml"):
            assert yaml.safe_load(data) is not None
        elif path.suffix == ".png":
            assert data.endswith(PNG_END), "no IEND chunk at the end"
        elif path.suffix == ".html":
            assert data.rstrip().endswith(b"</html>"), "no </html> at the end"
        elif path.suffix == ".safetensors":
            (size,) = struct.unpack("<Q", data[:8])
            header = json.loads(data[8:8 + size])
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
            assert len(data) == 8 + size + end, f"{len(data)} bytes, the header says {8 + size + end}"
        else:
            assert data, "empty"
    except (AssertionError, ValueError, struct.error, yaml.YAMLError) as error:
        raise AssertionError(f"{path} is visible under its final name but is not whole: {error}") from None


def snapshot(root: Path, pattern: str) -> dict[str, tuple[int, bytes]]:
    """{path relative to root: (mtime_ns, content)} of the files matching `pattern` (rglob): what a rerun
    must leave untouched."""
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(Path(root).rglob(pattern))}
