"""When compiling the decode step pays: the rule, and the measured compile times it reads.

On a GPU a compile of about a minute is repaid within seconds; on a few CPU cores it is repaid
only after hundreds or thousands of tokens (results/generate-speed has the compile times and
speed-ups measured on a 2-core CPU). So
with `compile="auto"` a generation first times a few steps of the eager fixed-shape step, then
compiles only if

    expected compile seconds  <  steps left x eager step seconds x (1 - 1 / expected speed-up)

The expected compile time and speed-up are the ones measured on this machine for this model
shape (`CompileTimes`, a JSON file beside inductor's cache, so the estimate lives as long as the
compiled code does): after a first compile the code is in inductor's cache and the next process
expects a warm start. Without a measurement the priors below stand in.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from attnres.common.atomic import write_atomic

# Priors, used until this machine has measured a compile of the model shape:
# a cold compile (inductor's Python wrapper, fused routing) takes about this long per sub-layer:
# twice what results/generate-speed measured on 2 cores, for slower CPUs and the lean routing ops
# (without the fused extension), so an unmeasured compile is not started lightly.
PRIOR_COMPILE_S_PER_SUBLAYER = 1.5
# eager fixed-shape step / compiled step: below what results/bench-fp32 measured at 24 x 256.
PRIOR_SPEEDUP = 2.0
# a start from inductor's cache, as a share of the cold compile, until a warm start is measured.
PRIOR_WARM_SHARE = 0.2
PROBE_STEPS = 2  # eager steps timed before deciding
FILE_NAME = "attnres-compile-times.json"


@dataclass(frozen=True)
class CompileEstimate:
    """What a compile is expected to cost (compile_s) and gain (speedup: eager step / compiled step);
    measured: whether both come from this machine's records rather than the priors."""

    compile_s: float
    speedup: float
    measured: bool


def compile_pays(estimate: CompileEstimate, eager_step_s: float, steps_left: int) -> bool:
    """The rule: compile when the expected compile takes less than it saves over the steps left."""
    return estimate.compile_s < saved_seconds(estimate, eager_step_s, steps_left)


def saved_seconds(estimate: CompileEstimate, eager_step_s: float, steps_left: int) -> float:
    """What compiling is expected to save over the steps left (negative never; 0 when it saves nothing)."""
    return max(0.0, steps_left * eager_step_s * (1.0 - 1.0 / estimate.speedup))


def shape_key(config: dict, **shape) -> str:
    """A short key of a model config (dict) and the step's shape and settings on this machine and torch."""
    described = {"model": config, **{k: str(v) for k, v in shape.items()}, "torch": torch.__version__,
                 "cpu": platform.processor() or platform.machine(),
                 "aten": torch.backends.cpu.get_cpu_capability()}
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()[:16]


def inductor_cache_file(name: str) -> Path:
    """The file `name` beside inductor's cache (`torch._inductor`'s cache_dir): what is kept there lives
    as long as the compiled code does."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / name


def read_records(path: Path) -> dict:
    """The JSON mapping of records in `path`; an unreadable file counts as none (it only informs a guess)."""
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return values if isinstance(values, dict) else {}


def write_records(path: Path, records: dict) -> bool:
    """Write `records` to `path` atomically; False where it cannot be written (a read-only cache only
    costs a measurement next time, never the caller its figure)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(records, indent=1, sort_keys=True))
    except OSError:
        return False
    return True


class CompileTimes:
    """Compile times measured per machine and model shape: a JSON file of {key: {"cold_s", "warm_s",
    "speedup"}}, by default beside inductor's cache (`inductor_cache_file`), written atomically."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else inductor_cache_file(FILE_NAME)

    def read(self) -> dict:
        """Every record (`read_records`)."""
        return read_records(self.path)

    def estimate(self, key: str, num_sublayers: int) -> CompileEstimate:
        """The expected compile time and speed-up of shape `key` (a model of num_sublayers sub-layers)."""
        record = self.read().get(key)
        if not isinstance(record, dict) or not isinstance(record.get("cold_s"), (int, float)):
            return CompileEstimate(PRIOR_COMPILE_S_PER_SUBLAYER * num_sublayers, PRIOR_SPEEDUP, measured=False)
        warm = record.get("warm_s")
        compile_s = warm if isinstance(warm, (int, float)) else PRIOR_WARM_SHARE * record["cold_s"]
        speedup = record.get("speedup")
        return CompileEstimate(float(compile_s), float(speedup) if isinstance(speedup, (int, float)) and speedup > 0
                               else PRIOR_SPEEDUP, measured=isinstance(warm, (int, float)))

    def record(self, key: str, compile_s: float, speedup: float | None) -> None:
        """Store a measured compile: the first of a shape is cold; a later one that took under half of
        the cold one is a warm start from inductor's cache (a longer one means the cache was emptied)."""
        records = self.read()
        entry = dict(records.get(key) or {})
        cold = entry.get("cold_s")
        if not isinstance(cold, (int, float)) or compile_s > 0.5 * cold:
            entry["cold_s"] = compile_s
            entry.pop("warm_s", None)
        else:
            entry["warm_s"] = compile_s
        if speedup is not None and speedup > 0:
            entry["speedup"] = speedup
        records[key] = entry
        write_records(self.path, records)
