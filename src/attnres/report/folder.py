"""Report folders are replaced only by the command that wrote them, or when asked (`--force`).

`attnres compare`, `scaling`, `bench` and `analyze` write a report into a folder (`--out`). Before any
work, `check_report_folder` refuses a folder that holds anything else: files attnres did not write
there (a user's own `summary.md`), or the report of another command or of other inputs (a second
`analyze` of other checkpoints into the default folder). A rerun of the same command on the same inputs
is not refused: that is how an interrupted comparison resumes and a report is regenerated (analyze's
inputs include its options, so an identical rerun writes an identical report). A bench report holds
timings a rerun would not reproduce, so a rerun into it is refused too. Once the report is written,
`mark_report_folder` records what wrote it in `MANIFEST`. A folder written before manifests existed
is recognised by its own files (`_RECOGNISED`). Log files (`*.log`) are not counted: no command writes
one, so none is replaced, and for `attnres compare --out X > X/shard0.log` the shell creates the log
before the command looks.
"""

from __future__ import annotations

import json
from pathlib import Path

from attnres.common.atomic import write_atomic
from attnres.common.errors import InputError

MANIFEST = ".attnres-report.json"

# command -> (its results file, keys that file always has): how a folder written before manifests is known
_RECOGNISED = {
    "compare": ("results.json", {"preset", "variants", "summary"}),
    "scaling": ("results.json", {"preset", "sizes", "fit"}),
    "bench": ("bench.json", {"config", "models"}),
    "analyze": ("analysis.json", {"settings", "checkpoints"}),
}
_RUN_FOLDERS = ("compare", "scaling")  # commands whose folder holds runs/ while it is under way


def check_report_folder(out: Path, command: str, inputs: object = None, force: bool = False,
                        rerun: bool = True) -> None:
    """InputError unless `out` is missing, empty, or holds the report of `command` on the same `inputs`
    (any JSON value: the preset's name, the checkpoints analysed and the options) and `rerun` allows
    rewriting it (False for a report of measurements that a rerun would not reproduce); with `force`,
    nothing is refused and files of the report's names are replaced."""
    if force or not out.is_dir():
        return
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith(".attnres") and p.suffix != ".log")
    manifest = _read_json(out / MANIFEST)
    if not isinstance(manifest, dict):  # none; an earlier release's report is recognised by its files
        written = names and _written_by(out, command)
        manifest = {"command": command, "inputs": _plain(inputs)} if written else None
    if manifest is not None:
        if manifest.get("command") == command and manifest.get("inputs") == _plain(inputs):
            if rerun:
                return
            raise InputError(f"--out {out} holds an earlier attnres {command} report, whose measurements a rerun "
                             f"would not reproduce; choose another --out, or pass --force to replace it")
        what = f"the report of attnres {manifest.get('command')}"
        if manifest.get("command") == command:
            what += f" on other inputs ({_difference(manifest.get('inputs'), _plain(inputs))})"
        raise InputError(f"--out {out} holds {what}; choose another --out, or pass --force to replace it")
    if not names:
        return
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    raise InputError(f"--out {out} holds files attnres {command} did not write ({shown}); choose another --out "
                     f"(a new or empty folder), or pass --force to write the report there, replacing files of "
                     f"the same names")


def mark_report_folder(out: Path, command: str, inputs: object = None) -> None:
    """Record in `out` that `command` wrote its report there from `inputs` (after the report is written)."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / MANIFEST, json.dumps({"command": command, "inputs": _plain(inputs)}, indent=2) + "\n")


def _read_json(path: Path) -> object:
    """The JSON value in `path`; None where it is missing or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _written_by(out: Path, command: str) -> bool:
    """Whether `out`, without a manifest, holds `command`'s results file or (for a comparison under way)
    its runs/ folder."""
    filename, keys = _RECOGNISED[command]
    results = _read_json(out / filename)
    if isinstance(results, dict) and keys <= set(results):
        return True
    return command in _RUN_FOLDERS and (out / "runs").is_dir()


def _plain(inputs: object) -> object:
    """`inputs` as JSON reads it back (tuples as lists, paths as strings)."""
    return json.loads(json.dumps(inputs, default=str))


def _difference(there: object, now: object) -> str:
    """What differs between two reports' inputs, e.g. "max_batches: 4 there, 2 now"."""
    if isinstance(there, dict) and isinstance(now, dict):
        keys = sorted(key for key in set(there) | set(now) if there.get(key) != now.get(key))
        return "; ".join(f"{key}: {_describe(there.get(key))} there, {_describe(now.get(key))} now" for key in keys)
    return f"{_describe(there)} there, {_describe(now)} now"


def _describe(inputs: object) -> str:
    return ", ".join(map(str, inputs)) if isinstance(inputs, list) else str(inputs)
