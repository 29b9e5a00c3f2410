"""Streaming conversion (`attnres.hf.streaming`, what `attnres convert` runs on safetensors sources)
against the in-memory reference (`convert_to_hf`): the same files bit for bit, the same logits in
transformers and in attnres from sharded output, the same refusals in one line before any weight is
read, nothing finished-looking after a failure, and a peak memory bounded by the largest source shard."""

import copy
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

import attnres.hf  # noqa: E402,F401  (registers the Auto classes)
from attnres.cli import main  # noqa: E402
from attnres.hf import streaming  # noqa: E402
from attnres.hf.convert import ConversionError  # noqa: E402
from attnres.hf.export import convert_to_hf, to_hf_model  # noqa: E402
from attnres.hf.streaming import stream_to_hf  # noqa: E402
from attnres.model import AttnResLM, ModelConfig  # noqa: E402
from attnres.train.starting_model import load_initial_weights  # noqa: E402
from tests.crash import Kill, assert_whole, run_cli  # noqa: E402
from tests.hf.test_convert import EXACT_VARIANTS, save_hf_model  # noqa: E402
from tests.hf.test_kimi_linear import save_kimi  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "benchmarks"))  # as when run as a script
import streaming_convert  # noqa: E402

SHARD = "20KB"  # the sources' shard size: several shards, a layer's experts split across two
TOKENIZER_CONFIG = '{"eos_token": "x"}'
IDS = torch.randint(3, 96, (2, 9), generator=torch.Generator().manual_seed(3))
# What streaming may hold above the source shard it is reading (a CHUNK_BYTES slice read and cast, the
# meta model, allocator slack); measured 0.5 to 1.3 MB above the largest shard on this project's machine.
CONSTANT_BYTES = 16 * 10**6


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """{name: (sharded checkpoint directory, transformers model)}: Qwen3 untied and tied, Kimi Linear."""
    out = {}
    for name, tie in (("qwen3", False), ("qwen3-tied", True)):
        directory = tmp_path_factory.mktemp(name)
        out[name] = directory, save_hf_model("qwen3", directory, tie=tie, max_shard_size=SHARD)
    kimi = save_kimi(tmp_path_factory.mktemp("kimi-single"), "issue")
    directory = tmp_path_factory.mktemp("kimi")
    kimi.save_pretrained(directory, max_shard_size=SHARD)
    out["kimi"] = directory, kimi
    for directory, _ in out.values():
        assert len(list(directory.glob("model-*.safetensors"))) > 2
        (directory / "tokenizer_config.json").write_text(TOKENIZER_CONFIG)
    return out


def files(directory):
    return {p.name: p.read_bytes() for p in Path(directory).iterdir()}


def logits(model):
    with torch.no_grad():
        out = model(input_ids=IDS) if isinstance(model, transformers.PreTrainedModel) else model(IDS)
    return out.logits


def test_the_kimi_source_splits_a_layers_experts_across_shards(sources):
    """So the test below covers a stacked tensor whose parts come from two source files."""
    directory, _ = sources["kimi"]
    weight_map = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    for layer in range(1, 4):
        shards = {file for name, file in weight_map.items() if f"layers.{layer}.block_sparse_moe.experts." in name}
        if len(shards) > 1:
            return
    pytest.fail("no layer's experts span two shards: make SHARD smaller")


@pytest.mark.parametrize("source", ["qwen3", "qwen3-tied", "kimi"])
@pytest.mark.parametrize("residual, options, dtype", [("standard", None, torch.float32),
                                                      ("block_attnres", {"num_blocks": 2}, torch.float32),
                                                      ("full_attnres", None, torch.bfloat16)])
def test_streamed_files_are_the_in_memory_files(sources, tmp_path, source, residual, options, dtype):
    directory, _ = sources[source]
    _, model = convert_to_hf(directory, tmp_path / "memory", residual=residual, residual_options=options, dtype=dtype)
    done = stream_to_hf(directory, tmp_path / "streamed", residual=residual, residual_options=options, dtype=dtype)
    assert done.streamed and done.num_parameters == sum(p.numel() for p in model.parameters())
    assert done.config == model.config
    streamed, memory = files(tmp_path / "streamed"), files(tmp_path / "memory")
    assert sorted(streamed) == sorted(memory) == ["config.json", "generation_config.json", "model.safetensors",
                                                  "tokenizer_config.json"]
    for name in memory:
        assert streamed[name] == memory[name], name


def test_tensors_read_in_slices_and_a_bf16_source_upcast_are_the_in_memory_files(sources, tmp_path, monkeypatch):
    """Slices of a few rows (CHUNK_BYTES made tiny) land where the whole tensors would; a bf16 source
    written in fp32 too."""
    directory, hf = sources["kimi"]
    copy.deepcopy(hf).to(torch.bfloat16).save_pretrained(tmp_path / "bf16", max_shard_size=SHARD)
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 100)
    for source in (directory, tmp_path / "bf16"):
        for dtype in (torch.float32, torch.bfloat16):
            name = f"{source.name}-{str(dtype)[6:]}"
            convert_to_hf(source, tmp_path / f"memory-{name}", residual="block_attnres",
                          residual_options={"num_blocks": 2}, dtype=dtype)
            stream_to_hf(source, tmp_path / f"streamed-{name}", residual="block_attnres",
                         residual_options={"num_blocks": 2}, dtype=dtype)
            assert files(tmp_path / f"streamed-{name}") == files(tmp_path / f"memory-{name}"), name


@pytest.mark.parametrize("source", ["qwen3", "qwen3-tied", "kimi"])
def test_sharded_output_loads_in_transformers_and_attnres_with_the_in_memory_logits(sources, tmp_path, source):
    directory, _ = sources[source]
    options = {"num_blocks": 2}
    _, model = convert_to_hf(directory, tmp_path / "memory", residual="block_attnres", residual_options=options)
    stream_to_hf(directory, tmp_path / "streamed", residual="block_attnres", residual_options=options,
                 max_shard_size="30KB")
    out = tmp_path / "streamed"
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 1 and not (out / "model.safetensors").exists()
    # the layout transformers' own save_pretrained gives the same model at the same shard size, index included
    to_hf_model(model).save_pretrained(tmp_path / "reference", max_shard_size="30KB")
    reference = files(tmp_path / "reference")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index) == {"metadata", "weight_map"} and set(index["metadata"]) == {"total_parameters", "total_size"}
    for name in [*shards, "model.safetensors.index.json"]:
        assert (out / name).read_bytes() == reference[name], name
    assert (out / "config.json").read_bytes() == (tmp_path / "memory" / "config.json").read_bytes()

    want = logits(model)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    # from_pretrained leaves each weight in the file's mapping, at its byte offset there, and CPU kernels round
    # a sum by its operands' alignment (1e-6 apart for these files): copies compare the values, not the offsets
    with torch.no_grad():
        for p in loaded.parameters():
            p.data = p.data.clone()
    assert torch.equal(logits(loaded), want)
    ours = AttnResLM(ModelConfig.from_hf_dict(json.loads((out / "config.json").read_text()))).eval()
    assert load_initial_weights(ours, out) == []  # every routing parameter came from the files
    assert torch.equal(logits(ours), want)


@pytest.mark.parametrize("residual, num_blocks, exact", [*EXACT_VARIANTS, ("mhc", None, None)])
def test_routing_parameters_are_the_in_memory_ones(sources, tmp_path, residual, num_blocks, exact):
    directory, _ = sources["qwen3"]
    options = {k: v for k, v in (("num_blocks", num_blocks), ("exact_conversion", exact)) if v is not None}
    convert_to_hf(directory, tmp_path / "memory", residual=residual, residual_options=options)
    stream_to_hf(directory, tmp_path / "streamed", residual=residual, residual_options=options)
    memory, streamed = (load_file(tmp_path / d / "model.safetensors") for d in ("memory", "streamed"))
    assert any(".residual." in name for name in memory)
    assert {k: (v.dtype, v.shape) for k, v in streamed.items()} == {k: (v.dtype, v.shape) for k, v in memory.items()}
    for name in memory:
        if residual == "mhc" and name.endswith(".fn"):
            continue  # mHC's projections are random draws (the module doc says why they differ)
        assert torch.equal(streamed[name], memory[name]), name


# ---------------------------------------------------------------------------------------------
# Refusals, before any weight is read


@pytest.fixture
def no_weight_reads(monkeypatch):
    """Make any read of tensor data fail the test: the refusals below must come from config and headers."""
    def forbidden(*args, **kwargs):
        raise AssertionError("a weight was read before the refusal")

    monkeypatch.setattr(streaming, "_copy_shard", forbidden)
    monkeypatch.setattr(streaming, "_read_tensor", forbidden)


def copy_source(sources, name, tmp_path):
    directory = tmp_path / "source"
    shutil.copytree(sources[name][0], directory)
    return directory


def edit_shard(directory, tensor, edit):
    """Rewrite the shard holding `tensor` with `edit(state)` applied; returns that shard's path."""
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    shard = directory / index["weight_map"][tensor]
    state = load_file(shard)
    edit(state)
    save_file(state, shard, metadata={"format": "pt"})
    return shard


def assert_refused(directory, tmp_path, pattern, **kwargs):
    with pytest.raises(ConversionError, match=pattern) as error:
        stream_to_hf(directory, tmp_path / "out", **kwargs)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))
    return str(error.value)


def test_config_refusal_comes_before_the_headers(sources, tmp_path, monkeypatch, no_weight_reads):
    directory = copy_source(sources, "qwen3", tmp_path)
    config = json.loads((directory / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    (directory / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(streaming, "_header_stand_ins", lambda file: pytest.fail("a header was read"))
    assert_refused(directory, tmp_path, "RoPE scaling")


def test_shape_mismatch_names_the_tensor(sources, tmp_path, no_weight_reads):
    directory = copy_source(sources, "qwen3", tmp_path)
    name = "model.layers.1.mlp.up_proj.weight"
    edit_shard(directory, name, lambda state: state.update({name: torch.zeros(7, 32)}))
    message = assert_refused(directory, tmp_path, "shape mismatches")
    assert f"{name}: expected shape (48, 32) from the config, found (7, 32)" in message


def test_missing_and_unexpected_tensors_are_named(sources, tmp_path, no_weight_reads):
    directory = copy_source(sources, "qwen3", tmp_path)
    name = "model.layers.2.self_attn.k_norm.weight"

    def edit(state):
        state["model.layers.2.self_attn.extra"] = state.pop(name)

    edit_shard(directory, name, edit)
    index_path = directory / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.layers.2.self_attn.extra"] = index["weight_map"].pop(name)
    index_path.write_text(json.dumps(index))
    message = assert_refused(directory, tmp_path, "do not match the config")
    assert "tensors the config does not describe: model.layers.2.self_attn.extra" in message
    assert f"missing tensors: {name}" in message


def test_an_index_naming_a_tensor_its_shard_lacks_is_refused(sources, tmp_path, no_weight_reads):
    directory = copy_source(sources, "qwen3", tmp_path)
    name = "model.norm.weight"
    shard = edit_shard(directory, name, lambda state: state.pop(name))
    assert_refused(directory, tmp_path, f"places {name} in '{shard.name}', which does not hold them")


def test_truncated_or_missing_shards_are_refused(sources, tmp_path, no_weight_reads):
    directory = copy_source(sources, "qwen3", tmp_path)
    shard = sorted(directory.glob("model-*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    assert_refused(directory, tmp_path, rf"cannot read .*{shard.name} \(corrupt or truncated")
    shard.unlink()
    assert_refused(directory, tmp_path, f"names shard '{shard.name}', which is missing")


def test_kimi_expert_sets_are_checked_from_the_headers(sources, tmp_path, no_weight_reads):
    directory = copy_source(sources, "kimi", tmp_path)
    name = "model.layers.2.block_sparse_moe.experts.3.w3.weight"
    edit_shard(directory, name, lambda state: state.update({name: torch.zeros(5, 32)}))
    assert_refused(directory, tmp_path, rf"kimi_linear: the checkpoint's {name} is \(5, 32\) but "
                                        r"model.layers.2.block_sparse_moe.experts.0.w1.weight is \(16, 32\)")
    edit_shard(directory, name, lambda state: state.pop(name))
    index_path = directory / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    del index["weight_map"][name]
    index_path.write_text(json.dumps(index))
    runtime_name = name.replace("block_sparse_moe", "mlp")  # named as the in-memory reader names it
    assert_refused(directory, tmp_path, rf"kimi_linear: the checkpoint lacks \['{runtime_name}'\]")


def test_a_tied_head_that_differs_from_the_embedding_is_refused(sources, tmp_path, monkeypatch):
    directory = copy_source(sources, "qwen3-tied", tmp_path)
    embed = "model.embed_tokens.weight"
    edit_shard(directory, embed, lambda state: state.update({"lm_head.weight": state[embed] + 1}))
    index_path = directory / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["lm_head.weight"] = index["weight_map"][embed]
    index_path.write_text(json.dumps(index))
    monkeypatch.setattr(streaming, "_copy_shard", lambda *a: pytest.fail("written before the check"))
    assert_refused(directory, tmp_path, "lm_head.weight differs from model.embed_tokens.weight")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_in_the_files_spelling(sources, tmp_path, bad):
    directory = copy_source(sources, "kimi", tmp_path)
    name = next(n for n in json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
                if "block_sparse_moe.experts.1" in n)  # a Kimi expert: joined with the others on the way
    edit_shard(directory, name, lambda state: state[name].view(-1).__setitem__(3, bad))
    assert_refused(directory, tmp_path, rf"tensor {re.escape(name)} holds NaN or infinite values; the source "
                                        r"checkpoint is damaged$", max_shard_size="30KB")


# ---------------------------------------------------------------------------------------------
# Interruptions


def test_a_failure_while_writing_leaves_nothing(sources, tmp_path, monkeypatch):
    directory, _ = sources["kimi"]
    copy, calls = streaming._copy_shard, []

    def interrupted(*args):
        calls.append(args)
        if len(calls) == 3:
            raise KeyboardInterrupt  # as a user's Ctrl-C partway through the weights
        return copy(*args)

    monkeypatch.setattr(streaming, "_copy_shard", interrupted)
    with pytest.raises(KeyboardInterrupt):
        stream_to_hf(directory, tmp_path / "out", max_shard_size="30KB")
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_killed_streaming_convert_leaves_no_model_and_reruns(sources, tmp_path):
    """Killed (SIGKILL) as the second output shard is created, its first written: no --out directory, and
    the rerun clears what it left and writes what an uninterrupted run writes."""
    directory, _ = sources["qwen3"]

    def convert(target, kill=None):
        return run_cli(["convert", str(directory), "--residual", "block_attnres", "--option", "num_blocks=2",
                        "--max-shard-size", "30KB", "--out", str(target)], tmp_path, {}, kill)

    reference = convert(tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr
    killed = convert(tmp_path / "model", Kill("open", f"{tmp_path}/.model.*/model-00002-of-*.safetensors"))
    assert killed.killed, killed.stderr
    assert not (tmp_path / "model").exists() and len(list(tmp_path.glob(".model.*"))) == 1
    assert_whole(tmp_path)
    final = convert(tmp_path / "model")
    assert final.returncode == 0, final.stderr
    assert not list(tmp_path.glob(".model.*"))
    assert files(tmp_path / "model") == files(tmp_path / "reference")


# ---------------------------------------------------------------------------------------------
# The command, its fallbacks, and the memory bound


def test_attnres_convert_streams_and_shards(sources, tmp_path, capsys):
    directory, hf = sources["kimi"]
    assert main(["convert", str(directory), "--max-shard-size", "30KB", "--out", str(tmp_path / "out")]) == 0
    assert "parameters, fp32" in capsys.readouterr().out
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert (tmp_path / "out" / "tokenizer_config.json").read_text() == TOKENIZER_CONFIG
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    torch.testing.assert_close(logits(loaded), logits(hf), rtol=1e-4, atol=1e-4)


def test_a_pytorch_model_bin_converts_in_memory(sources, tmp_path):
    directory, hf = sources["qwen3"]
    source = tmp_path / "bin"
    source.mkdir()
    (source / "config.json").write_text((directory / "config.json").read_text())
    torch.save(hf.state_dict(), source / "pytorch_model.bin")
    done = stream_to_hf(source, tmp_path / "out")
    assert not done.streamed and (tmp_path / "out" / "model.safetensors").is_file()


def test_a_bad_max_shard_size_is_refused(sources, tmp_path):
    for size in ("5 parsecs", 0, "-1GB", True):
        with pytest.raises(ConversionError, match="max_shard_size must be a positive number of bytes"):
            stream_to_hf(sources["qwen3"][0], tmp_path / "out", max_shard_size=size)


def test_peak_memory_stays_within_the_largest_source_shard(tmp_path):
    """8 source shards of about 8 MB converted in a fresh process (tools/benchmarks/streaming_convert.py):
    streamed, its peak resident memory rises by at most the largest shard plus CONSTANT_BYTES; in
    memory, by more (so this test would see streaming lose its bound)."""
    result = streaming_convert.measure(tmp_path, shards=8, shard_mb=8, hidden=256, intermediate=768, vocab=4096)
    if not result["streamed"]["peak_reset"]:
        pytest.skip("this kernel does not let a process reset its peak memory (/proc/self/clear_refs)")
    assert result["shards"] == 8
    bound = result["largest_shard_bytes"] + CONSTANT_BYTES
    assert result["streamed"]["increase_bytes"] <= bound, result
    assert result["in_memory"]["increase_bytes"] > bound, result
