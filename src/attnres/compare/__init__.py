"""`attnres compare`: train residual variants on the same data and seeds; the report is in `attnres.report`."""

from attnres.compare.presets import load_preset
from attnres.compare.run_comparison import run_compare
from attnres.compare.tune import run_preset, run_protocol

__all__ = ["load_preset", "run_compare", "run_preset", "run_protocol"]
