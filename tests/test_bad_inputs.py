"""Every command refuses bad input in one line (issue 32, item 1).

One table, CASES: for each command, at least one input of each kind in KINDS. Every case must exit
non-zero (2 for bad input, 1 for a corrupt or mismatched checkpoint) with exactly one line on stderr,
"attnres COMMAND: error: ...", matching the case's pattern (the file or field, and what would work);
no traceback; and nothing written or changed: not the inputs, not the --out folder given (it must not
exist afterwards, or stay byte-identical), not the working directory (where default outputs go).

The inputs are built per case from a few tiny valid ones (`world`): a trained 2-step run, a tiny
Llama with a BPE tokenizer, its `attnres convert` output, and compare and scaling presets over a small
corpus. Where a kind does not apply to a command, the table uses the nearest input that command reads
and says so in a comment.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import re
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from safetensors.torch import load_file, save_file

import attnres.hf  # noqa: F401  (registers the Auto classes)
from attnres.cli import main
from attnres.common.config_files import bundled_config_dir
from attnres.compare.presets import load_preset as load_compare_preset
from attnres.compare.presets import variant_run, variant_slug
from attnres.data import train_bpe
from attnres.scaling.plan import plan_sweep
from attnres.scaling.preset import load_preset as load_scaling_preset
from tests.train.conftest import WORDS, tiny_run

COMMANDS = ("train", "eval", "compare", "scaling", "bench", "analyze", "convert", "finetune", "lm-eval", "generate")
KINDS = ("missing path", "wrong directory", "corrupt weights", "config.json", "other version", "invalid option")


@dataclass(frozen=True)
class World:
    """Valid tiny inputs, built once; every case copies what it spoils into its own folder."""

    root: Path
    corpus: Path  # 30 text documents
    run: Path  # a trained run directory (2 steps, one checkpoint)
    llama: Path  # a transformers Llama checkpoint with a BPE tokenizer
    converted: Path  # `attnres convert` of it
    run_settings: dict  # the run's YAML, without out_dir
    compare_preset: Path
    scaling_preset: Path

    @property
    def checkpoint(self) -> Path:
        return self.run / "checkpoints" / "step_00000002"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNRES_CACHE", str(tmp_path_factory.mktemp("cache")))  # a cache, not an output
        patch.setenv("HF_HUB_OFFLINE", "1")
        yield _build_world(root)


def _build_world(root: Path) -> World:
    corpus = root / "corpus"
    corpus.mkdir()
    rng = random.Random(0)
    for i in range(30):
        (corpus / f"d{i:02d}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(200)))
    run = tiny_run(corpus, root / "run", steps=2, checkpoint_every=2, eval_every=2, eval_batches=1, batch_size=2,
                   seq_len=16)
    (root / "run.yaml").write_text(yaml.safe_dump(run))
    assert main(["train", "--config", str(root / "run.yaml")]) == 0
    settings = {key: value for key, value in run.items() if key != "out_dir"}

    llama = root / "llama"
    tokenizer = train_bpe([" ".join(rng.choice(WORDS) for _ in range(200)) for _ in range(20)], vocab_size=300)
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(llama)
    tokenizer.save(llama)
    assert main(["convert", str(llama), "--out", str(root / "converted")]) == 0

    base = {"model": {k: v for k, v in run["model"].items() if k not in ("residual", "num_blocks")},
            "data": run["data"], "train": run["train"]}
    compare = {"description": "tiny", "seeds": 1, "cost": {"repeats": 5, "warmup": 1}, "run": base,
               "variants": [{"residual": "standard"}, {"residual": "block_attnres", "num_blocks": 2}]}
    (root / "compare.yaml").write_text(yaml.safe_dump(compare))
    scaling = yaml.safe_load((bundled_config_dir("scaling") / "tiny.yaml").read_text())
    scaling["run"]["data"] = dict(run["data"])
    (root / "scaling.yaml").write_text(yaml.safe_dump(scaling))
    return World(root, corpus, root / "run", llama, root / "converted", settings, root / "compare.yaml",
                 root / "scaling.yaml")


# ---------------------------------------------------------------- ways to spoil an input


def clone(source: Path, folder: Path, name: str) -> Path:
    """A copy of directory `source` as folder/name."""
    return Path(shutil.copytree(source, folder / name))


def corrupt(file: Path) -> Path:
    """Overwrite with bytes whose safetensors header length is 2**64 - 1 ("header too large")."""
    file.write_bytes(b"\xff" * 64)
    return file


def truncate(file: Path) -> Path:
    """Keep the first half of the file (a copy cut short)."""
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    return file


def edit_json(file: Path, change: Callable[[dict], object]) -> Path:
    """Apply `change` to the JSON object in `file` (in place), and write it back."""
    values = json.loads(file.read_text())
    change(values)
    file.write_text(json.dumps(values))
    return file


def write_yaml(file: Path, values) -> Path:
    """Write `values` as YAML into `file`."""
    file.write_text(yaml.safe_dump(values))
    return file


def run_config(w: World, tmp: Path, **changes) -> Path:
    """A run YAML of the world's tiny run, out_dir in the case's folder, sections replaced by `changes`."""
    return write_yaml(tmp / "run.yaml", {**w.run_settings, "out_dir": str(tmp / "out"), **changes})


def model_dir(w: World, tmp: Path, spoil: Callable[[Path], object], source: Path | None = None) -> str:
    """A copy of the converted model (or `source`) with `spoil(copy)` applied."""
    copy = clone(source or w.converted, tmp, "model")
    spoil(copy)
    return str(copy)


def set_config(**fields):
    """A spoil that sets fields of a directory's config.json."""
    return lambda directory: edit_json(directory / "config.json", lambda values: values.update(fields))


def checkpoint_copy(w: World, tmp: Path, spoil: Callable[[Path], object]) -> str:
    """A copy of the trained run's checkpoint with `spoil(copy)` applied."""
    copy = clone(w.checkpoint, tmp, "step_00000002")
    spoil(copy)
    return str(copy)


def run_copy(w: World, tmp: Path, spoil: Callable[[Path], object]) -> Path:
    """A copy of the trained run with `spoil(its checkpoint)` applied."""
    copy = clone(w.run, tmp, "run")
    spoil(copy / "checkpoints" / "step_00000002")
    return copy


def state(change: Callable[[dict], object]):
    """A spoil that edits a checkpoint's state.json."""
    return lambda checkpoint: edit_json(checkpoint / "state.json", change)


def old_format(values: dict) -> None:
    values["format"] = "attnres-checkpoint-0"


def step_as_text(checkpoint: Path) -> None:
    """A spoil that writes the first metrics.jsonl record's step of the checkpoint's run as a string."""
    path = checkpoint.parent.parent / "metrics.jsonl"
    lines = path.read_text().splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), "step": "1"})
    path.write_text("\n".join(lines) + "\n")


def fp8_weights(directory: Path) -> None:
    """A spoil that stores a model's matrices as float8 (an fp8-quantised checkpoint without its config)."""
    path = directory / "model.safetensors"
    weights = {name: tensor.to(torch.float8_e4m3fn) if tensor.dim() == 2 else tensor
               for name, tensor in load_file(path).items()}
    save_file(weights, path, metadata={"format": "pt"})


def foreign_out(tmp: Path) -> str:
    """An --out folder holding a bench.json of another version, to check it is left as it was."""
    out = tmp / "out"
    out.mkdir()
    (out / "bench.json").write_text(json.dumps({"version": 0, "rows": []}))
    return str(out)


def compare_record(w: World, tmp: Path) -> list[str]:
    """A comparison folder whose first run holds a record of an earlier version (the settings match, the
    results lack the fields this version's report reads)."""
    preset = load_compare_preset(str(w.compare_preset))
    folder = tmp / "out" / "runs" / variant_slug(preset.variants[0]) / "seed0"
    run = variant_run(preset.run, preset.variants[0], 0, str(folder))
    folder.mkdir(parents=True)
    (folder / "compare_record.json").write_text(json.dumps({"run": run.to_dict(), "record": {"val_loss": 5.0}}))
    return ["compare", "--preset", str(w.compare_preset), "--out", str(tmp / "out")]


def compare_preset(w: World, tmp: Path, section: str, **fields) -> str:
    """The world's compare preset with `fields` set in its run's `section` (model, data or train)."""
    values = yaml.safe_load(w.compare_preset.read_text())
    values["run"][section].update(fields)
    return str(write_yaml(tmp / "preset.yaml", values))


def compare_corrupt_checkpoint(w: World, tmp: Path) -> list[str]:
    """A comparison folder whose first run was interrupted after a checkpoint, now with corrupt weights."""
    checkpoints = Path(shutil.copytree(w.run / "checkpoints", tmp / "out" / "runs" / "standard" / "seed0" /
                                       "checkpoints"))
    corrupt(checkpoints / "step_00000002" / "model.safetensors")
    return ["compare", "--preset", str(w.compare_preset), "--out", str(tmp / "out")]


SCALING_PART = ["--sizes", "d16-l2", "d24-l2", "--variants", "standard"]


def scaling_runs(w: World, out: Path):
    """The runs of the sweep SCALING_PART asks for, into `out`."""
    return plan_sweep(load_scaling_preset(str(w.scaling_preset), sizes=SCALING_PART[1:3], variants=["standard"]), out)


def scaling_record(w: World, tmp: Path) -> list[str]:
    """A sweep folder whose runs hold records of an earlier version (no flops, no parameters)."""
    for planned in scaling_runs(w, tmp / "out"):
        folder = Path(planned.run.out_dir)
        folder.mkdir(parents=True)
        (folder / "scaling_record.json").write_text(json.dumps({"run": planned.run.to_dict(),
                                                                "record": {"final_val_loss": 5.0}}))
    return ["scaling", "--preset", str(w.scaling_preset), *SCALING_PART, "--out", str(tmp / "out")]


def scaling_corrupt_checkpoints(w: World, tmp: Path) -> list[str]:
    """A sweep folder whose interrupted runs left a checkpoint with corrupt weights (a resume reads them)."""
    for planned in scaling_runs(w, tmp / "out"):
        shutil.copytree(w.run / "checkpoints", Path(planned.run.out_dir) / "checkpoints")
        corrupt(Path(planned.run.out_dir) / "checkpoints" / "step_00000002" / "model.safetensors")
    return ["scaling", "--preset", str(w.scaling_preset), *SCALING_PART, "--out", str(tmp / "out"),
            "--cost-repeats", "0"]


def gguf(tmp: Path, version: int) -> str:
    """A GGUF header of `version` with no tensors and no metadata."""
    path = tmp / "model.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", version, 0, 0))
    return str(path)


# ---------------------------------------------------------------- the table


@dataclass(frozen=True)
class Case:
    command: str
    kind: str  # one of KINDS
    what: str  # the bad input, in words
    argv: Callable[[World, Path], list[str]]  # (world, the case's own folder) -> the command line
    message: str  # a regular expression the one line must match: the file or field, and what would work
    needs: str | None = None  # an optional package the case needs (skipped without it)


GEN = ["--prompt", "the king", "--max-new-tokens", "2", "--no-compile"]
FT = ["--set", "train.seq_len=16", "--set", "train.batch_size=2", "--set", "train.steps=2"]


def ft_args(w: World, tmp: Path) -> list[str]:
    """finetune settings that fit the tiny model, its output in the case's folder."""
    return [*FT, "--set", f"out_dir={tmp / 'out'}", "--set", f"data.source={w.corpus}"]


CASES = [
    # ---- train: --config YAML, its data source, out_dir (--resume reads its checkpoints), init_from
    Case("train", "missing path", "--config that does not exist",
         lambda w, t: ["train", "--config", str(t / "absent.yaml")], r"config file \S*absent\.yaml does not exist"),
    Case("train", "wrong directory", "--config naming a folder",
         lambda w, t: ["train", "--config", str(w.corpus)],
         r"config file \S*corpus is a folder; give the path of a YAML file"),
    Case("train", "wrong directory", "data.source: a folder with no text files (nothing may be written to out_dir)",
         lambda w, t: ["train", "--config", str(run_config(w, t, data={**w.run_settings["data"],
                                                                       "source": str(w.run / "checkpoints")}))],
         r"DataConfig\.source: no \.txt, \.jsonl, \.parquet files under the folder"),
    Case("train", "corrupt weights", "init_from with a corrupt model.safetensors",
         lambda w, t: ["train", "--config", str(write_yaml(t / "run.yaml", {
             "init_from": model_dir(w, t, lambda d: corrupt(d / "model.safetensors")), "out_dir": str(t / "out"),
             "data": {"source": str(w.corpus), "tokenizer": str(w.converted)}, "train": w.run_settings["train"]}))],
         r"init_from: \S*model\.safetensors is corrupt or unreadable .*; convert the model again"),
    Case("train", "corrupt weights", "--resume from a checkpoint with truncated weights",
         lambda w, t: ["train", "--config", str(run_config(w, t, out_dir=str(run_copy(
             w, t, lambda c: truncate(c / "model.safetensors"))))), "--resume"],
         r"step_00000002 is corrupt: model\.safetensors does not match .*; use another checkpoint"),
    Case("train", "invalid option", "a mixture of experts larger than any machine, by --set (was: the allocator's "
         "'can't allocate memory')",
         lambda w, t: ["train", "--config", str(run_config(w, t)), "--set", "model.moe.num_experts=1000000",
                       "--set", "model.moe.experts_per_token=2", "--set", "model.moe.expert_size=100000"],
         r"the model's [\d,]+ parameters with their gradients and AdamW's two moments \(fp32\) need [\d.]+ GiB, more "
         r"than the [\d.]+ GiB of memory this machine has; make the model smaller \(model\.hidden_size, "),
    # train reads a config.json only through init_from; the nearest of its own: the YAML's model section
    Case("train", "config.json", "init_from whose config.json has an unknown model_type",
         lambda w, t: ["train", "--config", str(write_yaml(t / "run.yaml", {
             "init_from": model_dir(w, t, set_config(model_type="gpt9")), "out_dir": str(t / "out"),
             "data": {"source": str(w.corpus), "tokenizer": str(w.converted)}, "train": w.run_settings["train"]}))],
         r"init_from: \S*config\.json describes a 'gpt9' model; convert it first with `attnres convert`"),
    Case("train", "config.json", "model.hidden_size of the wrong type in the YAML",
         lambda w, t: ["train", "--config", str(run_config(w, t, model={**w.run_settings["model"],
                                                                        "hidden_size": "big"}))],
         r"ModelConfig\.hidden_size must be a positive integer, got 'big'"),
    Case("train", "other version", "--resume from a checkpoint of another format version",
         lambda w, t: ["train", "--config", str(run_config(w, t, out_dir=str(run_copy(w, t, state(old_format))))),
                       "--resume"],
         r"is not an attnres checkpoint \(format 'attnres-checkpoint-1' or 'attnres-dcp-checkpoint-1' expected\)"),
    Case("train", "wrong directory", "out_dir inside data.source (was: the next run read metrics.jsonl as text)",
         lambda w, t: ["train", "--config", str(run_config(w, t)), "--set", f"out_dir={w.corpus / 'run'}"],
         r"out_dir \S*corpus/run is inside data\.source \S*corpus: the run's own files .* choose an out_dir outside"),
    Case("train", "other version", "--resume with a metrics.jsonl record whose step is a string (was: a TypeError)",
         lambda w, t: ["train", "--config", str(run_config(w, t, out_dir=str(run_copy(w, t, step_as_text)))),
                       "--resume", "--set", "train.steps=4"],
         r"metrics\.jsonl: a record's step is '1', not an integer; .*changed by hand: fix that record or remove it"),
    Case("train", "invalid option", "--device tpu",
         lambda w, t: ["train", "--config", str(run_config(w, t)), "--device", "tpu"],
         r"--device must be 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
    Case("train", "invalid option", "--set train.lr=fast",
         lambda w, t: ["train", "--config", str(run_config(w, t)), "--set", "train.lr=fast"],
         r"TrainConfig\.lr must be a positive number, got 'fast'"),

    # ---- eval: a checkpoint directory or a run directory
    Case("eval", "missing path", "a checkpoint that does not exist",
         lambda w, t: ["eval", str(t / "absent")], r"absent does not exist \(expected a checkpoint directory"),
    Case("eval", "wrong directory", "a folder of text",
         lambda w, t: ["eval", str(w.corpus)], r"corpus is not a checkpoint directory \(runs/X/checkpoints/step_N"),
    Case("eval", "wrong directory", "a converted model (no training state)",
         lambda w, t: ["eval", str(w.converted)],
         r"converted is a Hugging Face-format model .*; measure it with `attnres analyze \S+ --data SOURCE`"),
    Case("eval", "corrupt weights", "a checkpoint with truncated weights",
         lambda w, t: ["eval", checkpoint_copy(w, t, lambda c: truncate(c / "model.safetensors"))],
         r"is corrupt: model\.safetensors does not match its recorded size and sha256; use another checkpoint"),
    # eval reads no config.json: the model's fields come from state.json's run_config
    Case("eval", "config.json", "state.json's run_config with model.hidden_size of the wrong type",
         lambda w, t: ["eval", checkpoint_copy(w, t, state(
             lambda s: s["run_config"]["model"].update(hidden_size="big")))],
         r"ModelConfig\.hidden_size must be a positive integer, got 'big'"),
    Case("eval", "other version", "state.json of another format version",
         lambda w, t: ["eval", checkpoint_copy(w, t, state(old_format))],
         r"is not an attnres checkpoint \(format 'attnres-checkpoint-1'"),
    Case("eval", "other version", "state.json without a step",
         lambda w, t: ["eval", checkpoint_copy(w, t, state(lambda s: s.pop("step")))], r"state\.json\S* step"),
    Case("eval", "invalid option", "--max-batches 0",
         lambda w, t: ["eval", str(w.checkpoint), "--max-batches", "0"],
         r"--max-batches must be a positive integer, got 0"),

    # ---- compare: --preset YAML, --out (finished runs' records and interrupted runs' checkpoints reused)
    Case("compare", "missing path", "--preset that does not exist",
         lambda w, t: ["compare", "--preset", str(t / "absent.yaml")],
         r"compare preset \S*absent\.yaml does not exist"),
    Case("compare", "wrong directory", "--preset naming a folder",
         lambda w, t: ["compare", "--preset", str(Path(shutil.copytree(w.corpus, t / "corpus.yaml")))],
         r"compare preset \S*corpus\.yaml is a folder; give the path of a YAML file"),
    Case("compare", "wrong directory", "--out naming a file",
         lambda w, t: ["compare", "--preset", str(w.compare_preset), "--out", str(w.run / "config.yaml")],
         r"--out \S*config\.yaml is a file, not a folder; give a folder path"),
    Case("compare", "corrupt weights", "an interrupted run in --out with corrupt weights",
         compare_corrupt_checkpoint, r"seed0/checkpoints/step_00000002 is corrupt: model\.safetensors does not match"),
    # compare reads no config.json: its preset's run section
    Case("compare", "config.json", "the preset's run.model.hidden_size of the wrong type",
         lambda w, t: ["compare", "--preset", compare_preset(w, t, "model", hidden_size="big")],
         r"ModelConfig\.hidden_size must be a positive integer, got 'big'"),
    Case("compare", "config.json", "the preset's data source missing (nothing may be written to --out)",
         lambda w, t: ["compare", "--preset", compare_preset(w, t, "data", source=str(t / "absent")),
                       "--out", str(t / "out")],
         r"DataConfig\.source: no such file or directory: \S*absent"),
    Case("compare", "other version", "a finished run's compare_record.json of an earlier version",
         compare_record, r"compare_record\.json is a record of another attnres version .*; delete it to train"),
    Case("compare", "invalid option", "--seeds 0", lambda w, t: ["compare", "--preset", str(w.compare_preset),
                                                                 "--seeds", "0", "--out", str(t / "out")],
         r"--seeds must be a positive integer, got 0"),
    Case("compare", "invalid option", "--shard 2/2", lambda w, t: ["compare", "--preset", str(w.compare_preset),
                                                                   "--shard", "2/2", "--out", str(t / "out")],
         r"--shard must be I/N with 0 <= I < N, e\.g\. 0/2; got '2/2'"),

    # ---- scaling: --preset YAML, --out (its runs' records and checkpoints reused)
    Case("scaling", "missing path", "--preset that does not exist",
         lambda w, t: ["scaling", "--preset", str(t / "absent.yaml")],
         r"scaling preset \S*absent\.yaml does not exist"),
    Case("scaling", "wrong directory", "--out naming a file",
         lambda w, t: ["scaling", "--preset", str(w.scaling_preset), "--out", str(w.run / "config.yaml")],
         r"--out \S*config\.yaml is a file, not a folder"),
    Case("scaling", "wrong directory", "--preset naming a folder with no .yaml suffix",
         lambda w, t: ["scaling", "--preset", str(w.corpus)],
         r"unknown scaling preset '\S*corpus'; available: .*\(or give a path to a preset YAML file\)"),
    Case("scaling", "corrupt weights", "interrupted runs in --out with corrupt weights",
         scaling_corrupt_checkpoints, r"checkpoints/step_00000002 is corrupt: model\.safetensors does not match"),
    # scaling reads no config.json: its preset's sizes and run
    Case("scaling", "config.json", "a size's hidden_size of the wrong type",
         lambda w, t: ["scaling", "--preset", str(write_yaml(t / "p.yaml", {**yaml.safe_load(
             w.scaling_preset.read_text()), "sizes": [{"hidden_size": "big", "num_layers": 2},
                                                      {"hidden_size": 32, "num_layers": 2}]}))],
         r"sizes\[0\]\.hidden_size must be a positive integer, got 'big'"),
    Case("scaling", "other version", "finished runs' scaling_record.json of an earlier version",
         scaling_record, r"scaling_record\.json is a record of another attnres version .*; delete it to train"),
    Case("scaling", "invalid option", "--replicates 0",
         lambda w, t: ["scaling", "--preset", str(w.scaling_preset), *SCALING_PART, "--replicates", "0",
                       "--out", str(t / "out")], r"--replicates must be a positive integer, got 0"),
    Case("scaling", "invalid option", "--seeds -1",
         lambda w, t: ["scaling", "--preset", str(w.scaling_preset), "--seeds", "-1", "--dry-run"],
         r"--seeds must be a positive integer, got -1"),

    # ---- bench: --preset YAML and its settings; it reads no weights, config.json or records (it writes
    # bench.json into --out: each case gives an --out holding another version's bench.json, left unchanged)
    Case("bench", "missing path", "--preset that does not exist",
         lambda w, t: ["bench", "--preset", str(t / "absent.yaml"), "--out", foreign_out(t)],
         r"--preset: preset file \S*absent\.yaml does not exist"),
    Case("bench", "wrong directory", "--preset naming a folder",
         lambda w, t: ["bench", "--preset", str(w.corpus), "--out", foreign_out(t)],
         r"--preset: \S*corpus is a folder; give a bundled preset's name or the path of a preset YAML file"),
    Case("bench", "wrong directory", "--out naming a file",
         lambda w, t: ["bench", "--quick", "--out", str(w.run / "config.yaml")],
         r"--out \S*config\.yaml is a file, not a folder"),
    # no weights: the nearest, a preset file that is not text
    Case("bench", "corrupt weights", "--preset: a binary file",
         lambda w, t: ["bench", "--preset", str(w.converted / "model.safetensors"), "--out", foreign_out(t)],
         r"bench preset \S*model\.safetensors is not valid YAML"),
    # no config.json: the preset's settings
    Case("bench", "config.json", "a preset setting of the wrong type",
         lambda w, t: ["bench", "--preset", str(write_yaml(t / "p.yaml", {"repeats": "many"})),
                       "--out", foreign_out(t)],
         r"--repeats must be an integer >= 5 .*, got 'many'"),
    # no records: a preset of another version, with a setting this one does not have
    Case("bench", "other version", "a preset with a setting of another version",
         lambda w, t: ["bench", "--preset", str(write_yaml(t / "p.yaml", {"sweep_depths": [12]})),
                       "--out", foreign_out(t)],
         r"unknown bench settings \['sweep_depths'\]; allowed: \["),
    Case("bench", "invalid option", "--variants nosuch",
         lambda w, t: ["bench", "--quick", "--variants", "nosuch", "--out", foreign_out(t)],
         r"--variants: unknown variant 'nosuch'; allowed: \["),
    Case("bench", "invalid option", "--device tpu",
         lambda w, t: ["bench", "--quick", "--device", "tpu", "--out", foreign_out(t)],
         r"--device must be 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),

    # ---- analyze: checkpoints or run directories, or with --data converted models' directories
    Case("analyze", "missing path", "a checkpoint that does not exist",
         lambda w, t: ["analyze", str(t / "absent"), "--out", str(t / "out")],
         r"absent does not exist \(expected a checkpoint directory"),
    Case("analyze", "wrong directory", "a folder of text",
         lambda w, t: ["analyze", str(w.corpus), "--out", str(t / "out")], r"corpus is not a checkpoint directory"),
    Case("analyze", "wrong directory", "a converted model without --data",
         lambda w, t: ["analyze", str(w.converted), "--out", str(t / "out")],
         r"converted is a Hugging Face-format directory .*; give --data SOURCE"),
    Case("analyze", "corrupt weights", "a converted model with corrupt weights",
         lambda w, t: ["analyze", model_dir(w, t, lambda d: corrupt(d / "model.safetensors")), "--data",
                       str(w.corpus), "--out", str(t / "out")],
         r"model\.safetensors is corrupt or unreadable \(.*header too large\); convert the model again"),
    Case("analyze", "corrupt weights", "a checkpoint with truncated weights",
         lambda w, t: ["analyze", checkpoint_copy(w, t, lambda c: truncate(c / "model.safetensors")),
                       "--out", str(t / "out")], r"model\.safetensors does not match its recorded size and sha256"),
    Case("analyze", "config.json", "a converted model's config.json with an unknown model_type",
         lambda w, t: ["analyze", model_dir(w, t, set_config(model_type="gpt9")), "--data", str(w.corpus),
                       "--out", str(t / "out")],
         r"config\.json describes a 'gpt9' model; convert it first with `attnres convert`"),
    Case("analyze", "config.json", "a converted model's config.json holding a list",
         lambda w, t: ["analyze", model_dir(w, t, lambda d: (d / "config.json").write_text("[1, 2]")), "--data",
                       str(w.corpus), "--out", str(t / "out")], r"config\.json must hold a JSON object"),
    Case("analyze", "other version", "a checkpoint's state.json of another format version",
         lambda w, t: ["analyze", checkpoint_copy(w, t, state(old_format)), "--out", str(t / "out")],
         r"is not an attnres checkpoint \(format 'attnres-checkpoint-1'"),
    Case("analyze", "invalid option", "--seq-len 0",
         lambda w, t: ["analyze", str(w.converted), "--data", str(w.corpus), "--seq-len", "0", "--out", str(t / "out")],
         r"--seq-len must be a positive integer, got 0"),
    Case("analyze", "invalid option", "--out naming a file",
         lambda w, t: ["analyze", str(w.checkpoint), "--out", str(w.run / "config.yaml")],
         r"--out \S*config\.yaml is a file, not a folder"),

    # ---- convert: a Hugging Face checkpoint directory (config.json + weights) or a .gguf file
    Case("convert", "missing path", "a source that does not exist",
         lambda w, t: ["convert", str(t / "absent"), "--out", str(t / "out")],
         r"checkpoint directory '\S*absent' does not exist"),
    Case("convert", "wrong directory", "a folder of text",
         lambda w, t: ["convert", str(w.corpus), "--out", str(t / "out")],
         r"checkpoint: \S*corpus/config\.json does not exist; a Hugging Face checkpoint directory holds"),
    Case("convert", "corrupt weights", "a corrupt model.safetensors",
         lambda w, t: ["convert", model_dir(w, t, lambda d: corrupt(d / "model.safetensors"), w.llama),
                       "--out", str(t / "out")],
         r"cannot read \S*model\.safetensors \(corrupt or truncated safetensors file\?\)"),
    Case("convert", "corrupt weights", "a truncated model.safetensors",
         lambda w, t: ["convert", model_dir(w, t, lambda d: truncate(d / "model.safetensors"), w.llama),
                       "--out", str(t / "out")], r"cannot read \S*model\.safetensors .*not fully covered"),
    Case("convert", "config.json", "hidden_size of the wrong type",
         lambda w, t: ["convert", model_dir(w, t, set_config(hidden_size="big"), w.llama), "--out", str(t / "out")],
         r"llama config does not give a valid attnres ModelConfig: ModelConfig\.hidden_size must be a positive"),
    Case("convert", "config.json", "an unknown model_type",
         lambda w, t: ["convert", model_dir(w, t, set_config(model_type="gpt9"), w.llama), "--out", str(t / "out")],
         r"unsupported model_type 'gpt9'; supported model types: \[.*'kimi_linear'\]"),
    # convert's sources carry no record of ours: the nearest, a GGUF file of a format version it does not read
    Case("convert", "other version", "a GGUF v1 file",
         lambda w, t: ["convert", gguf(t, 1), "--out", str(t / "out")],
         r"cannot read GGUF file \S*model\.gguf \(.*GGUF v1.*\); give a GGUF v2 or v3 file"),
    Case("convert", "config.json", "an fp8 checkpoint (quantization_config)",
         lambda w, t: ["convert", model_dir(w, t, set_config(quantization_config={"quant_method": "fp8"}), w.llama),
                       "--out", str(t / "out")],
         r"config\.json has a quantization_config \(quant_method 'fp8'\): the weights are quantised"),
    Case("convert", "corrupt weights", "fp8 weights without a quantization_config (was: isfinite's traceback)",
         lambda w, t: ["convert", model_dir(w, t, fp8_weights, w.llama), "--out", str(t / "out")],
         r"tensor '\S+' has dtype F8_E4M3, a quantised \(fp8\) weight; .* dequantise the checkpoint first"),
    Case("convert", "invalid option", "--option num_blocks=7 for 2 layers",
         lambda w, t: ["convert", str(w.llama), "--residual", "block_attnres", "--option", "num_blocks=7",
                       "--out", str(t / "out")],
         r"num_blocks must be an integer from 1 to 2 \* num_layers = 4 .*got 7"),
    Case("convert", "invalid option", "--max-seq-len that is not a number (argparse's error, in one line)",
         lambda w, t: ["convert", str(w.llama), "--max-seq-len", "long", "--out", str(t / "out")],
         r"argument --max-seq-len: invalid int value: 'long' \(attnres convert --help lists the options\)"),
    Case("convert", "invalid option", "--out naming a folder that is not empty",
         lambda w, t: ["convert", str(w.llama), "--out", str(w.corpus)],
         r"output directory '\S*corpus' already exists and is not empty; choose another --out"),

    # ---- finetune: INIT, a converted model's directory or a training checkpoint
    Case("finetune", "missing path", "INIT that does not exist",
         lambda w, t: ["finetune", str(t / "absent"), *ft_args(w, t)],
         r"init_from: \S*absent/config\.json does not exist; expected the output of `attnres convert`"),
    Case("finetune", "invalid option", "--set data.tokenizer=bpe on a model with its own tokenizer (was: 'has none')",
         lambda w, t: ["finetune", str(w.converted), *ft_args(w, t), "--set", "data.tokenizer=bpe"],
         r"data\.tokenizer is 'bpe', but a fine-tuned model must read the tokens it was trained on: leave "
         r"data\.tokenizer out to use \S*converted's own tokenizer"),
    Case("finetune", "wrong directory", "a run directory (not one of its checkpoints)",
         lambda w, t: ["finetune", str(w.run), *ft_args(w, t)],
         r"init_from: \S*run/config\.json does not exist; expected the output of `attnres convert` or a training"),
    Case("finetune", "corrupt weights", "a converted model with corrupt weights",
         lambda w, t: ["finetune", model_dir(w, t, lambda d: corrupt(d / "model.safetensors")), *ft_args(w, t)],
         r"init_from: \S*model\.safetensors is corrupt or unreadable .*; convert the model again"),
    Case("finetune", "config.json", "a model not converted yet",
         lambda w, t: ["finetune", str(w.llama), *ft_args(w, t)],
         r"config\.json describes a 'llama' model; convert it first with `attnres convert`"),
    Case("finetune", "config.json", "config.json holding a list",
         lambda w, t: ["finetune", model_dir(w, t, lambda d: (d / "config.json").write_text("[1]")),
                       *ft_args(w, t)], r"config\.json must hold a JSON object"),
    Case("finetune", "other version", "config.json of a version with a variant this one lacks",
         lambda w, t: ["finetune", model_dir(w, t, set_config(residual="future_variant")), *ft_args(w, t)],
         r"ModelConfig\.residual must be one of \[.*\], got 'future_variant'"),
    Case("finetune", "invalid option", "--set train.lr=-1",
         lambda w, t: ["finetune", str(w.converted), *ft_args(w, t), "--set", "train.lr=-1"],
         r"TrainConfig\.lr must be a positive number, got -1"),

    # ---- lm-eval: MODEL, a converted model's directory or a training checkpoint
    Case("lm-eval", "missing path", "MODEL that does not exist (was a traceback: a hub repo id)",
         lambda w, t: ["lm-eval", str(t / "absent"), "--tasks", "paper"],
         r"MODEL '\S*absent': \S*absent/config\.json does not exist; give a directory written by"),
    Case("lm-eval", "wrong directory", "a run directory",
         lambda w, t: ["lm-eval", str(w.run), "--tasks", "paper"], r"MODEL '\S*run': \S*config\.json does not exist"),
    Case("lm-eval", "corrupt weights", "a corrupt model.safetensors",
         lambda w, t: ["lm-eval", model_dir(w, t, lambda d: corrupt(d / "model.safetensors")), "--tasks", "paper"],
         r"model\.safetensors is corrupt or truncated \(.*header too large\); convert the model again"),
    Case("lm-eval", "config.json", "config.json holding a list",
         lambda w, t: ["lm-eval", model_dir(w, t, lambda d: (d / "config.json").write_text("[1]")),
                       "--tasks", "paper"], r"config\.json must hold a JSON object, got an array"),
    Case("lm-eval", "config.json", "a model not converted yet",
         lambda w, t: ["lm-eval", str(w.llama), "--tasks", "paper"],
         r"holds a 'llama' model, not an attnres one; convert it first: attnres convert"),
    Case("lm-eval", "other version", "config.json of a version with a variant this one lacks",
         lambda w, t: ["lm-eval", model_dir(w, t, set_config(residual="future_variant")), "--tasks", "paper"],
         r"config\.json: ModelConfig\.residual must be one of \[.*\], got 'future_variant'"),
    Case("lm-eval", "invalid option", "--tasks naming no lm-eval task",
         lambda w, t: ["lm-eval", str(w.converted), "--tasks", "arc_easyy", "--out", str(t / "r.json")],
         r"--tasks: 'arc_easyy' is not an lm-eval task .*`lm-eval ls tasks` lists them", needs="lm_eval"),
    Case("lm-eval", "invalid option", "--batch-size 0",
         lambda w, t: ["lm-eval", str(w.converted), "--tasks", "paper", "--batch-size", "0"],
         r"--batch-size must be a positive integer, got 0"),
    Case("lm-eval", "invalid option", "--out in a folder that does not exist",
         lambda w, t: ["lm-eval", str(w.converted), "--tasks", "paper", "--out", str(t / "no" / "r.json")],
         r"--out \S*r\.json: give a file path in an existing folder"),

    # ---- generate: MODEL, a converted model's directory or a training checkpoint
    Case("generate", "missing path", "MODEL that does not exist",
         lambda w, t: ["generate", str(t / "absent"), *GEN], r"MODEL '\S*absent': \S*config\.json does not exist"),
    Case("generate", "wrong directory", "a folder of text",
         lambda w, t: ["generate", str(w.corpus), *GEN], r"MODEL '\S*corpus': \S*corpus/config\.json does not exist"),
    Case("generate", "corrupt weights", "a corrupt model.safetensors beside a good config and tokenizer "
         "(was a traceback: SafetensorError)",
         lambda w, t: ["generate", model_dir(w, t, lambda d: corrupt(d / "model.safetensors")), *GEN],
         r"model\.safetensors is corrupt or truncated \(.*header too large\); convert the model again"),
    Case("generate", "corrupt weights", "a truncated model.safetensors",
         lambda w, t: ["generate", model_dir(w, t, lambda d: truncate(d / "model.safetensors")), *GEN],
         r"model\.safetensors is corrupt or truncated \(.*not fully covered\)"),
    Case("generate", "config.json", "hidden_size of the wrong type",
         lambda w, t: ["generate", model_dir(w, t, set_config(hidden_size="big")), *GEN],
         r"config\.json: ModelConfig\.hidden_size must be a positive integer, got 'big'"),
    Case("generate", "config.json", "an unknown model_type",
         lambda w, t: ["generate", model_dir(w, t, set_config(model_type="gpt9")), *GEN],
         r"holds a 'gpt9' model, not an attnres one; convert it first"),
    Case("generate", "other version", "config.json of a version with a variant this one lacks",
         lambda w, t: ["generate", model_dir(w, t, set_config(residual="future_variant")), *GEN],
         r"config\.json: ModelConfig\.residual must be one of \[.*\], got 'future_variant'"),
    Case("generate", "other version", "a tokenizer.json that does not parse",
         lambda w, t: ["generate", model_dir(w, t, lambda d: (d / "tokenizer.json").write_text("{not json")), *GEN],
         r"no tokenizer could be loaded from it \(.*\); give a directory with its tokenizer files"),
    Case("generate", "invalid option", "a --prompt that is not UTF-8 ($'\\xff\\xfe king')",
         lambda w, t: ["generate", str(w.converted), "--prompt", "\udcff\udcfe king", "--no-compile"],
         r"--prompt is not valid UTF-8 text \(byte 0xff at character 0\); pass UTF-8"),
    Case("generate", "invalid option", "--max-new-tokens whose static cache no machine holds, on a model with "
         "10^12 positions (was: the allocator's 'can't allocate memory')",
         lambda w, t: ["generate", model_dir(w, t, set_config(max_seq_len=10 ** 12)), "--prompt", "the king",
                       "--max-new-tokens", str(10 ** 12 - 64), "--no-compile"],
         r"max_new_tokens=999,999,999,936: a static cache of [\d,]+ positions for 1 row\(s\) \([\d.]+ GiB\) and "
         r"the weights \([\d.]+ GiB\) need [\d.]+ GiB, more than the [\d.]+ GiB of memory this machine has; "
         r"ask for at most [\d,]+ new tokens"),
    Case("generate", "invalid option", "--threads 100000 (was: mmap's 'Cannot allocate memory')",
         lambda w, t: ["generate", str(w.converted), *GEN, "--threads", "100000"],
         r"--threads 100000 is more than the \d+ CPUs this process may use; give at most \d+"),
    Case("generate", "invalid option", "--seed 10**23 (was: torch's 'Overflow when unpacking long long')",
         lambda w, t: ["generate", str(w.converted), *GEN, "--sample", "--seed", str(10 ** 23)],
         r"--seed must be an integer from 0 to 2\*\*64 - 1 \(torch's seed range\), got 1000"),
    Case("generate", "invalid option", "--top-p 2",
         lambda w, t: ["generate", str(w.converted), *GEN, "--sample", "--top-p", "2"],
         r"--top-p must be a number in \(0, 1\], got 2\.0"),
    Case("generate", "invalid option", "--dtype fp16 (argparse's error, in one line)",
         lambda w, t: ["generate", str(w.converted), *GEN, "--dtype", "fp16"],
         r"argument --dtype: invalid choice: 'fp16' \(choose from 'fp32', 'bf16'\)"),
    Case("generate", "invalid option", "--device tpu",
         lambda w, t: ["generate", str(w.converted), *GEN, "--device", "tpu"],
         r"--device must be 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
]


def snapshot(*roots: Path) -> dict[str, str]:
    """{path: sha256 of its bytes, or "dir"} of everything under `roots`, hidden files included."""
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for root in roots for p in sorted(root.rglob("*"))}


def test_the_table_covers_every_command_with_every_kind():
    for command in COMMANDS:
        kinds = [case.kind for case in CASES if case.command == command]
        assert set(kinds) == set(KINDS) and len(kinds) >= 6, (command, kinds)
    assert {case.command for case in CASES} == set(COMMANDS)


@pytest.mark.parametrize("case", [
    pytest.param(case, id=f"{case.command}: {case.what}", marks=pytest.mark.skipif(
        case.needs is not None and importlib.util.find_spec(case.needs) is None, reason=f"{case.needs} not installed"))
    for case in CASES])
def test_bad_input_is_refused_in_one_line_and_writes_nothing(case, world, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # default outputs (reports/..., runs/...) would land here
    # transformers' weight-loading bar, drawn before a check that needs the loaded model, is not a message
    monkeypatch.setattr(transformers.utils.logging, "_tqdm_active", False)
    argv = case.argv(world, tmp_path)
    capsys.readouterr()
    before = snapshot(world.root, tmp_path)
    try:
        code = main(argv)
    except SystemExit as exit:  # argparse's own errors: an invalid choice, a value of the wrong type
        code = exit.code
    err = capsys.readouterr().err
    assert code in (1, 2), f"exit {code}; stderr: {err}"
    prefix = f"attnres {case.command}: error: "
    assert err.startswith(prefix) and err.count("\n") == 1 and err.endswith("\n"), err
    assert re.search(case.message, err[len(prefix):]), f"{case.message!r} not in {err!r}"
    assert snapshot(world.root, tmp_path) == before, "an input changed, or something was written"
