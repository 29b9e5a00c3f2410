"""What one model's steps cost: a model with its AdamW and fixed inputs, and the operations that are timed.

Shared by `attnres bench` and the cost measurement of `attnres compare` (siblings that must not
import each other), so both time the same training step and measure memory the same way. The
timing itself is `attnres.train.timing.run_interleaved`.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import torch

from attnres.common.precision import autocast
from attnres.train.timing import ratio
from attnres.generation import FastGenerator
from attnres.model import AttnResLM, KVCache, ModelConfig
from attnres.model.flops import parameter_count
from attnres.model.memory_need import check_fits, training_state_bytes
from attnres.train.memory import measure_step_memory
from attnres.train.optim import adamw


def device_sync(device: torch.device) -> Callable[[], None] | None:
    """torch.cuda.synchronize for a CUDA device, else None (CPU work is synchronous)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return None


def release_memory(device: torch.device) -> None:
    """Collect garbage (and empty CUDA's cache) after a measurement's models are dropped."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def check_runners_fit(configs: dict[str, ModelConfig], device: torch.device) -> None:
    """InputError, before any is built, where the `VariantRunner`s of `configs` (name -> config, all
    held at once) cannot fit the machine: the sum of their training states (attnres.model.memory_need)."""
    counts = {name: parameter_count(config).total for name, config in configs.items()}
    need = sum(training_state_bytes(n) for n in counts.values())
    largest = max(counts, key=counts.get)
    check_fits(need, f"{len(configs)} models held at once (the largest, {largest}, {counts[largest]:,} parameters), "
               f"with their gradients and AdamW's two moments (fp32), need", device,
               "measure a smaller model (hidden_size, num_layers) or fewer variants")


class VariantRunner:
    """One model with its AdamW and fixed inputs; the operations a cost measurement times.

    batch: (B, T) token ids for training and prefill; decode_ids: (B, K) tokens fed one at a time
    (None when decoding is not measured). The weights are drawn from `seed`, so every variant of a
    measurement starts from the same shared weights. routing_impl, routing_chunk_size: how routing
    is computed (`AttnResLM.set_routing`).
    """

    def __init__(self, model_config: ModelConfig, device: torch.device, precision: str, batch: torch.Tensor,
                 decode_ids: torch.Tensor | None, seed: int, routing_impl: str = "auto",
                 routing_chunk_size: int | None = None) -> None:
        torch.manual_seed(seed)  # every variant starts from the same shared weights
        self.config = model_config
        self.model = AttnResLM(model_config).to(device).set_routing(routing_impl, routing_chunk_size)
        self.optimizer = adamw(self.model.parameters(), lr=1e-4)
        self.batch, self.decode_ids = batch, decode_ids
        self.precision = precision
        self.device = device
        self._cache: KVCache | None = None
        self._generator: FastGenerator | None = None
        self._decoding = None
        self.compile_s: float | None = None
        self.decode_bytes_per_step: int | None = None  # weights and KV cache a compiled decode step reads

    def _autocast(self):
        return autocast(self.device, self.precision)

    def train_step(self) -> None:
        """Forward with loss, backward, AdamW step on `batch`."""
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast():
            loss = self.model(self.batch, labels=self.batch).loss
        loss.backward()
        self.optimizer.step()

    @torch.no_grad()
    def prefill(self) -> None:
        """Forward of the whole prompt `batch` into a fresh KV cache (kept for the next decode)."""
        cache = KVCache()
        with self._autocast():
            self.model(self.batch, cache=cache)
        self._cache = cache

    def decode_setup(self) -> None:
        """Untimed: make sure a prefilled cache is ready (reuses the last prefill's cache)."""
        if self._cache is None:
            self.prefill()

    @torch.no_grad()
    def decode(self) -> None:
        """Generate decode_ids.shape[1] tokens one at a time with the cache (consumes the cache)."""
        cache, self._cache = self._cache, None
        with self._autocast():
            for t in range(self.decode_ids.shape[1]):
                self.model(self.decode_ids[:, t:t + 1], cache=cache)

    def decode_compiled_setup(self) -> None:
        """Untimed: prefill `batch` into a static KV cache for the compiled decode step; the first call
        also compiles the step (one step, its wall time kept as `compile_s`)."""
        if self._generator is None:
            self._generator = FastGenerator(self.model, compile=True)
        steps = self.decode_ids.shape[1]
        self._decoding = self._generator.start(self.batch, max_new_tokens=steps + 2, precision=self.precision)
        self.decode_bytes_per_step = self._decoding.step_bytes
        if self._decoding.compiles:
            sync = device_sync(self.device)
            start = time.perf_counter()
            self._decoding.step()
            if sync is not None:
                sync()
            self.compile_s = time.perf_counter() - start

    def decode_compiled(self) -> None:
        """decode_ids.shape[1] greedy tokens, one compiled static-cache step each
        (`attnres.generation.fast_generator`; no host synchronisation between steps)."""
        decoding, self._decoding = self._decoding, None
        for _ in range(self.decode_ids.shape[1]):
            decoding.step()

    def parameters(self) -> int:
        """Number of parameters of the model."""
        return sum(p.numel() for p in self.model.parameters())

    def memory(self) -> dict:
        """Bytes of one training step: activation_bytes (saved for backward), peak_bytes, parameter_bytes,
        non_activation_bytes = peak - activation.

        CPU: peak is measure_step_memory's estimate (params + grads + 2 AdamW moments + activations).
        CUDA: the allocator peak of the step minus what was resident before it (other models
        included), plus this model's parameters and AdamW state.
        """
        self.model.zero_grad(set_to_none=True)
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
            resident = torch.cuda.memory_allocated(self.device)
        result = measure_step_memory(self.model, self.batch, self.precision)
        if cuda:
            state = sum(t.numel() * t.element_size() for s in self.optimizer.state.values()
                        for t in s.values() if torch.is_tensor(t))
            result["peak_bytes"] = int(result["peak_bytes"] - resident + result["parameter_bytes"] + state)
        result["non_activation_bytes"] = result["peak_bytes"] - result["activation_bytes"]
        return result


def memory_ratios(memory: dict, base: dict) -> dict:
    """{"peak_memory", "activation_memory", "non_activation_memory"}: `VariantRunner.memory()` bytes of a
    variant divided by the baseline's (None where a value is missing or the base is not positive)."""
    return {"peak_memory": ratio(memory.get("peak_bytes"), base.get("peak_bytes")),
            "activation_memory": ratio(memory.get("activation_bytes"), base.get("activation_bytes")),
            "non_activation_memory": ratio(memory.get("non_activation_bytes"), base.get("non_activation_bytes"))}
