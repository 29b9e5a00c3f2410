"""The `attnres` command line: thin argument parsing over the packages.

`COMMANDS` is the table of commands: each row names a command, its help, the function that adds its
arguments (`attnres.cli_arguments`), its handler (`_train`, ... here, each building a config and
calling the library), the install extra it needs and the failures it maps to exit codes. `main` parses
(`build_parser`), runs the handler and turns errors into exit codes:

- 0: done.
- 2: bad input. argparse's own errors (`_Parser`), and any `attnres.common.errors.InputError` (ConfigError,
  RunConfigError, DataError, ConversionError, ...: a config value, an argument, a file the user named),
  printed as one line, "attnres COMMAND: error: MESSAGE", without a traceback.
- 1: a run that failed: CheckpointError (a missing, corrupt or mismatched checkpoint) and TrainingError
  (a non-finite loss), one line as well, for the commands that train or load checkpoints; and, for
  every command, an OSError of the machine's storage (a full disk or quota, a read-only or failing
  file system: `attnres.common.atomic.storage_failure`), one line naming the file.
- Anything else, a plain ValueError included, is a bug in attnres (or in a library under it): it is not
  caught, so Python prints its traceback and exits 1.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from dataclasses import dataclass
from typing import Callable

from attnres import cli_arguments as arguments
from attnres.common.run_options import check_out_dir, check_run_options, parse_shard
from attnres.report.folder import check_report_folder, mark_report_folder
from attnres.common.user_paths import user_path


def _train(args: argparse.Namespace) -> int:
    from attnres.train import load_run_config

    return _run_training(load_run_config(args.config, args.set), args)


def _run_training(run, args: argparse.Namespace) -> int:
    from attnres.distributed.env import init_from_env, shutdown
    from attnres.train import train

    env = init_from_env(args.device)  # under torchrun: join its process group (None otherwise)
    try:
        result = train(run, resume=args.resume, device=env.device if env else args.device, force=args.force)
    finally:
        shutdown()
    if env is None or env.is_main:
        print(f"done: {run.train.steps} steps, validation loss {result.final_val_loss:.4f}; run in {result.run_dir}")
    return 0


def _finetune(args: argparse.Namespace) -> int:
    from attnres.train.run_config import load_finetune_config

    return _run_training(load_finetune_config(args.init, args.config, args.set), args)


def _eval(args: argparse.Namespace) -> int:
    from attnres.common.checks import check_int
    from attnres.train import evaluate_checkpoint
    from attnres.train.evaluate import resolve_checkpoint

    if args.max_batches is not None:  # not 0, which would mean the run's default
        check_int(args.max_batches, "--max-batches")
    path = resolve_checkpoint(args.checkpoint)  # a run directory: its latest checkpoint
    result = evaluate_checkpoint(path, max_batches=args.max_batches, device=args.device)
    print(json.dumps(result, indent=2))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from attnres.compare import load_preset, run_preset

    preset = load_preset(args.preset, args.set)
    out = user_path(f"reports/compare-{preset.name}" if args.out is None else args.out, "--out")
    check_run_options(out, args.seeds)
    if args.dry_run:
        from attnres.compare.plan import plan_protocol, plan_text

        print(plan_text(plan_protocol(preset, out, seeds=args.seeds)))
        return 0
    check_report_folder(out, "compare", preset.name, args.force)
    results = run_preset(preset, out, seeds=args.seeds, command="attnres " + shlex.join(args.argv),
                         device=args.device, shard=parse_shard(args.shard), force=args.force)
    mark_report_folder(out, "compare", preset.name)
    _print_outcome(results, args.shard, out)
    return 0


def _scaling(args: argparse.Namespace) -> int:
    from attnres.common.checks import check_int
    from attnres.scaling.plan import plan_sweep, plan_text
    from attnres.scaling.preset import load_preset
    from attnres.scaling.sweep import run_sweep

    preset = load_preset(args.preset, args.set, variants=args.variants, sizes=args.sizes)
    out = user_path(f"reports/scaling-{preset.name}" if args.out is None else args.out, "--out")
    check_run_options(out, args.seeds)
    check_int(args.replicates, "--replicates")
    if args.dry_run:
        print(plan_text(preset, plan_sweep(preset, out, seeds=args.seeds)))
        return 0
    check_report_folder(out, "scaling", preset.name, args.force)
    results = run_sweep(preset, out, seeds=args.seeds, command="attnres " + shlex.join(args.argv), device=args.device,
                        shard=parse_shard(args.shard), launcher=args.launcher, replicates=args.replicates,
                        cost_repeats=args.cost_repeats, force=args.force)
    mark_report_folder(out, "scaling", preset.name)
    _print_outcome(results, args.shard, out)
    return 0


def _print_outcome(results, shard: str | None, out: Path) -> None:
    """What a sharded job (no results) or a finished one (its report) left, for compare and scaling."""
    if results is None:
        print(f"shard {shard} done; run without --shard to write the report into {out}")
    else:
        print(f"report: {out / 'report.md'} and {out / 'index.html'}")


def _convert(args: argparse.Namespace) -> int:
    from attnres.common.config_files import parse_assignment
    from attnres.common.precision import WEIGHT_DTYPES
    from attnres.hf.streaming import stream_to_hf

    dtype = WEIGHT_DTYPES[args.dtype]
    options = dict(parse_assignment(item, "--option", "NAME=VALUE (e.g. num_blocks=4)") for item in args.option)
    # safetensors sources stream in bounded memory; a GGUF file or pytorch_model.bin converts in memory
    done = stream_to_hf(args.source, args.out, residual=args.residual, residual_options=options, dtype=dtype,
                        max_seq_len=args.max_seq_len, max_shard_size=args.max_shard_size)
    print(f"converted {args.source} -> {done.out} ({done.config.residual}, {done.num_parameters:,} parameters, "
          f"{args.dtype}); load with: import attnres.hf; AutoModelForCausalLM.from_pretrained({str(done.out)!r})")
    return 0


def _lm_eval(args: argparse.Namespace) -> int:
    from attnres.hf.lm_eval import check_lm_eval_options, parse_tasks, run_lm_eval

    tasks = parse_tasks(args.tasks)
    out = None if args.out is None else user_path(args.out, "--out")
    check_lm_eval_options(args.batch_size, args.limit, args.include_path, out, args.force)
    results = run_lm_eval(args.model, tasks, include_path=args.include_path, batch_size=args.batch_size,
                          limit=args.limit, device=args.device)
    text = json.dumps(results, indent=2, default=str)
    if out is not None:
        from attnres.common.atomic import write_atomic

        write_atomic(out, text)  # a killed run leaves the earlier file or none, never a part
    print(text)
    return 0


def _generate(args: argparse.Namespace) -> int:
    from attnres.hf.generate_text import GenerationRequest, generate_text, timing_lines

    request = GenerationRequest(
        prompt=args.prompt, max_new_tokens=args.max_new_tokens, dtype=args.dtype, precision=args.precision,
        compile=args.compile, threads=args.threads, chat=args.chat, sample=args.sample,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
        routing_impl=args.routing_impl, device=args.device)
    text, result = generate_text(args.model, request)
    print(text)
    for line in timing_lines(result, request):
        print(line, file=sys.stderr)
    return 0


def _bench(args: argparse.Namespace) -> int:
    from attnres.bench import format_markdown, resolve_config, run_bench
    from attnres.bench.bench_config import SETTING_NAMES

    config = resolve_config(args.preset, args.quick, args.set,
                            **{name: getattr(args, name) for name in SETTING_NAMES})
    default = f"reports/bench-{'quick' if args.quick else Path(args.preset).stem}"
    out = user_path(default if args.out is None else args.out, "--out")
    check_out_dir(out)
    check_report_folder(out, "bench", None, args.force, rerun=False)
    results = run_bench(config, out, command="attnres " + shlex.join(args.argv))
    mark_report_folder(out, "bench")
    print()
    print(format_markdown(results))
    print(f"report: {out / 'bench.md'} and {out / 'bench.json'}")
    return 0


def _analyze(args: argparse.Namespace) -> int:
    from attnres.common.checks import check_int
    from attnres.analyze import analyze

    out = user_path(args.out, "--out")
    check_out_dir(out)
    if args.seq_len is not None:
        check_int(args.seq_len, "--seq-len")
    check_int(args.batch_size, "--batch-size")
    analysed = {"checkpoints": [str(Path(path).resolve()) for path in args.checkpoints],
                **{name: getattr(args, name) for name in ("labels", "max_batches", "causal", "causal_routers", "data",
                                                          "seq_len", "batch_size")}}
    check_report_folder(out, "analyze", analysed, args.force)
    analyze(args.checkpoints, out, labels=args.labels, max_batches=args.max_batches, device=args.device,
            command="attnres " + shlex.join(args.argv), causal=args.causal or bool(args.causal_routers),
            causal_routers=args.causal_routers, data=args.data, seq_len=args.seq_len, batch_size=args.batch_size)
    mark_report_folder(out, "analyze", analysed)
    print(f"report: {out / 'summary.md'}, {out / 'index.html'} and {out / 'analysis.json'}")
    return 0


@dataclass(frozen=True)
class Command:
    """One command: its name, the function adding its arguments (`attnres.cli_arguments`), its handler (args ->
    exit status), the install extra it needs beyond the core (`attnres.cli_arguments.EXTRA_MODULES`), whether its failed
    runs (CheckpointError, TrainingError) exit 1, whether an interrupted run can be resumed, its line in
    `attnres --help` and its own help's description."""

    name: str
    arguments: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], int]
    extra: str = "train"
    run_failures: bool = False
    resumable: bool = False
    help: str = ""
    description: str | None = None


# In the order `attnres --help` lists them.
COMMANDS = {command.name: command for command in (
    Command("compare", arguments.compare_arguments, _compare, run_failures=True,
            help="train every residual variant on the same data and write a report"),
    Command("scaling", arguments.scaling_arguments, _scaling, run_failures=True,
            help="train a grid of model sizes for every variant, fit loss against compute and report each "
                 "variant's compute advantage (docs/how-to/scaling-sweep.md)"),
    Command("train", arguments.train_arguments, _train, run_failures=True, resumable=True,
            help="train one model from a YAML config"),
    Command("finetune", arguments.finetune_arguments, _finetune, run_failures=True, resumable=True,
            help="fine-tune a converted model (the Delta paper's recipe by default)"),
    Command("eval", arguments.eval_arguments, _eval, run_failures=True,
            help="validation loss and perplexity of a checkpoint (or a run's latest)"),
    Command("convert", arguments.convert_arguments, _convert, extra="hf",
            help="convert a Hugging Face Qwen3/Qwen2/Llama/Mistral/Kimi Linear checkpoint"),
    Command("lm-eval", arguments.lm_eval_arguments, _lm_eval, extra="eval",
            help="lm-evaluation-harness on a Hugging Face-format attnres model"),
    Command("generate", arguments.generate_arguments, _generate, extra="hf",
            help="generate text from a Hugging Face-format attnres model with the static KV cache and compiled "
                 "decode step; prints the text, then prefill, compile and decode times on stderr",
            description="Greedy (or, with --sample, sampled) decoding through AttnResForCausalLM.generate_fast "
                        "(docs/how-to/generate.md). The text goes to stdout; the timings to stderr."),
    Command("bench", arguments.bench_arguments, _bench,
            help="time and memory of each variant against standard, a depth sweep and a router micro-benchmark; "
                 "writes bench.md and bench.json",
            description="Settings come from a preset, then --quick, then --set, then the flags below (the defaults "
                        "shown are BenchConfig's; a preset may change them)."),
    Command("analyze", arguments.analyze_arguments, _analyze, run_failures=True,
            help="routing heatmaps, source cosines, RMS and gradient norm by depth of checkpoints on held-out "
                 "batches; writes summary.md, index.html and analysis.json"),
)}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command in `COMMANDS`."""
    return arguments.build_parser(COMMANDS.values())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `attnres` command: exit 0 on success, 2 for bad input, 1 for a failed run; any
    other exception is a bug and propagates with its traceback (module docstring). A command whose
    install extra is missing says which, in one line (exit 2)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        return _run(args)
    except ModuleNotFoundError as error:  # an optional dependency, or else a bug
        message = arguments.missing_extra(error, COMMANDS[args.command].extra)
        if message is None:
            raise
        print(f"attnres {args.command}: error: {message}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command: its exit status, with input errors and failed runs said in one line."""
    from attnres.common.errors import InputError

    command = COMMANDS[args.command]
    failures: tuple[type[Exception], ...] = ()
    if command.run_failures:
        from attnres.train import CheckpointError, TrainingError

        failures = (CheckpointError, TrainingError)
    try:
        if getattr(args, "device", None) is not None:
            from attnres.common.machine import check_device

            check_device(args.device)  # "tpu", or CUDA where there is none: refused before any work
        if getattr(args, "missing_extra", None):  # a stand-in: the command's extra is not installed
            raise InputError(args.missing_extra)
        return command.handler(args)
    except InputError as error:  # configs, data, files and arguments: the user's input
        print(f"attnres {args.command}: error: {_one_line(error)}", file=sys.stderr)
        return 2
    except failures as error:  # corrupt or mismatched checkpoints, non-finite losses
        print(f"attnres {args.command}: error: {_one_line(error)}", file=sys.stderr)
        return 1
    except OSError as error:  # a full disk mid-run is the machine's, not a bug: one line naming the file
        from attnres.common.atomic import storage_failure

        line = storage_failure(error)
        if line is None:
            raise
        if command.resumable:
            line += "; --resume continues from the last whole checkpoint"
        print(f"attnres {args.command}: error: {line}", file=sys.stderr)
        return 1


def _one_line(error: Exception) -> str:
    """The error's message on one line (a library's message quoted in it may span several)."""
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip())


if __name__ == "__main__":
    sys.exit(main())
