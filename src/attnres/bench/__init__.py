"""`attnres bench`: the cost of each residual variant against `standard`, measured in one process.

Training step time, step memory (activations separated), prefill and per-token decode time, a
sweep over depth, and a router micro-benchmark against the machine's copy bandwidth; each timing
the median of interleaved repeats. Output: bench.json and bench.md.
"""

from attnres.bench.bench_config import BenchConfig, resolve_config
from attnres.bench.model_bench import run_depth_sweep, run_model_bench
from attnres.bench.report import format_markdown, write_report
from attnres.bench.router_bench import router_bytes, run_router_bench
from attnres.bench.run_bench import run_bench
from attnres.train.timing import Task, Timing, run_interleaved  # re-exported: the timing bench uses

__all__ = ["BenchConfig", "Task", "Timing", "format_markdown", "resolve_config", "router_bytes", "run_bench",
           "run_depth_sweep", "run_interleaved", "run_model_bench", "run_router_bench", "write_report"]
