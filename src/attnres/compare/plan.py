"""The plan of a fair-comparison protocol study (`attnres compare --dry-run`): every run the protocol makes,
each variant's parameters and tokens per parameter, training FLOPs, GPU-hours at a stated throughput and the
torchrun command of each kind of run. Pure: it reads no data, trains nothing and writes nothing.

The runs (docs/explanation/protocol.md, `attnres.compare.protocol`): every variant trains grid_seeds seeds
(0 ... grid_seeds - 1) at every rate of lr_grid; where its choice lands on the grid's edge, up to
max_extensions further rates with grid_seeds seeds each (`search_rates`: known only once its grid is done,
so counted as a bound); then its final seeds (`Protocol.final_seeds`) at its fitted rate.

FLOPs are `attnres.model.flops`'s training count: 3 x the forward's projections, full T x T attention, LM
head and depth mixing; evaluation is not counted. GPU-hours = FLOPs / (peak x MFU) (`Throughput`).

Under torchrun: `attnres compare` trains in one process and joins no process group, so each run is launched
on its own as `torchrun ... -m attnres train --config OUT/base-run.yaml --device cuda --set ...` into the
folder `attnres compare` gives it, with exactly the settings compare would train it with (`train_command`).
A later `attnres compare --out OUT` takes such a finished run up by resuming its last checkpoint (it trains
nothing again), evaluates it on the validation and test splits and writes its record.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from attnres.common.checks import check_int, check_positive_number, is_number
from attnres.common.errors import InputError
from attnres.compare.presets import ComparePreset
from attnres.compare.protocol import Protocol
from attnres.compare.tune import rate_run
from attnres.model.flops import flops_per_token, parameter_count
from attnres.report.variant_names import variant_name
from attnres.train.run_config import AUTO, RunConfig, RunConfigError

BASE_CONFIG = "base-run.yaml"  # in --out: the preset's run, which every torchrun command reads
PER_RUN = (("model", "residual"), ("train", "lr"), ("train", "min_lr"), ("train", "seed"))  # set on every command


@dataclass(frozen=True)
class Throughput:
    """What GPU-hours assume: a GPU's peak FLOP/s (`peak_tflops`, TFLOP/s, dense, in the run's precision),
    the fraction of it training achieves (`mfu`, in (0, 1]) and the GPU's `name`."""

    peak_tflops: float = 989.0
    mfu: float = 0.4
    name: str = "H100 SXM, bf16 dense"

    def __post_init__(self) -> None:
        check_positive_number(self.peak_tflops, "throughput.peak_tflops")
        if not is_number(self.mfu) or not 0 < self.mfu <= 1:
            raise InputError(f"throughput.mfu must be a number in (0, 1], got {self.mfu!r}")

    @property
    def flops_per_s(self) -> float:
        """Achieved FLOP/s of one GPU: peak x MFU."""
        return self.peak_tflops * 1e12 * self.mfu

    def hours(self, flops: float) -> float:
        """GPU-hours for `flops` FLOPs."""
        return flops / self.flops_per_s / 3600.0


@dataclass(frozen=True)
class VariantPlan:
    """One variant's share of the study. spec: its preset entry; parameters: every parameter, embeddings
    included (the protocol's count); non_embedding: without the token embedding and an untied head;
    tokens: per run; flops_per_run: training FLOPs of one run; grid_runs: rates x grid seeds;
    extension_runs: the most its edge extensions add (max_extensions x grid seeds); final_seeds: its
    final runs' seeds."""

    name: str
    spec: dict
    primary: bool
    parameters: int
    non_embedding: int
    tokens: int
    flops_per_run: float
    grid_runs: int
    extension_runs: int
    final_seeds: tuple[int, ...]

    @property
    def tokens_per_parameter(self) -> float:
        return self.tokens / self.parameters

    @property
    def runs(self) -> int:
        """Grid and final runs, no extension."""
        return self.grid_runs + len(self.final_seeds)

    @property
    def max_runs(self) -> int:
        """Runs with every extension the search may add."""
        return self.runs + self.extension_runs


@dataclass(frozen=True)
class PlannedRun:
    """One run: its stage ("grid" or "final"), variant name, peak rate (None for a final run: the
    variant's fitted rate, known once its grid is done) and seed."""

    stage: str
    variant: str
    rate: float | None
    seed: int


@dataclass(frozen=True)
class ProtocolPlan:
    """A protocol study's plan. preset: the loaded preset; out_dir: the study's folder (`--out`);
    steps, tokens_per_step, seq_len: every run's; vocab_size: the planned model's vocabulary (`vocab_size_of`);
    variants: per variant, in the preset's order; runs: every grid and final run (extensions, whose rates
    depend on the grid's losses, are counted in `VariantPlan.extension_runs` only); throughput: what
    GPU-hours assume; gpus_per_run: processes (GPUs) of each torchrun launch."""

    preset: ComparePreset
    out_dir: str
    steps: int
    tokens_per_step: int
    seq_len: int
    vocab_size: int
    variants: tuple[VariantPlan, ...]
    runs: tuple[PlannedRun, ...]
    throughput: Throughput
    gpus_per_run: int

    @property
    def protocol(self) -> Protocol:
        return self.preset.protocol

    def variant(self, name: str) -> VariantPlan:
        """The VariantPlan named `name`."""
        return next(v for v in self.variants if v.name == name)

    def count(self, stage: str) -> int:
        """Runs of `stage` ("grid" or "final")."""
        return sum(r.stage == stage for r in self.runs)

    @property
    def extension_runs(self) -> int:
        return sum(v.extension_runs for v in self.variants)

    @property
    def flops(self) -> float:
        """Training FLOPs of every grid and final run (no extension)."""
        return sum(v.runs * v.flops_per_run for v in self.variants)

    @property
    def max_flops(self) -> float:
        """Training FLOPs with every extension the search may add."""
        return sum(v.max_runs * v.flops_per_run for v in self.variants)

    @property
    def base_config_path(self) -> str:
        """Where the torchrun commands read the preset's run: out_dir/base-run.yaml (written by hand, not here)."""
        return str(Path(self.out_dir) / BASE_CONFIG)

    @property
    def base_config(self) -> str:
        """The preset's run as the YAML text of base_config_path (the rate, seed, variant and folder are --set)."""
        return yaml.safe_dump(self.preset.run, sort_keys=False, default_flow_style=False)

    @property
    def launcher(self) -> str:
        return f"torchrun --standalone --nproc-per-node {self.gpus_per_run}"


def vocab_size_of(run: RunConfig, error: type[RunConfigError] = RunConfigError) -> int:
    """The vocabulary a planned model has: model.vocab_size when stated, else a BPE's data.vocab_size (its
    most: a BPE trained on a small corpus may have fewer). A pretrained tokenizer with vocab_size "auto" is
    refused (`error`): a plan (this one, a scaling sweep's) counts parameters without reading a tokenizer."""
    if run.model.vocab_size != AUTO:
        return run.model.vocab_size
    if run.data.tokenizer != "bpe":
        raise error(f"run.model.vocab_size must be set with a pretrained tokenizer (data.tokenizer "
                    f"{run.data.tokenizer!r}): the plan counts parameters without reading it; "
                    f"allowed: a positive integer, or data.tokenizer 'bpe' with data.vocab_size")
    return run.data.vocab_size


def plan_protocol(preset: ComparePreset, out_dir: str | Path | None = None, seeds: int | None = None,
                  throughput: Throughput = Throughput(), gpus_per_run: int = 8) -> ProtocolPlan:
    """The plan of `preset`'s protocol study in out_dir (default reports/compare-NAME, as `attnres compare`).

    seeds: the primary variants' final seeds (default: the preset's). Parameters and FLOPs per variant come
    from its model on the meta device (`attnres.model.flops`). Raises InputError for a preset without a
    `protocol:` section, and RunConfigError for a pretrained tokenizer without model.vocab_size.
    """
    if preset.protocol is None:
        raise InputError(f"preset {preset.name} has no 'protocol' section: --dry-run plans the fair-comparison "
                         f"protocol (a preset with one, e.g. protocol_dense or protocol_gpu)")
    check_int(seeds, "--seeds", allow_none=True)
    check_int(gpus_per_run, "gpus_per_run")
    protocol = preset.protocol
    out_dir = str(out_dir if out_dir is not None else Path("reports") / f"compare-{preset.name}")
    first = rate_run(preset, preset.variants[0], protocol.lr_grid[0], 0, Path(out_dir))
    vocab, steps, seq_len = vocab_size_of(first), first.train.steps, first.train.seq_len
    tokens = steps * first.train.tokens_per_step
    variants, runs = [], []
    for spec in preset.variants:
        name = variant_name(spec)
        config = rate_run(preset, spec, protocol.lr_grid[0], 0, Path(out_dir)).model.with_vocab_size(vocab)
        count = parameter_count(config)
        final = tuple(protocol.final_seeds(spec, seeds or preset.seeds))
        variants.append(VariantPlan(name, spec, protocol.is_primary(spec), count.total, count.non_embedding, tokens,
                                    float(flops_per_token(config, seq_len).training * tokens),
                                    len(protocol.lr_grid) * protocol.grid_seeds,
                                    protocol.max_extensions * protocol.grid_seeds, final))
        runs += [PlannedRun("grid", name, rate, seed) for rate in protocol.lr_grid
                 for seed in range(protocol.grid_seeds)]
        runs += [PlannedRun("final", name, None, seed) for seed in final]
    return ProtocolPlan(preset, out_dir, steps, first.train.tokens_per_step, seq_len, vocab, tuple(variants),
                        tuple(runs), throughput, gpus_per_run)


def run_config(plan: ProtocolPlan, run: PlannedRun, rate: float | None = None) -> RunConfig:
    """The RunConfig `attnres compare` trains `run` with; a final run needs its fitted `rate`."""
    rate = run.rate if rate is None else rate
    if rate is None or not is_number(rate) or not rate > 0:
        raise InputError(f"a {run.stage} run of {run.variant} needs a positive rate (a final run: its variant's "
                         f"fitted rate), got {rate!r}")
    return rate_run(plan.preset, plan.variant(run.variant).spec, rate, run.seed, Path(plan.out_dir))


def run_overrides(plan: ProtocolPlan, run: PlannedRun, rate: float | None = None) -> list[str]:
    """The `--set KEY=VALUE` values that make base_config `run`'s settings: out_dir, the PER_RUN fields (the
    residual, the rate and its min_lr, the seed) and every other field that differs from the preset's run
    (the variant's options)."""
    wanted = run_config(plan, run, rate).to_dict()
    base = RunConfig.from_dict(plan.preset.run).to_dict()
    sets = [f"out_dir={_yaml_value(wanted['out_dir'])}"]
    for section in ("model", "data", "train"):
        for key, value in wanted[section].items():
            if (section, key) in PER_RUN or key not in base[section] or base[section][key] != value:
                sets.append(f"{section}.{key}={_yaml_value(value)}")
    return sets


def train_command(plan: ProtocolPlan, run: PlannedRun, rate: float | None = None) -> str:
    """The shell line that trains `run` under torchrun on plan.gpus_per_run GPUs (a final run: at `rate`)."""
    sets = [arg for item in run_overrides(plan, run, rate) for arg in ("--set", item)]
    return shlex.join([*shlex.split(plan.launcher), "-m", "attnres", "train", "--config", plan.base_config_path,
                       "--device", "cuda", *sets])


def _yaml_value(value) -> str:
    """`value` as `--set` parses it back (YAML flow style: 1.0e-05, {num_blocks: 8}, [a, b])."""
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf).strip()
    return text.removesuffix("...").strip()


def hours_text(hours: float) -> str:
    """GPU-hours as a person reads them: 6,294 or 0.0123."""
    return f"{hours:,.0f}" if hours >= 100 else f"{hours:.3g}"


def _duration(seconds: float) -> str:
    """12 min, 1.3 h or 0.034 s."""
    if seconds >= 3600:
        return f"{seconds / 3600:.2g} h"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.2g} s"


def _seeds(seeds: tuple[int, ...]) -> str:
    return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) if not i else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))),
             "  ".join("-" * w for w in widths)]
    return lines + ["  ".join(c.ljust(w) if not i else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                    for r in rows]


def plan_text(plan: ProtocolPlan) -> str:
    """The dry run's plan: settings, a table per variant (parameters, tokens per parameter, runs, FLOPs,
    GPU-hours), the totals, the throughput they assume and the torchrun command of each kind of run."""
    preset, protocol, gpu = plan.preset, plan.protocol, plan.throughput
    first = run_config(plan, plan.runs[0])
    model, train = first.model, first.train
    grid = protocol.lr_grid
    lines = [f"protocol plan: preset {preset.name}: {preset.description}",
             f"model: {model.hidden_size} x {model.num_layers} layers, vocabulary {plan.vocab_size:,}; "
             f"data {first.data.source}, tokenizer {first.data.tokenizer}",
             f"every run: {plan.steps:,} steps of {train.batch_size} x {train.grad_accum} x {plan.seq_len:,} = "
             f"{plan.tokens_per_step:,} tokens ({plan.steps * plan.tokens_per_step:,} tokens), {train.precision}",
             f"grid: {len(grid)} rates ({', '.join(f'{r:.3g}' for r in grid)}) x {protocol.grid_seeds} grid seeds "
             f"(0-{protocol.grid_seeds - 1}), up to {protocol.max_extensions} extension rate(s) per variant; choice "
             f"{protocol.choice}; final runs at the fitted rate, seeds from {protocol.final_seed_start}", ""]
    header = ["variant", "role", "parameters", "non-embedding", "tokens/param", "FLOPs/run", "grid", "ext. (max)",
              "final (seeds)", "runs", "FLOPs", "GPU-hours"]
    rows = [[v.name, "primary" if v.primary else "secondary", f"{v.parameters:,}", f"{v.non_embedding:,}",
             f"{v.tokens_per_parameter:.2f}", f"{v.flops_per_run:.3g}", str(v.grid_runs), str(v.extension_runs),
             f"{len(v.final_seeds)} ({_seeds(v.final_seeds)})", str(v.runs), f"{v.runs * v.flops_per_run:.3g}",
             hours_text(gpu.hours(v.runs * v.flops_per_run))] for v in plan.variants]
    grid_runs, finals = plan.count("grid"), plan.count("final")
    rows.append(["all", "", "", "", "", "", str(grid_runs), str(plan.extension_runs), str(finals),
                 str(grid_runs + finals), f"{plan.flops:.3g}", hours_text(gpu.hours(plan.flops))])
    lines += _table(header, rows)
    longest = max(v.flops_per_run for v in plan.variants) / (plan.gpus_per_run * gpu.flops_per_s)  # seconds
    lines += ["", f"runs: {grid_runs} grid ({len(plan.variants)} variants x {len(grid)} rates x "
                  f"{protocol.grid_seeds} seeds) + {finals} final = {grid_runs + finals}; with every extension "
                  f"{grid_runs + finals + plan.extension_runs} runs, {plan.max_flops:.3g} FLOPs, "
                  f"{hours_text(gpu.hours(plan.max_flops))} GPU-hours",
              f"total: {plan.flops:.3g} training FLOPs, {hours_text(gpu.hours(plan.flops))} GPU-hours on {gpu.name} at "
              f"{gpu.peak_tflops:g} TFLOP/s peak x {gpu.mfu:.0%} MFU = {gpu.flops_per_s / 1e12:.1f} TFLOP/s per GPU "
              f"(assumed: Throughput(peak_tflops=..., mfu=...) changes it); FLOPs as attnres.model.flops counts "
              f"them (3 x forward, full T x T attention), evaluation not counted",
              f"one run on {plan.gpus_per_run} GPUs: about {_duration(longest)} "
              f"at that throughput (the variant with the most FLOPs)", ""]
    lines += _commands(plan)
    return "\n".join(lines)


def _commands(plan: ProtocolPlan) -> list[str]:
    """How to launch the study under torchrun: the base config, one exact command per kind of run."""
    grid = plan.runs[0]
    final = next(r for r in plan.runs if r.stage == "final")
    fitted = plan.protocol.lr_grid[len(plan.protocol.lr_grid) // 2]  # a stand-in for the fitted rate
    compare = shlex.join(["attnres", "compare", "--preset", plan.preset.name, "--out", plan.out_dir,
                          "--device", "cuda"])
    return [
        f"under torchrun ({plan.gpus_per_run} GPUs a run; `attnres compare` itself trains in one process):",
        f"1. write the preset's run once to {plan.base_config_path}:",
        f"mkdir -p {shlex.quote(plan.out_dir)} && cat > {shlex.quote(plan.base_config_path)} <<'EOF'",
        plan.base_config.rstrip(), "EOF",
        f"2. each grid run ({plan.count('grid')}: every variant, rate and grid seed; this one is {grid.variant} at "
        f"{grid.rate:.3g}, seed {grid.seed}); the variant's residual, train.lr, train.min_lr, train.seed and out_dir "
        f"change from run to run:",
        train_command(plan, grid),
        f"3. {compare} takes up each finished run (resumes its last checkpoint: trains nothing), evaluates it on "
        f"the validation and test splits, writes its record and fits each variant's rate. It has no option to stop "
        f"there: it goes on to train the extension and final runs itself, one at a time in its one process; to train "
        f"them under torchrun instead, stop it at the first run it starts (its log names the variant and rate), "
        f"launch them as in 4 and run it again",
        f"4. an extension run is a grid run at the rate compare names; each final run ({plan.count('final')}) is at "
        f"its variant's fitted rate (here {fitted:.3g} stands in for it):",
        train_command(plan, final, fitted),
        f"5. {compare} again: it takes up the final runs and writes the report",
        "untested: no GPU run of this plan has been made; the GPU, NCCL and torch.compile paths of attnres train have "
        "not been run here (docs/how-to/scale-out.md)",
    ]
