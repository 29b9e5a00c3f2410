"""The result files a page's figures come from, and the provenance line each generated table carries.

`Results` reads the committed files under a repository's results/ folder, each once, and refuses a
missing one by name. `provenance` turns what a result file
records about itself (its command, date, machine and code path) into the line under a table.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from attnres.common.errors import InputError

RESULTS_DIR = "results"


class ResultMissing(FileNotFoundError):
    """A block needs a result file that is not there (the message names it and the block)."""


class Results:
    """Read-only access to `root`/results/*: JSON files parsed once."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._cache: dict[str, object] = {}

    def path(self, relative: str) -> Path:
        """The file `results/relative`; ResultMissing when it does not exist."""
        path = self.root / RESULTS_DIR / relative
        if not path.is_file():
            raise ResultMissing(f"{RESULTS_DIR}/{relative} is missing")
        return path

    def json(self, relative: str):
        """The parsed JSON file `results/relative`."""
        path = self.path(relative)
        if relative not in self._cache:
            try:
                self._cache[relative] = json.loads(path.read_text())
            except json.JSONDecodeError as error:
                raise InputError(f"{RESULTS_DIR}/{relative} is not valid JSON: {error}") from None
        return self._cache[relative]

    def jsonl(self, relative: str) -> list[dict]:
        """The records of the JSON-lines file `results/relative`."""
        return [json.loads(line) for line in self.path(relative).read_text().splitlines() if line.strip()]


def cpu_words(machine: dict | None) -> str:
    """'2 threads of an Intel Xeon (ATen AVX512, native bf16)' from a result's `machine` record."""
    if not machine:
        return "a CPU not recorded"
    name = " ".join(str(machine.get("device_name") or "").replace("(R)", "").replace(" Processor", "").split())
    name = f"an {name}" if name and name[0].upper() in "AEIOU" else f"a {name}" if name else "an unnamed CPU"
    if str(machine.get("device", "cpu")).startswith("cuda"):
        return f"{name} (CUDA)"
    bf16 = {True: "native bf16", False: "bf16 emulated"}.get(machine.get("cpu_native_bf16"), "bf16 not recorded")
    capability = machine.get("cpu_capability")
    kernels = f"ATen {capability}" if capability else "ATen level not recorded"
    threads = machine.get("threads")
    who = f"{threads} thread{'s' if threads != 1 else ''} of {name}" if threads else name
    # The C library's malloc goes unsaid; another allocator moves every time (docs/how-to/measure-cost.md).
    allocator = machine.get("cpu_allocator")
    allocator = f", {allocator}" if allocator and allocator != "libc" else ""
    return f"{who} ({kernels}, {bf16}{allocator})"


def recorded_code_path(result: dict) -> dict:
    """A result's code path as recorded: its `code_path`, else the precision its run settings name
    (older results did not record the routing implementation)."""
    if result.get("code_path"):
        return result["code_path"]
    precision = ((result.get("settings") or {}).get("train") or {}).get("precision")
    return {"precision": precision} if precision else {}


def code_path_words(code_path: dict | None) -> str:
    """'fp32, routing auto (fused)' from a result's precision and routing implementation."""
    if not code_path:
        return "code path not recorded"
    precision = code_path.get("precision", "precision not recorded")
    impl, resolved = code_path.get("routing_impl"), code_path.get("routing")
    if impl is None:
        return f"{precision}, routing implementation not recorded"
    if impl == "none":  # a measurement that runs no router (a conversion)
        return f"{precision}, no routing"
    return f"{precision}, routing {impl}" + (f" ({resolved})" if resolved and resolved != impl else "")


def moved_note(command: str | None, source: str) -> str:
    """' (written to OUT, since moved)' when the command's --out is neither the folder of `source` (a
    link to the result file) nor a file in it; empty otherwise."""
    out = re.search(r"--out[ =](\S+)", command or "")
    folder = re.search(r"\((?:\.\./)*(results/[^)]*)/[^/)]+\)", source)
    if out and folder:
        written = out.group(1).rstrip("/")
        if written != folder.group(1) and written.rsplit("/", 1)[0] != folder.group(1):
            return f" (written to `{out.group(1)}`, since moved)"
    return ""


# A script a recorded command ran from benchmarks/ or scripts/, folders that now live under tools/:
# the set-up and check scripts at its top, the study scripts in tools/studies/.
_MOVED_SCRIPT = re.compile(r"(?<![\w/.-])(benchmarks|scripts)/([\w.]+)")
_TOP_LEVEL_TOOLS = {"compare.sh", "setup_env.sh", "test.sh", "test_deps.sh", "test_kernel_paths.sh", "wheel_check.sh",
                    "wheel_smoke.py"}


def moved_script_note(command: str | None) -> str:
    """' (the script is now tools/...)' when the recorded command ran a script that has since moved
    under tools/; empty otherwise. The command itself is shown as it ran."""
    found = _MOVED_SCRIPT.search(command or "")
    if not found:
        return ""
    folder, name = found.groups()
    where = "tools/benchmarks" if folder == "benchmarks" else "tools" if name in _TOP_LEVEL_TOOLS else "tools/studies"
    return f" (the script is now `{where}/{name}`)"


def provenance(result: dict, source: str, *, code_path: dict | None = None, what: str = "Measured") -> str:
    """The italic line under a generated table: command, date, CPU, code path, and `source` (a link to
    the result file it came from)."""
    command = result.get("command")
    date = str(result.get("created", "date not recorded"))[:10]
    parts = [f"{what} {date} on {cpu_words(result.get('machine'))}",
             code_path_words(code_path if code_path is not None else recorded_code_path(result)),
             f"torch {result['machine']['torch']}" if result.get("machine", {}).get("torch") else None]
    by = f" by `{command}`{moved_note(command, source)}{moved_script_note(command)}" if command else ""
    return "*" + "; ".join(p for p in parts if p) + f"{by}. Source: {source}.*"
