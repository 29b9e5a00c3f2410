"""The `attnres` command line's arguments: one function per command adds its arguments to its parser
(`compare_arguments`, ...), and `build_parser` assembles the parsers of `attnres.cli.COMMANDS`' rows.
A command whose install extra is missing (pyproject.toml: `attnres[hf]` for conversion and generation,
`attnres[train]` for training, comparisons and reports, `attnres[eval]` for lm-eval) is listed and,
when run, fails in one line naming the extra (`missing_extra`), not with a traceback."""

from __future__ import annotations

import argparse

# extra -> the top-level modules it brings that attnres imports (pyproject.toml lists the packages)
EXTRA_MODULES = {
    "hf": ("transformers", "tokenizers", "gguf", "accelerate"),
    "train": ("transformers", "tokenizers", "datasets", "pyarrow", "tensorboard", "tqdm", "matplotlib", "scipy"),
    "eval": ("lm_eval", "transformers", "tokenizers"),
}


def missing_extra(error: ModuleNotFoundError, extra: str) -> str | None:
    """One line saying which module is missing and the extra to install for it (`extra` where it brings
    the module, else the first extra that does); None when no extra brings it (a bug or a broken
    environment: the caller keeps the traceback)."""
    module = (error.name or "").split(".")[0]
    extras = [name for name, modules in EXTRA_MODULES.items() if module in modules]
    if not extras:
        return None
    chosen = extra if extra in extras else extras[0]
    return f"this needs {module}, which the '{chosen}' extra installs: pip install 'attnres[{chosen}]'"


DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16"}  # the long names earlier versions took
DEVICE_HELP = "cpu, cuda or cuda:N (default: %(default)s)"


def _preset_help(kind: str) -> str:
    """The --preset help of command `kind`, listing its bundled presets (read from the package, so it cannot
    go stale)."""
    from attnres.common.config_files import bundled_presets

    return (f"a bundled preset (configs/{kind}/NAME.yaml: {', '.join(bundled_presets(kind))}) or a preset "
            f"YAML path (default: %(default)s)")


def _add_run_arguments(parser: argparse.ArgumentParser, example: str) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override a config value, {example}; repeatable (default: none)")
    parser.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    parser.add_argument("--force", action="store_true",
                        help="overwrite the files of an earlier run in out_dir that has no checkpoint")
    parser.add_argument("--device", default="cpu",
                        help="cpu or cuda; under torchrun each process takes cuda:LOCAL_RANK "
                             "(docs/how-to/scale-out.md) (default: %(default)s)")


def _add_report_force(parser: argparse.ArgumentParser, runs: bool = False) -> None:
    parser.add_argument("--force", action="store_true",
                        help="replace others' files in --out" +
                             ("; redo interrupted runs of other settings" if runs else ", same names only"))


def compare_arguments(compare: argparse.ArgumentParser) -> None:
    compare.add_argument("--preset", default="default",
                         help=_preset_help("compare"))
    compare.add_argument("--seeds", type=int, default=None,
                         help="seeds per variant; with a preset's protocol, the final seeds at each variant's "
                              "chosen rate (default: the preset's)")
    compare.add_argument("--out", default=None, help="report folder (default: reports/compare-PRESET)")
    _add_report_force(compare, runs=True)
    compare.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="override the preset's run, its cost measurement or its protocol, e.g. --set "
                              "train.steps=100 --set cost.repeats=20 --set protocol.grid_seeds=1; repeatable "
                              "(default: none)")
    compare.add_argument("--device", default="cpu", help=DEVICE_HELP)
    compare.add_argument("--dry-run", action="store_true",
                         help="print the protocol's plan (every run, parameters, tokens per parameter, FLOPs, "
                              "GPU-hours, torchrun commands), train nothing and write nothing; needs a preset "
                              "with a protocol section")
    compare.add_argument("--shard", default=None, metavar="I/N",
                         help="train only runs I, I+N, ... (with a protocol: the seeds I mod N, waiting where a "
                              "stage needs the other shards' runs) and write no report (N processes share a "
                              "comparison; finished runs are reused, so a last call without --shard writes the "
                              "report) (default: all runs, then the report)")


def scaling_arguments(scaling: argparse.ArgumentParser) -> None:
    scaling.add_argument("--preset", default="cpu",
                         help=_preset_help("scaling"))
    scaling.add_argument("--variants", nargs="+", default=None, metavar="NAME",
                         help="only these of the preset's variants, by name or residual; standard must be one "
                              "(default: all)")
    scaling.add_argument("--sizes", nargs="+", default=None, metavar="NAME",
                         help="only these of the preset's sizes, by name (dWIDTH-lLAYERS, e.g. d64-l8; --dry-run "
                              "lists them); at least 2 (default: all)")
    scaling.add_argument("--seeds", type=int, default=None,
                         help="seeds at every size (default: each size's own, else the preset's)")
    scaling.add_argument("--out", default=None, help="report folder (default: reports/scaling-PRESET)")
    _add_report_force(scaling, runs=True)
    scaling.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="override the preset's base run or its rules, e.g. --set train.lr=1e-3 "
                              "--set rules.tokens_per_parameter=5; repeatable (default: none)")
    scaling.add_argument("--dry-run", action="store_true",
                         help="print the plan (runs, parameters, tokens, FLOPs, GPU-hours) and train nothing")
    scaling.add_argument("--shard", default=None, metavar="I/N",
                         help="train only this FLOPs-balanced share of the runs and write no report; a last call "
                              "without --shard reuses every finished run and writes the report (default: all)")
    scaling.add_argument("--launcher", default=None, metavar="COMMAND",
                         help="run each training as `COMMAND -m attnres train --config RUN/config.yaml`, e.g. "
                              "\"torchrun --nproc-per-node 8\" (default: in this process)")
    scaling.add_argument("--replicates", type=int, default=1000,
                         help="bootstrap replicates of the fit's intervals (default: %(default)s)")
    scaling.add_argument("--cost-repeats", type=int, default=11,
                         help="rounds of the step-time measurement at the largest size, every variant interleaved in "
                              "this process (5 or more); 0 skips it, e.g. when that model does not fit one device "
                              "(default: %(default)s)")
    scaling.add_argument("--device", default="cpu", help=DEVICE_HELP)


def train_arguments(train: argparse.ArgumentParser) -> None:
    train.add_argument("--config", required=True, help="YAML file with model, data and train sections (required)")
    _add_run_arguments(train, "e.g. --set model.residual=delta_block --set train.lr=1e-3")


def finetune_arguments(finetune: argparse.ArgumentParser) -> None:
    finetune.add_argument("init", help="a directory from `attnres convert` (or a training checkpoint)")
    finetune.add_argument("--config", default=None,
                          help="YAML with data/train/out_dir (model fields come from INIT) (default: the recipe "
                               "with INIT's tokenizer, every other field at its default)")
    _add_run_arguments(finetune, "e.g. --set train.query_init=normal --set train.steps=300")


def eval_arguments(evaluate: argparse.ArgumentParser) -> None:
    evaluate.add_argument("checkpoint", help="a checkpoint directory (runs/X/checkpoints/step_N) or a run directory")
    evaluate.add_argument("--max-batches", type=int, default=None,
                          help="held-out batches to evaluate (default: the run's train.eval_batches)")
    evaluate.add_argument("--device", default="cpu", help=DEVICE_HELP)


def convert_arguments(convert: argparse.ArgumentParser) -> None:
    from attnres.residual import VARIANTS

    convert.add_argument("source", help="a local Hugging Face checkpoint directory (config.json + safetensors) "
                                        "or a .gguf file")
    convert.add_argument("--residual", default="standard", choices=list(VARIANTS),
                         help="the residual variant of the converted model, one of %(choices)s (default: %(default)s)")
    convert.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                         help="an option of the residual variant (repeatable; docs/reference/config.md lists each "
                              "variant's), e.g. --option num_blocks=4 --option exact_conversion=gate (default: none)")
    convert.add_argument("--max-seq-len", type=int, default=None,
                         help="longest sequence the model accepts (default: the source's max_position_embeddings)")
    convert.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", type=lambda s: DTYPE_NAMES.get(s, s),
                         help="dtype of the written weights, one of %(choices)s; bf16 halves the files "
                              "(default: %(default)s)")
    convert.add_argument("--max-shard-size", default="5GB", metavar="SIZE",
                         help="largest weight file written, e.g. 500MB; more is sharded (default: %(default)s)")
    convert.add_argument("--out", required=True, help="output directory, new or empty (Hugging Face format; required)")


def lm_eval_arguments(lm_eval: argparse.ArgumentParser) -> None:
    lm_eval.add_argument("model", help="a directory from `attnres convert`, or a training checkpoint directory")
    lm_eval.add_argument("--tasks", default="paper",
                         help="comma-separated lm-eval tasks, or 'paper' for the Delta paper's eight (needs hub "
                              "access) (default: %(default)s)")
    lm_eval.add_argument("--include-path", default=None, help="a folder of extra task YAMLs (default: none)")
    lm_eval.add_argument("--batch-size", type=int, default=1,
                         help="sequences per forward pass; padded batches score the same (default: %(default)s)")
    lm_eval.add_argument("--limit", type=int, default=None,
                         help="at most this many examples per task (default: all)")
    lm_eval.add_argument("--out", default=None, help="also write the results JSON here (default: print only)")
    lm_eval.add_argument("--force", action="store_true", help="replace an existing --out file")
    lm_eval.add_argument("--device", default="cpu", help=DEVICE_HELP)


def generate_arguments(generate: argparse.ArgumentParser) -> None:
    from attnres.common.precision import PRECISIONS
    from attnres.routing import IMPLS

    generate.add_argument("model", metavar="MODEL", help="a directory from `attnres convert`, or a training checkpoint "
                                                         "directory (runs/X/checkpoints/step_N)")
    generate.add_argument("--prompt", required=True, help="the text to continue (required)")
    generate.add_argument("--max-new-tokens", type=int, default=64,
                          help="most tokens to generate; fewer when the model's end token comes (default: %(default)s)")
    generate.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                          help="the weights' dtype: bf16 halves the bytes a step reads, fast with native bf16 "
                               "(default: %(default)s)")
    generate.add_argument("--precision", choices=list(PRECISIONS), default="fp32",
                          help="fp32, or bf16 under autocast (default: %(default)s)")
    generate.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                          help="compile the decode step with torch.compile (tens of seconds on a few CPU cores, "
                               "then cached); --no-compile runs the same step eagerly (default: compile only where "
                               "this request repays the compile time measured here; a line says when it starts)")
    generate.add_argument("--threads", type=int, default=None,
                          help="torch intra-op threads (default: torch's setting, one per core)")
    generate.add_argument("--chat", action="store_true",
                          help="wrap the prompt as one user turn in the tokenizer's chat template")
    generate.add_argument("--sample", action="store_true",
                          help="sample instead of greedy decoding, with the model's generation defaults for "
                               "temperature, top-k and top-p unless given below")
    generate.add_argument("--temperature", type=float, default=None,
                          help="with --sample: softmax temperature (default: the model's, else 1.0)")
    generate.add_argument("--top-k", type=int, default=None,
                          help="with --sample: keep the K most likely tokens, 0 for all "
                               "(default: the model's, else 50)")
    generate.add_argument("--top-p", type=float, default=None,
                          help="with --sample: keep the most likely tokens up to this probability "
                               "(default: the model's, else 1.0)")
    generate.add_argument("--seed", type=int, default=None, help="with --sample: torch's random seed (default: none)")
    generate.add_argument("--routing-impl", choices=list(IMPLS), default="auto",
                          help="how routers compute, never what, one of %(choices)s; not part of the model "
                               "(default: %(default)s)")
    generate.add_argument("--device", default="cpu", help=DEVICE_HELP)


def bench_arguments(bench: argparse.ArgumentParser) -> None:
    from attnres.bench.bench_config import DEFAULT_PRESET, flag_arguments

    bench.add_argument("--preset", default=DEFAULT_PRESET,
                       help=_preset_help("bench"))
    bench.add_argument("--quick", action="store_true",
                       help="a tiny model, a run of seconds (configs/bench/overlays/quick.yaml over the preset)")
    bench.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a setting (KEY: a BenchConfig field; VALUE parsed as YAML), "
                            "e.g. --set repeats=10 --set depths=[12,24]; repeatable (default: none)")
    for flag, kwargs in flag_arguments():  # one per BenchConfig field, from its metadata
        bench.add_argument(flag, **kwargs)
    bench.add_argument("--out", default=None, help="report folder (default: reports/bench-PRESET)")
    _add_report_force(bench)


def analyze_arguments(analyze: argparse.ArgumentParser) -> None:
    analyze.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT",
                         help="checkpoint directories (runs/X/checkpoints/step_N), run directories (their latest) "
                              "or, with --data, converted models' directories (`attnres convert` output)")
    analyze.add_argument("--out", default="reports/analyze", help="report folder (default: %(default)s)")
    _add_report_force(analyze)
    analyze.add_argument("--max-batches", type=int, default=4,
                         help="held-out batches per checkpoint, of the run's batch size and seq_len "
                              "(default: %(default)s)")
    analyze.add_argument("--labels", nargs="+", default=None, metavar="LABEL",
                         help="one display name per checkpoint (default: variant and step)")
    analyze.add_argument("--device", default="cpu", help=DEVICE_HELP)
    analyze.add_argument("--causal", action="store_true",
                         help="also the causal check of routing: each router's sources ablated in turn (zero, token "
                              "mean), the loss change against the routing mass (one forward pass per batch, router, "
                              "source and ablation)")
    analyze.add_argument("--causal-routers", type=int, nargs="+", default=None, metavar="R",
                         help="the routers the causal check ablates (implies --causal; default: every router)")
    analyze.add_argument("--data", default=None, metavar="SOURCE",
                         help="held-out text for every checkpoint, tokenised by its own pretrained tokenizer: a "
                              ".txt/.jsonl/.parquet file or folder, 'hf:<dataset>', 'demo' (required for a converted "
                              "model's directory, `attnres convert` output; default: each run's own held-out split)")
    analyze.add_argument("--seq-len", type=int, default=None,
                         help="with --data: tokens per sequence (default: min(max_seq_len, 256))")
    analyze.add_argument("--batch-size", type=int, default=4, help="with --data: sequences per batch (default: 4)")


class _Parser(argparse.ArgumentParser):
    """argparse, its errors (an unknown option, an invalid choice, a value of the wrong type) in one line
    like every other bad input, pointing to --help instead of printing the usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the options)\n")


def build_parser(commands) -> argparse.ArgumentParser:
    """The argument parser with a subcommand for each of `commands` (rows with name, help, description,
    arguments and extra: `attnres.cli.COMMANDS`, in the order `attnres --help` lists them); every
    option's help names its choices and default."""
    from attnres import __version__

    parser = _Parser(prog="attnres", description="Depth routing residuals for language models.")
    parser.add_argument("--version", action="version", version=f"attnres {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in commands:
        built = _Parser(prog=f"attnres {command.name}", description=command.description)
        listed = command.help
        try:
            command.arguments(built)
        except ModuleNotFoundError as error:  # the command's extra is not installed: say so when it is run
            built, listed = _stand_in(command, error)
        sub.add_parser(command.name, help=listed)  # its line in `attnres --help`
        sub.choices[command.name] = built  # the parser that reads its arguments
    return parser


def _stand_in(command, error: ModuleNotFoundError) -> tuple[argparse.ArgumentParser, str]:
    """A subcommand whose parser cannot be built without its extra: listed, and run, it says what to install."""
    message = missing_extra(error, command.extra)
    if message is None:
        raise error
    # no option prefix: every argument given is taken (and ignored) rather than refused as unknown
    stand_in = _Parser(prog=f"attnres {command.name}", add_help=False, prefix_chars="\0")
    stand_in.add_argument("arguments", nargs=argparse.REMAINDER)
    stand_in.set_defaults(missing_extra=message)  # cli.main says it, exit status 2
    return stand_in, f"(not installed: {message})"
