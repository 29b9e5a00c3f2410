"""The `attnres` command line: thin argument parsing over the packages."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict, fields
from pathlib import Path


def _demo(args: argparse.Namespace) -> int:
    from attnres.demo import DemoSettings, format_table, run_demo

    settings = DemoSettings(**{f.name: getattr(args, f.name) for f in fields(DemoSettings)})
    print(f"attnres demo: {settings.num_layers} layers x {settings.hidden_size} wide, {settings.steps} AdamW "
          f"steps of {settings.batch_size} x {settings.seq_len} generated tokens per variant (seed {settings.seed})")
    rows = run_demo(settings)
    print()
    print(format_table(rows))
    print("\nmax weight: token-mean of each router's largest softmax weight (1/n = uniform, 1 = one source),"
          "\naveraged over routers with two or more sources; '-' where the variant has none.")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": asdict(settings), "results": rows}, indent=2))
    return 0


def _train(args: argparse.Namespace) -> int:
    from attnres.train import load_run_config

    return _run_training(load_run_config(args.config, args.set), args)


def _run_training(run, args: argparse.Namespace) -> int:
    from attnres.distributed.env import init_from_env, shutdown
    from attnres.train import train

    env = init_from_env(args.device)  # under torchrun: join its process group (None otherwise)
    try:
        result = train(run, resume=args.resume, device=env.device if env else args.device)
    finally:
        shutdown()
    if env is None or env.is_main:
        print(f"done: {run.train.steps} steps, validation loss {result.final_val_loss:.4f}; run in {result.run_dir}")
    return 0


def _finetune(args: argparse.Namespace) -> int:
    from attnres.train import RunConfigError, load_run_config
    from attnres.train.run_config import finetune_defaults

    run = load_run_config(args.config, args.set, base=finetune_defaults(args.init))
    if run.data.tokenizer == "bpe":
        raise RunConfigError(f"finetune needs the model's own tokenizer and {args.init} has none; "
                             f"pass --set data.tokenizer=DIR")
    return _run_training(run, args)


def _eval(args: argparse.Namespace) -> int:
    from attnres.train import evaluate_checkpoint
    from attnres.train.evaluate import resolve_checkpoint

    path = resolve_checkpoint(args.checkpoint)  # a run directory: its latest checkpoint
    result = evaluate_checkpoint(path, max_batches=args.max_batches, device=args.device)
    print(json.dumps(result, indent=2))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from attnres.compare.presets import load_preset
    from attnres.compare.run import run_compare

    preset = load_preset(args.preset, args.set)
    out = Path(args.out or f"reports/compare-{preset.name}")
    shard = _parse_shard(args.shard)
    results = run_compare(preset, out, seeds=args.seeds, command="attnres " + shlex.join(args.argv),
                          device=args.device, shard=shard)
    if results is None:
        print(f"shard {args.shard} done; run without --shard to write the report into {out}")
    else:
        print(f"report: {out / 'report.md'} and {out / 'index.html'}")
    return 0


def _parse_shard(text: str | None) -> tuple[int, int]:
    """'I/N' -> (I, N); None -> (0, 1)."""
    if text is None:
        return (0, 1)
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        index, count = -1, 0
    if not 0 <= index < count:
        raise SystemExit(f"attnres compare: --shard must be I/N with 0 <= I < N, e.g. 0/2; got {text!r}")
    return index, count


def _convert(args: argparse.Namespace) -> int:
    import torch

    from attnres.hf.convert import convert_checkpoint
    from attnres.hf.export import save_hf

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    model = convert_checkpoint(args.source, residual=args.residual, num_blocks=args.num_blocks,
                               exact_conversion=args.exact, dtype=dtype, max_seq_len=args.max_seq_len)
    gguf = str(args.source).endswith(".gguf")
    out = save_hf(model, args.out, tokenizer_dir=None if gguf else args.source)
    if gguf:
        from attnres.hf.gguf import save_gguf_tokenizer

        save_gguf_tokenizer(args.source, out)
    print(f"converted {args.source} -> {out} ({model.config.residual}, {sum(p.numel() for p in model.parameters()):,} "
          f"parameters); load with: import attnres.hf; AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0


def _lm_eval(args: argparse.Namespace) -> int:
    from attnres.hf.lm_eval import PAPER_TASKS, run_lm_eval

    tasks = list(PAPER_TASKS) if args.tasks == "paper" else [t for t in args.tasks.split(",") if t]
    results = run_lm_eval(args.model, tasks, include_path=args.include_path, batch_size=args.batch_size,
                          limit=args.limit, device=args.device)
    text = json.dumps(results, indent=2, default=str)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


def _bench(args: argparse.Namespace) -> int:
    from attnres.bench import format_markdown, resolve_config, run_bench
    from attnres.bench.config import BENCH_OPTIONS

    config = resolve_config(args.preset, args.quick, **{name: getattr(args, name) for name in BENCH_OPTIONS})
    out = Path(args.out or f"reports/bench-{'quick' if args.quick else args.preset}")
    results = run_bench(config, out, command="attnres " + shlex.join(args.argv))
    print()
    print(format_markdown(results))
    print(f"report: {out / 'bench.md'} and {out / 'bench.json'}")
    return 0


def _analyze(args: argparse.Namespace) -> int:
    from attnres.analysis.analyze import analyze

    out = Path(args.out)
    analyze(args.checkpoints, out, labels=args.labels, max_batches=args.max_batches, device=args.device,
            command="attnres " + shlex.join(args.argv))
    print(f"report: {out / 'summary.md'}, {out / 'index.html'} and {out / 'analysis.json'}")
    return 0


def _add_run_arguments(parser: argparse.ArgumentParser, example: str) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override a config value, {example}")
    parser.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    parser.add_argument("--device", default="cpu",
                        help="cpu or cuda; under torchrun each process takes cuda:LOCAL_RANK (docs/distributed.md)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    from attnres.demo import DemoSettings

    parser = argparse.ArgumentParser(prog="attnres", description="Depth routing residuals for language models.")
    sub = parser.add_subparsers(dest="command", required=True)

    compare = sub.add_parser("compare", help="train every residual variant on the same data and write a report")
    compare.add_argument("--preset", default="default",
                         help="a bundled preset (configs/compare/NAME.yaml) or a preset YAML path; default: default")
    compare.add_argument("--seeds", type=int, default=None, help="seeds per variant (default: the preset's)")
    compare.add_argument("--out", default=None, help="report folder (default: reports/compare-PRESET)")
    compare.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="override the preset's run, e.g. --set train.steps=100")
    compare.add_argument("--device", default="cpu")
    compare.add_argument("--shard", default=None, metavar="I/N",
                         help="train only runs I, I+N, ... and write no report (N processes share a comparison; "
                              "finished runs are reused, so a last call without --shard writes the report)")
    compare.set_defaults(handler=_compare)

    train = sub.add_parser("train", help="train one model from a YAML config")
    train.add_argument("--config", required=True, help="YAML file with model, data and train sections")
    _add_run_arguments(train, "e.g. --set model.residual=delta_block --set train.lr=1e-3")
    train.set_defaults(handler=_train)

    finetune = sub.add_parser("finetune", help="fine-tune a converted model (the Delta paper's recipe by default)")
    finetune.add_argument("init", help="a directory from `attnres convert` (or a training checkpoint)")
    finetune.add_argument("--config", default=None, help="YAML with data/train/out_dir (model fields come from INIT)")
    _add_run_arguments(finetune, "e.g. --set train.query_init=normal --set train.steps=300")
    finetune.set_defaults(handler=_finetune)

    evaluate = sub.add_parser("eval", help="validation loss and perplexity of a checkpoint (or a run's latest)")
    evaluate.add_argument("checkpoint", help="a checkpoint directory (runs/X/checkpoints/step_N) or a run directory")
    evaluate.add_argument("--max-batches", type=int, default=None)
    evaluate.add_argument("--device", default="cpu")
    evaluate.set_defaults(handler=_eval)

    convert = sub.add_parser("convert", help="convert a Hugging Face Qwen3/Qwen2/Llama/Mistral checkpoint")
    convert.add_argument("source", help="a local Hugging Face checkpoint directory (config.json + safetensors) "
                                        "or a .gguf file")
    convert.add_argument("--residual", default="standard", help="the residual variant of the converted model")
    convert.add_argument("--num-blocks", type=int, default=None, help="blocks, for block_attnres and delta_block")
    convert.add_argument("--exact", choices=["gate", "partial"], default=None,
                         help="delta_block's exact conversion: a zero-initialised gate or the partial-sum source")
    convert.add_argument("--max-seq-len", type=int, default=None, help="default: the source's max_position_embeddings")
    convert.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    convert.add_argument("--out", required=True, help="output directory (Hugging Face format)")
    convert.set_defaults(handler=_convert)

    lm_eval = sub.add_parser("lm-eval", help="lm-evaluation-harness on a Hugging Face-format attnres model")
    lm_eval.add_argument("model", help="a directory from `attnres convert`, or a training checkpoint directory")
    lm_eval.add_argument("--tasks", default="paper",
                         help="comma-separated lm-eval tasks, or 'paper' for the Delta paper's eight (needs hub access)")
    lm_eval.add_argument("--include-path", default=None, help="a folder of extra task YAMLs")
    lm_eval.add_argument("--batch-size", type=int, default=1)
    lm_eval.add_argument("--limit", type=int, default=None, help="at most this many examples per task")
    lm_eval.add_argument("--out", default=None, help="also write the results JSON here")
    lm_eval.add_argument("--device", default="cpu")
    lm_eval.set_defaults(handler=_lm_eval)

    bench = sub.add_parser("bench", help="time and memory of each variant against standard, a depth sweep and "
                                         "a router micro-benchmark; writes bench.md and bench.json")
    bench.add_argument("--preset", default="cpu", help="cpu (the default; the targets' shapes) or paper-gpu "
                                                        "(2048 x 32, seq 4096, on CUDA)")
    bench.add_argument("--quick", action="store_true", help="a tiny model: a run of seconds (explicit options win)")
    bench.add_argument("--variants", nargs="+", default=None, metavar="VARIANT",
                       help="variants to compare with standard (space- or comma-separated; default: all four)")
    bench.add_argument("--hidden", dest="hidden_size", type=int, default=None, metavar="D",
                       help="model width (cpu: 256)")
    bench.add_argument("--layers", dest="num_layers", type=int, default=None, metavar="L", help="model depth (cpu: 24)")
    bench.add_argument("--seq-len", type=int, default=None, help="tokens per sequence and prompt length (cpu: 256)")
    bench.add_argument("--batch-size", type=int, default=None, help="sequences per batch (cpu: 1)")
    bench.add_argument("--vocab-size", type=int, default=None, help="vocabulary of the random tokens (cpu: 4096)")
    bench.add_argument("--num-blocks", type=int, default=None,
                       help="blocks of block variants; the nearest valid count is used (default: 8)")
    bench.add_argument("--repeats", type=int, default=None, help="measured rounds, at least 5 (cpu: 5)")
    bench.add_argument("--warmup", type=int, default=None, help="discarded rounds first (cpu: 2)")
    bench.add_argument("--depths", default=None, help="layer counts of the depth sweep, e.g. 12,24,48; 'none' skips it")
    bench.add_argument("--sweep-hidden", type=int, default=None, help="model width in the depth sweep (cpu: 64)")
    bench.add_argument("--sweep-seq-len", type=int, default=None, help="sequence length in the depth sweep (cpu: 128)")
    bench.add_argument("--decode-tokens", type=int, default=None, help="tokens decoded one at a time (cpu: 16)")
    bench.add_argument("--router-sources", type=int, default=None, help="sources of the router micro-benchmark (9)")
    bench.add_argument("--router-batch", type=int, default=None,
                       help="batch of the router's (batch, seq-len, hidden) sources (cpu: 32)")
    bench.add_argument("--precision", default=None, help="bf16 (autocast; the default) or fp32")
    bench.add_argument("--routing-impl", default=None, help="auto (default), reference, lean or triton")
    bench.add_argument("--device", default=None, help="cpu (default), cuda or cuda:N")
    bench.add_argument("--seed", type=int, default=None, help="seed of weights and tokens (default: 0)")
    bench.add_argument("--threads", type=int, default=None,
                       help="torch intra-op threads (default: torch's; --quick: 1)")
    bench.add_argument("--out", default=None, help="report folder (default: reports/bench-PRESET)")
    bench.set_defaults(handler=_bench)

    analyze = sub.add_parser("analyze", help="routing heatmaps, source cosines, RMS and gradient norm by depth of "
                                             "checkpoints on held-out batches; writes summary.md, index.html and "
                                             "analysis.json")
    analyze.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT",
                         help="checkpoint directories (runs/X/checkpoints/step_N) or run directories (their latest)")
    analyze.add_argument("--out", default="reports/analyze", help="report folder (default: reports/analyze)")
    analyze.add_argument("--max-batches", type=int, default=4,
                         help="held-out batches per checkpoint, of the run's batch size and seq_len (default: 4)")
    analyze.add_argument("--labels", nargs="+", default=None, metavar="LABEL",
                         help="one display name per checkpoint (default: variant and step)")
    analyze.add_argument("--device", default="cpu")
    analyze.set_defaults(handler=_analyze)

    demo = sub.add_parser("demo", help="train a tiny model of each variant on generated data and compare")
    defaults = DemoSettings()
    for f in fields(DemoSettings):
        demo.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=type(getattr(defaults, f.name)),
                          default=getattr(defaults, f.name), help=f"default: {getattr(defaults, f.name)}")
    demo.add_argument("--json", help="also write the results to this JSON file")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `attnres` command: exit 0 on success, 2 for bad input, 1 for a failed run."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    failures: tuple[type[Exception], ...] = ()
    if args.command in ("train", "finetune", "eval", "compare", "analyze"):
        from attnres.train import CheckpointError, TrainingError

        failures = (CheckpointError, TrainingError)
    try:
        return args.handler(args)
    except ValueError as error:  # configs, data and arguments: the user's input
        print(f"attnres {args.command}: error: {error}", file=sys.stderr)
        return 2
    except failures as error:  # corrupt or mismatched checkpoints, non-finite losses
        print(f"attnres {args.command}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
