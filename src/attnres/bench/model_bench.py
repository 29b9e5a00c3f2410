"""Whole-model costs of each variant against `standard`: training step, memory, prefill, decode.

All models of one comparison live side by side and are timed interleaved (run_interleaved), so
every variant sees the same machine conditions as the baseline it is divided by. The model runner
(`VariantRunner`) lives in `attnres.train.step_cost`, shared with `attnres compare`'s cost measurement.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnres.bench.bench_config import BASELINE, BenchConfig
from attnres.train.timing import Task, ratio, run_interleaved
from attnres.model import ModelConfig
from attnres.generation.memory_traffic import GB
from attnres.train.step_cost import (VariantRunner, check_runners_fit, device_sync, memory_ratios,
                                     release_memory)


def model_shape(hidden_size: int, architecture: str = "dense") -> dict:
    """Heads of 64 where hidden_size allows (else one head), half as many KV heads, SwiGLU width 3x hidden.

    "kimi_linear": the same heads and active feed-forward width as Kimi Linear: the first layer
    dense, then 8 experts of width hidden, top 2, plus 1 shared (3x hidden active); latent attention
    (kv_lora_rank hidden / 2, per head 64 key channels, 32 shared, 64 value) every 4th layer and Kimi
    Delta Attention (heads of 64) in the others."""
    heads = hidden_size // 64 if hidden_size % 64 == 0 else 1
    kv_heads = heads // 2 if heads % 2 == 0 else heads
    shape = {"num_heads": heads, "num_kv_heads": kv_heads, "intermediate_size": 3 * hidden_size}
    if architecture == "kimi_linear":
        head = hidden_size // heads
        shape.update(num_kv_heads=heads,
                     moe={"num_experts": 8, "experts_per_token": 2, "expert_size": hidden_size, "shared_experts": 1,
                          "dense_layers": 1, "scoring": "sigmoid", "score_bias": True},
                     mla={"kv_lora_rank": hidden_size // 2, "qk_nope_head_dim": head,
                          "qk_rope_head_dim": max(head // 2, 1), "v_head_dim": head},
                     kda={"num_heads": heads, "head_dim": head})
    return shape


def build_model_config(config: BenchConfig, residual: str, hidden_size: int, num_layers: int,
                       max_seq_len: int) -> ModelConfig:
    """The ModelConfig of one benchmarked model, with its options from config.options at this depth."""
    return ModelConfig(vocab_size=config.vocab_size, hidden_size=hidden_size, num_layers=num_layers,
                       residual=residual, residual_options=config.variant_options(residual, num_layers),
                       max_seq_len=max_seq_len, **model_shape(hidden_size, config.architecture))


def _runners(config: BenchConfig, hidden_size: int, num_layers: int, max_seq_len: int, batch: torch.Tensor,
             decode_ids: torch.Tensor | None, device: torch.device) -> dict[str, VariantRunner]:
    """A VariantRunner of standard and of every compared variant, once they are known to fit together."""
    configs = {name: build_model_config(config, name, hidden_size, num_layers, max_seq_len)
               for name in (BASELINE, *config.variants)}
    check_runners_fit(configs, device)
    return {name: VariantRunner(model, device, config.precision, batch, decode_ids, config.seed,
                                config.routing_impl) for name, model in configs.items()}


def _ratios(row: dict, base: dict, **timings: str) -> dict:
    """{name: row's median of timing `key` / base's} for each name=key, then the memory ratios."""
    return {**{name: ratio(row[key]["median_s"], base[key]["median_s"]) for name, key in timings.items()},
            **memory_ratios(row["memory"], base["memory"])}


def _inputs(config: BenchConfig, seq_len: int, decode_tokens: int, device: torch.device):
    generator = torch.Generator().manual_seed(config.seed)
    batch = torch.randint(0, config.vocab_size, (config.batch_size, seq_len), generator=generator)
    decode = torch.randint(0, config.vocab_size, (config.batch_size, decode_tokens), generator=generator)
    return batch.to(device), decode.to(device)


def run_model_bench(config: BenchConfig, log: Callable[[str], object] = print) -> dict:
    """Training step, prefill and decode timings plus step memory for standard and config.variants.

    Returns {"hidden_size", "num_layers", "seq_len", "batch_size", "decode_tokens", "variants": {name: {
    "model": ModelConfig dict, "parameters", "train_step_s" / "prefill_s" / "decode_per_token_s":
    {"median_s", "samples_s"}, "train_tokens_per_s", "memory": {... bytes}, "ratios": {train_step,
    prefill, decode_per_token, peak_memory, activation_memory, non_activation_memory} (to standard;
    standard's are 1.0)}}}. With config.compiled_decode, each variant also has
    "decode_compiled_per_token_s" (the static-cache step compiled by torch.compile), "decode_compile_s"
    (the compiling step's wall time, untimed otherwise), "compiled_decode_speedup" (eager decode /
    compiled decode), the ratio "decode_compiled_per_token", and the step's memory traffic:
    "decode_compiled_bytes_per_step" (weights and KV cache read) and "decode_compiled_gb_per_s".
    """
    device = torch.device(config.device)
    names = (BASELINE, *config.variants)
    batch, decode_ids = _inputs(config, config.seq_len, config.decode_tokens, device)
    max_seq_len = config.seq_len + config.decode_tokens + 2  # + the compiled decode's prefill token and compile step
    runners = _runners(config, config.hidden_size, config.num_layers, max_seq_len, batch, decode_ids, device)
    tasks = [Task(f"{name}/train", runners[name].train_step) for name in names]
    tasks += [Task(f"{name}/prefill", runners[name].prefill) for name in names]
    tasks += [Task(f"{name}/decode", runners[name].decode, setup=runners[name].decode_setup,
                   units=config.decode_tokens) for name in names]
    if config.compiled_decode:
        tasks += [Task(f"{name}/decode_compiled", runners[name].decode_compiled,
                       setup=runners[name].decode_compiled_setup, units=config.decode_tokens) for name in names]
    log(f"models: {len(names)} variants x {config.num_layers} layers x {config.hidden_size} wide, "
        f"batch {config.batch_size} x {config.seq_len}, {config.precision} on {device}")
    timings = run_interleaved(tasks, config.repeats, config.warmup, sync=device_sync(device), log=log,
                              label="models: ")
    memory = {}
    for name in names:
        log(f"models: step memory of {name}")
        memory[name] = runners[name].memory()
    results = {}
    for name in names:
        runner = runners[name]
        train, prefill, decode = (timings[f"{name}/{m}"] for m in ("train", "prefill", "decode"))
        results[name] = {
            "model": runner.config.to_dict(),
            "parameters": runner.parameters(),
            "train_step_s": train.to_dict(),
            "train_tokens_per_s": config.batch_size * config.seq_len / train.median,
            "prefill_s": prefill.to_dict(),
            "decode_per_token_s": decode.to_dict(),
            "memory": memory[name],
        }
        if config.compiled_decode:
            compiled = timings[f"{name}/decode_compiled"]
            results[name].update(decode_compiled_per_token_s=compiled.to_dict(),
                                 decode_compile_s=runner.compile_s,
                                 decode_compiled_bytes_per_step=runner.decode_bytes_per_step,
                                 decode_compiled_gb_per_s=runner.decode_bytes_per_step / compiled.median / GB)
    base = results[BASELINE]
    for name, row in results.items():
        row["ratios"] = _ratios(row, base, train_step="train_step_s", prefill="prefill_s",
                                decode_per_token="decode_per_token_s")
        if config.compiled_decode:
            compiled, base_compiled = (r["decode_compiled_per_token_s"]["median_s"] for r in (row, base))
            row["ratios"]["decode_compiled_per_token"] = ratio(compiled, base_compiled)
            row["compiled_decode_speedup"] = ratio(row["decode_per_token_s"]["median_s"], compiled)
    del runners
    release_memory(device)
    return {"hidden_size": config.hidden_size, "num_layers": config.num_layers, "seq_len": config.seq_len,
            "batch_size": config.batch_size, "decode_tokens": config.decode_tokens, "variants": results}


def run_depth_sweep(config: BenchConfig, log: Callable[[str], object] = print) -> list[dict]:
    """Training step time and step memory of every variant vs standard at each of config.depths layers.

    Models are sweep_hidden wide on batches of batch_size x sweep_seq_len. Returns one entry per depth:
    {"num_layers", "variants": {name: {"name" (with the options it ran with, `ModelConfig.variant`),
    "train_step_s", "memory", "ratios": {train_step, peak_memory, activation_memory,
    non_activation_memory}}}}.
    """
    device = torch.device(config.device)
    names = (BASELINE, *config.variants)
    batch, _ = _inputs(config, config.sweep_seq_len, 0, device)
    sweep = []
    for depth in config.depths:
        runners = _runners(config, config.sweep_hidden, depth, config.sweep_seq_len, batch, None, device)
        timings = run_interleaved([Task(name, runners[name].train_step) for name in names], config.repeats,
                                  config.warmup, sync=device_sync(device), log=log, label=f"depth {depth}: ")
        rows = {name: {"name": runner.config.variant, "train_step_s": timings[name].to_dict(),
                       "memory": runner.memory()} for name, runner in runners.items()}
        for row in rows.values():
            row["ratios"] = _ratios(row, rows[BASELINE], train_step="train_step_s")
        sweep.append({"num_layers": depth, "variants": rows})
        del runners
        release_memory(device)
    return sweep


__all__ = ["VariantRunner", "build_model_config", "device_sync", "model_shape", "run_depth_sweep", "run_model_bench"]
