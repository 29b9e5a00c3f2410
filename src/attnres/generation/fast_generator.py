"""Fast generation: a static KV cache and one compiled single-token decoding step (docs/explanation/fast-paths.md).

Decoding one token at a time through `AttnResLM.forward` is dominated by Python: hundreds of small
operations per token, and shapes that grow with every token. Here the prompt is run once, eagerly, into
a `StaticKVCache` (prefill); every later token is one call of `decode_step` (the embedding, every
sub-layer with the model's own routing, the head and the choice of the next token) on tensors of fixed
shapes that it updates in place: the cache is preallocated to its capacity and attention reads it whole
with a mask of the filled positions (`key_valid`); nothing in the step reads a value back to the host.

So the step is captured once by `torch.compile(fullgraph=True, dynamic=False)` (any graph break fails)
and replayed for every token, in a mode chosen per device (`DEFAULT_MODES`). On CPU with the fused
extension, each routing group's phase 1 is one call of its C++ kernel and inductor fuses the merges
with the norms; after a generation's first step only the guards that tell compiled graphs apart are
evaluated (`Decoding._guards`). Greedy output equals the eager model's greedy decoding token for token.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnres.common.checks import check_bool, check_choice, check_int, check_positive_number, is_number
from attnres.common.errors import InputError
from attnres.common.precision import PRECISIONS, autocast
from attnres.common.toolchain import inductor_compiler, require_inductor_compiler
from attnres.model.cache import StaticKVCache
from attnres.model.memory_need import cache_bytes, check_fits, gib
from attnres.generation.compile_choice import (PROBE_STEPS, CompileEstimate, CompileTimes, compile_pays, saved_seconds,
                                          shape_key)
from attnres.model.decoder import AttnResLM
from attnres.routing import resolve_impl
from attnres.generation.memory_traffic import GB, decode_bytes_per_step

# torch.compile mode and options of the decode step; why each, with the measurements, is in
# docs/explanation/fast-paths.md. CUDA: CUDA graphs replay the whole step with one launch. CPU:
# inductor's default mode and Python wrapper; the C++ wrapper decodes a little faster but compiles
# several times longer, which a CPU user repays only after thousands of tokens.
DEFAULT_MODES = {"cpu": "default", "cuda": "reduce-overhead"}
# Without size_asserts the Python wrapper skips a check of every argument at every call (one Python
# call per parameter and buffer, a cost that grows with the routers): the step's first call checks
# its guards, and later calls get the same tensors (`Decoding._guards`).
CPU_OPTIONS: dict = {"size_asserts": False}  # options={"cpp_wrapper": True} asks for the C++ wrapper
# With bf16, a one-row matrix product (every projection of a decode step) goes to oneDNN's bf16 kernel,
# which reads weights at a fraction of the memory bandwidth; inductor's decompose_mm_pass turns it into
# a product and a sum that inductor vectorises. In fp32 it only lengthens the compile, so fp32 goes without.
CPU_BF16_OPTIONS = {**CPU_OPTIONS, "post_grad_fusion_options": {
    "decompose_mm_pass": {"cpu_max_other_dimension_decomposition": 2**31}}}
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CAPACITY_STEP = 64  # cache capacities are rounded up to a multiple of this, so nearby lengths share a graph


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen from the logits of the last position.

    do_sample False: greedy (argmax; the other fields are ignored). True: softmax of
    logits / temperature, restricted to the top_k most likely tokens (None or 0: all) and to the
    smallest set whose probability reaches top_p (None or 1.0: all), sampled. Same meaning as
    transformers' generation options of the same names.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        check_bool(self.do_sample, "Sampling.do_sample")
        check_positive_number(self.temperature, "Sampling.temperature")
        check_int(self.top_k, "Sampling.top_k", minimum=0, allow_none=True)
        if self.top_p is not None and not (is_number(self.top_p) and 0 < self.top_p <= 1):
            raise InputError(f"Sampling.top_p must be None or a number in (0, 1], got {self.top_p!r}")


GREEDY = Sampling()


@dataclass
class GenerationResult:
    """What `FastGenerator.generate` returns.

    sequences: (B, T + new_tokens) long, the prompt followed by the generated tokens (rows that hit
    an end token are filled with the pad token after it, as transformers' `generate` does).
    Timings in seconds: prefill (the prompt's forward and the first token), compile (the first step
    of a shape not seen before, which traces and compiles; 0.0 otherwise) and decode (every other
    step, `decode_steps` of them, each one token per row). compile_mode: the torch.compile mode of
    the step, None when it ran eagerly. compile_choice: with compile="auto", what was decided and why.
    decode_bytes_per_step: the weights and KV cache one step reads (`attnres.generation.memory_traffic`).
    """

    sequences: torch.Tensor
    prompt_tokens: int
    new_tokens: int
    prefill_s: float
    compile_s: float
    decode_s: float
    decode_steps: int
    compile_mode: str | None = None
    compile_choice: str | None = None
    decode_bytes_per_step: int = 0

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prompt tokens (all rows) per second of prefill."""
        return self.sequences.shape[0] * self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else math.nan

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens (all rows) per second of the timed decode steps; nan when none was timed."""
        return self._per_decode_second(self.sequences.shape[0])

    @property
    def decode_gb_per_s(self) -> float:
        """Achieved memory traffic of the timed decode steps: GB (1e9 bytes) of weights and KV cache
        read per second; nan when no step was timed."""
        return self._per_decode_second(self.decode_bytes_per_step) / GB

    def _per_decode_second(self, per_step: float) -> float:
        timed = self.decode_steps > 0 and self.decode_s > 0
        return per_step * self.decode_steps / self.decode_s if timed else math.nan


def choose_next(scores: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """scores (B, V) fp32 logits -> (B,) long: argmax, or a sample under `sampling`.

    Sampling draws with the exponential race (argmax of p / E, E ~ Exp(1)), which picks token i with
    probability p_i like torch.multinomial but without a host synchronisation."""
    if not sampling.do_sample:
        return scores.argmax(dim=-1)
    if sampling.temperature != 1.0:
        scores = scores / sampling.temperature
    if sampling.top_k:
        kth = torch.topk(scores, min(sampling.top_k, scores.shape[-1]), dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if sampling.top_p is not None and sampling.top_p < 1.0:
        ordered, order = torch.sort(scores, dim=-1)  # ascending
        below = ordered.softmax(dim=-1).cumsum(dim=-1) <= 1 - sampling.top_p
        below[:, -1] = False  # the most likely token always stays
        scores = scores.masked_fill(below.scatter(-1, order, below), -math.inf)
    probs = scores.softmax(dim=-1)
    race = torch.empty_like(probs).exponential_(1.0)
    return (probs / race).argmax(dim=-1)


def _select(logits: torch.Tensor, written: torch.Tensor, finished: torch.Tensor, eos: torch.Tensor | None,
            pad: torch.Tensor, eos_from: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The token to write at column `written` (1,): chosen from logits (B, V); pad where a row has
    finished; end tokens suppressed while written < eos_from (1,) (min_new_tokens). Marks rows that
    chose an end token in `finished` (B,) bool, in place. eos (E,) long or None, pad () long."""
    scores = logits.float()
    if eos is not None:
        vocab = torch.arange(scores.shape[-1], device=scores.device)
        scores = scores.masked_fill((written < eos_from)[:, None] & torch.isin(vocab, eos), -math.inf)
    chosen = torch.where(finished, pad, choose_next(scores, sampling))
    if eos is not None:
        finished |= torch.isin(chosen, eos)
    return chosen


def decode_step(model: AttnResLM, cache: StaticKVCache, sequence: torch.Tensor, key_valid: torch.Tensor,
                column: torch.Tensor, rope_position: torch.Tensor, finished: torch.Tensor, eos: torch.Tensor | None,
                pad: torch.Tensor, eos_from: torch.Tensor, sampling: Sampling, precision: str) -> None:
    """One token for every row, entirely in place: the function `FastGenerator` compiles.

    sequence (B, capacity) long: the token at `column` (1,) is the input; the chosen one is written
    at column + 1. key_valid (B, capacity) bool: the cache positions a query may attend to (column
    is set). rope_position (B,) long: the input token's rotary position (real tokens before it).
    finished, eos, pad, eos_from: see `_select`; sampling: `Sampling`; precision: "fp32" or "bf16".
    Afterwards column and rope_position have advanced by one.
    """
    token = sequence.index_select(1, column)  # (B, 1)
    key_valid.index_fill_(1, column, True)
    mask = key_valid[:, None, None, :]  # (B, 1, 1, capacity): the one query sees every filled position
    with autocast(sequence.device, precision):
        embedding = model.embed_tokens(token)
        rope = model.rotary(rope_position[:, None, None], embedding.dtype)  # (B, 1, 1, hd) each
        state = model.residual.start(embedding)
        model.run_sublayers(state, 0, model.config.num_sublayers, rope, cache.at(column), mask)
        logits = model.output_logits(state)[:, -1]
    written = column + 1
    chosen = _select(logits, written, finished, eos, pad, eos_from, sampling)
    sequence.index_copy_(1, written, chosen[:, None])
    column += 1
    rope_position += 1


class FastGenerator:
    """Generation for an AttnResLM with a static KV cache and a compiled decode step (see the module doc).

    compile: True compiles `decode_step` with torch.compile(fullgraph=True, dynamic=False), once per
    shape (batch, cache capacity) and settings; False runs the same fixed-shape step eagerly; "auto"
    runs it eagerly and compiles only where that pays for the request (`attnres.generation.compile_choice`:
    a few eager steps are timed first, the compile time is the one measured on this machine, kept
    in `times`, else a prior), printing one line through `log` before a compile starts.
    mode: a torch.compile mode (one of `MODES`) or None for the device's default (`DEFAULT_MODES`;
    on CPU with inductor, also `CPU_OPTIONS`, or `CPU_BF16_OPTIONS` for a step computing in bf16).
    options: inductor options (torch.compile's `options`, e.g. {"cpp_wrapper": True}) instead of a
    mode; None: the device's default.
    backend: torch.compile's backend, a name or a callable ("inductor"; tests use "aot_eager", which
    traces the same graph without generating code). The model's weights are read at every step
    (nothing is frozen into the compiled code), so a generator stays valid when the weights change
    in place. Tensors of one shape are kept and reused by the next generation of that shape (fixed
    addresses, which CUDA graphs need), so a `start` ends any unfinished `Decoding` of the same
    shape; `forget()` drops them.
    """

    def __init__(self, model: AttnResLM, compile: bool | str = True, mode: str | None = None,
                 backend: str | Callable = "inductor", options: dict | None = None, times: CompileTimes | None = None,
                 log: Callable[[str], object] | None = None) -> None:
        if not isinstance(model, AttnResLM):
            raise InputError(f"FastGenerator needs an attnres AttnResLM, got {type(model).__name__}")
        if compile != "auto":
            check_bool(compile, "FastGenerator compile (True, False or 'auto')")
        self.times, self.log = times, log or (lambda line: print(line, file=sys.stderr, flush=True))
        check_choice(mode, "FastGenerator mode", MODES, allow_none=True)
        if options is not None and (mode is not None or not isinstance(options, dict)):
            raise InputError(f"FastGenerator options must be a dict of inductor options, and mode None (torch.compile "
                             f"takes one or the other), got options={options!r}, mode={mode!r}")
        self.options = options
        if not (isinstance(backend, str) or callable(backend)):
            raise InputError(f"FastGenerator backend must be a torch.compile backend name or callable, got {backend!r}")
        self.model, self.compile, self.mode, self.backend = model, compile, mode, backend
        self._steps: dict[str, Callable] = {}  # compiled steps by resolved mode
        self._states: dict[tuple, _State] = {}
        self._compiled_keys: set[tuple] = set()

    def resolved_mode(self, device: torch.device, bf16: bool = False) -> str:
        """The compile mode used on `device` (for a step computing in bf16: `bf16`): `mode`, or the
        device type's default; "+" and the inductor options where there are any (e.g.
        "default+cpp_wrapper" with options={"cpp_wrapper": True}; on CPU "default+no_size_asserts", and in bf16
        "default+no_size_asserts+decompose_mm_pass")."""
        mode = self.mode or DEFAULT_MODES.get(device.type, "default")
        words = []
        for key, value in self._options(device, bf16).items():
            words += list(value) if isinstance(value, dict) else [
                key if value is True else f"no_{key}" if value is False else f"{key}={value}"]
        return "+".join([mode, *words])

    def _options(self, device: torch.device, bf16: bool = False) -> dict:
        if self.options is not None:
            return self.options
        if self.mode is None and device.type == "cpu" and self.backend == "inductor":
            return CPU_BF16_OPTIONS if bf16 else CPU_OPTIONS
        return {}

    @torch.no_grad()
    def start(self, input_ids: torch.Tensor, max_new_tokens: int, attention_mask: torch.Tensor | None = None,
              sampling: Sampling = GREEDY, eos_token_id: int | list[int] | None = None,
              pad_token_id: int | None = None, min_new_tokens: int = 0, precision: str = "fp32") -> "Decoding":
        """Prefill: run input_ids (B, T) through the model into the static cache and choose the first
        new token; returns the `Decoding` that makes the others (arguments as in `generate`)."""
        model = self.model
        device = model.embed_tokens.weight.device
        _check_inputs(model, input_ids, attention_mask, max_new_tokens, min_new_tokens, precision, device)
        uncompiled = not_compiled_reason(model)
        if self.compile is True and uncompiled:
            raise InputError(f"the decode step of {uncompiled} is not compiled yet; decode it eagerly "
                             f"(FastGenerator(compile=False) or 'auto', attnres generate --no-compile)")
        if self.compile is True and self.backend == "inductor" and device.type == "cpu":
            require_inductor_compiler("the decode step", "decode without compiling (FastGenerator(compile=False), "
                                      "generate(..., disable_compile=True), attnres generate --no-compile)")
        if not isinstance(sampling, Sampling):
            raise InputError(f"sampling must be an attnres.generation.fast_generator.Sampling, got {type(sampling).__name__}")
        eos = _token_tensor(eos_token_id, "eos_token_id", model.config.vocab_size, device)
        if pad_token_id is None:
            pad_token_id = int(eos[0]) if eos is not None else 0
        pad = _token_tensor(pad_token_id, "pad_token_id", model.config.vocab_size, device)[0]
        batch, prompt = input_ids.shape
        capacity = min(model.config.max_seq_len, -(-(prompt + max_new_tokens) // CAPACITY_STEP) * CAPACITY_STEP)
        # An autocast around the call changes the cache's dtypes and is part of the compiled graph.
        ambient = torch.is_autocast_enabled(device.type) and torch.get_autocast_dtype(device.type)
        weights = model.embed_tokens.weight.dtype  # a model cast in place gets tensors and a step of its dtype
        key = (batch, capacity, precision, ambient, str(device), weights)
        if key not in self._states:
            dtype = ambient or (torch.bfloat16 if precision == "bf16" else weights)
            _check_cache_fits(model, batch, prompt, max_new_tokens, capacity, dtype, device)
        state = self._state(key, batch, capacity, device)
        _sync(device)
        begin = time.perf_counter()
        with autocast(device, precision):
            logits = model(input_ids, cache=state.cache, attention_mask=attention_mask).logits[:, -1]
        state.fill(input_ids, attention_mask, min_new_tokens)
        state.sequence[:, prompt] = _select(logits, state.column, state.finished, eos, pad, state.eos_from, sampling)
        _sync(device)
        prefill_s = time.perf_counter() - begin
        step_bytes = decode_bytes_per_step(model, state.cache, batch)
        cache_dtype = next(iter(state.cache.keys.values())).dtype
        bf16 = torch.bfloat16 in (cache_dtype, model.embed_tokens.weight.dtype)
        mode = self.resolved_mode(device, bf16)
        compile_key = (key, sampling, eos is None, self.compile and mode, self.backend)
        arguments = (model, state.cache, state.sequence, state.key_valid, state.column, state.rope_position,
                     state.finished, eos, pad, state.eos_from, sampling, precision)
        # Where a compile is measured for later decisions: "auto", and a forced inductor compile.
        measured = None
        if self.compile == "auto" or (self.compile is True and self.backend == "inductor"):
            measured = _AutoCompile(self, compile_key, shape_key(
                model.config.to_dict(), batch=batch, capacity=capacity, precision=precision, ambient=ambient,
                dtype=model.embed_tokens.weight.dtype, sampling=sampling.do_sample, eos=eos is None,
                mode=mode, backend=self.backend, chunk=getattr(model.residual, "chunk_size", None),
                routing=resolve_impl(model.residual.impl, device, quiet=True)), bf16)  # a graph per impl
        if self.compile is True:
            step, compile_mode, compiles = self._compiled(device, bf16, compile_key)
        else:  # eager; with "auto", `Decoding._choose` may compile it
            step, compile_mode, compiles = decode_step, None, False
        return Decoding(step, arguments, state, prompt, max_new_tokens, eos, prefill_s, compiles, device,
                        compile_mode, measured, decides=self.compile == "auto", step_bytes=step_bytes)

    def _compiled(self, device: torch.device, bf16: bool, compile_key: tuple) -> tuple[Callable, str, bool]:
        """`decode_step` compiled (once per generator and mode; bf16: the step computes in bf16, which takes
        other options on CPU), its mode, and whether its next call compiles (the first of `compile_key`)."""
        mode = self.resolved_mode(device, bf16)
        if mode not in self._steps:
            base = self.mode or DEFAULT_MODES.get(device.type, "default")
            options = self._options(device, bf16) or None
            self._steps[mode] = torch.compile(_own_copy(decode_step), fullgraph=True, dynamic=False,
                                              backend=self.backend, options=options,
                                              mode=None if options or base == "default" else base)
        compiles = compile_key not in self._compiled_keys
        self._compiled_keys.add(compile_key)
        return self._steps[mode], mode, compiles

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, attention_mask: torch.Tensor | None = None,
                 sampling: Sampling = GREEDY, eos_token_id: int | list[int] | None = None,
                 pad_token_id: int | None = None, min_new_tokens: int = 0, precision: str = "fp32",
                 stop_check_every: int | None = None) -> GenerationResult:
        """Continue input_ids (B, T) by up to max_new_tokens tokens per row -> GenerationResult.

        attention_mask (B, T), 1 = real token, 0 = padding: left padding only (every row's last
        token real). eos_token_id: an id or a list; a row stops at its first, the others go on,
        and generation ends when every row has stopped (the output is then shorter); pad_token_id
        fills a stopped row (default: the first end token). min_new_tokens: end tokens are
        suppressed before that many new tokens. precision: "fp32" or "bf16" (autocast).
        stop_check_every: steps between checks whether every row has stopped, the one read-back
        of the loop (default: 1 on CPU, where reading a flag costs nothing, 16 on accelerators).
        """
        decoding = self.start(input_ids, max_new_tokens, attention_mask, sampling, eos_token_id, pad_token_id,
                              min_new_tokens, precision)
        return decoding.finish(stop_check_every)

    def _state(self, key: tuple, batch: int, capacity: int, device: torch.device) -> "_State":
        """The fixed-shape tensors for `key`, made once and reused (their addresses stay fixed)."""
        if key not in self._states:
            long = {"dtype": torch.long, "device": device}
            tensors = dict(sequence=torch.zeros(batch, capacity, **long),
                           key_valid=torch.zeros(batch, capacity, dtype=torch.bool, device=device),
                           column=torch.zeros(1, **long), rope_position=torch.zeros(batch, **long),
                           finished=torch.zeros(batch, dtype=torch.bool, device=device),
                           eos_from=torch.zeros(1, **long))
            if device.type == "cuda":
                for tensor in tensors.values():
                    torch._dynamo.mark_static_address(tensor)
            self._states[key] = _State(cache=StaticKVCache(capacity), **tensors)
        state = self._states[key]
        state.cache.reset()
        return state

    def forget(self) -> None:
        """Drop the compiled step and every kept state: frees their memory (a model moved to another device or
        dtype gets its own)."""
        self._steps, self._states, self._compiled_keys = {}, {}, set()


class Decoding:
    """One generation after its prefill: `step()` makes one more token per row; `finish()` the rest.

    Made by `FastGenerator.start`. `steps_run` counts the tokens made so far (the prefill's first
    included); `compiles` says whether the next step will trace and compile the step function.
    """

    def __init__(self, step, arguments: tuple, state: "_State", prompt: int, max_new_tokens: int,
                 eos: torch.Tensor | None, prefill_s: float, compiles: bool, device: torch.device,
                 compile_mode: str | None, auto: "_AutoCompile | None" = None, decides: bool = False,
                 step_bytes: int = 0) -> None:
        self._step, self._arguments, self.state = step, arguments, state
        self.prompt, self.max_new_tokens, self.eos = prompt, max_new_tokens, eos
        self.prefill_s, self.compiles, self.device, self.compile_mode = prefill_s, compiles, device, compile_mode
        self.steps_run = 1
        self.step_bytes = step_bytes  # weights and KV cache one step reads
        self.auto, self.decides, self.compile_choice = auto, decides, None
        self._compiled_from = 1 if compile_mode else None  # the step whose call evaluates every guard

    def step(self) -> None:
        """One decode step (no host synchronisation); InputError past max_new_tokens (the cache is full)."""
        if self.steps_run >= self.max_new_tokens:
            raise InputError(f"this generation was started for max_new_tokens={self.max_new_tokens}; all are made")
        with torch.no_grad(), self._guards():
            self._step(*self._arguments)
        self.steps_run += 1
        self.compiles = False

    def _guards(self):
        """How much of the compiled step's guards to evaluate: all of them at a generation's first step;
        after that only those that tell compiled graphs apart. The step's arguments are then the same
        objects, changed only in place by the step itself, and the guards of every parameter cost
        about 5 % of a token on CPU at 24 x 256 (docs/explanation/fast-paths.md). A model changed in the middle
        of a generation (its dtype, device or parameters replaced) needs a new `start`."""
        if self.compile_mode is None or self.steps_run <= self._compiled_from:
            return contextlib.nullcontext()
        return torch.compiler.set_stance(skip_guard_eval_unsafe=True)

    def all_finished(self) -> bool:
        """Whether every row has produced an end token (reads one flag back from the device)."""
        return self.eos is not None and bool(self.state.finished.all())

    def finish(self, stop_check_every: int | None = None) -> GenerationResult:
        """Run the remaining steps (until max_new_tokens, or every row has stopped) -> GenerationResult.

        stop_check_every: steps between `all_finished` checks (default: 1 on CPU, 16 elsewhere)."""
        check_int(stop_check_every, "stop_check_every", allow_none=True)
        every = stop_check_every or (1 if self.device.type == "cpu" else 16)
        eager_step_s = self._choose() if self.decides else None
        compile_s = 0.0
        if self.compiles and self.steps_run < self.max_new_tokens and not self.all_finished():
            if not self.decides and self.auto is not None:  # a forced compile says what it costs, too
                self.auto.announce(*self.auto.estimate())
            compile_s = self._timed_step()
        timed = 0
        begin = time.perf_counter()
        while self.steps_run < self.max_new_tokens:
            if timed % every == 0 and self.all_finished():
                break
            self.step()
            timed += 1
        _sync(self.device)
        decode_s = time.perf_counter() - begin
        new = self.steps_run
        if self.eos is not None:
            new = _stopped_length(self.state.sequence[:, self.prompt:self.prompt + new], self.eos, new)
        if self.auto is not None and compile_s > 0:  # measured for the next decision on this machine
            compiled_step_s = decode_s / timed if timed else None
            self.auto.times_store().record(self.auto.key, compile_s, eager_step_s / compiled_step_s
                                           if eager_step_s and compiled_step_s else None)
        return GenerationResult(sequences=self.state.sequence[:, :self.prompt + new].clone(), prompt_tokens=self.prompt,
                                new_tokens=new, prefill_s=self.prefill_s, compile_s=compile_s, decode_s=decode_s,
                                decode_steps=timed, compile_mode=self.compile_mode, compile_choice=self.compile_choice,
                                decode_bytes_per_step=self.step_bytes)

    def _timed_step(self) -> float:
        """Seconds of one step, the device synchronised before and after."""
        _sync(self.device)
        begin = time.perf_counter()
        self.step()
        _sync(self.device)
        return time.perf_counter() - begin

    def _choose(self) -> float | None:
        """compile="auto": time up to PROBE_STEPS eager steps, then compile the rest only where the rule
        (`compile_pays`) says it pays; returns the eager step's seconds (None when none ran)."""
        times = []
        while len(times) < PROBE_STEPS and self.steps_run < self.max_new_tokens and not self.all_finished():
            times.append(self._timed_step())
        left = self.max_new_tokens - self.steps_run
        if not times or left == 0 or self.all_finished():
            self.compile_choice = "eager: nothing left to decode after the first steps"
            return min(times) if times else None
        eager_step_s, auto = min(times), self.auto
        if auto.generator.backend == "inductor" and self.device.type == "cpu" and inductor_compiler() is None:
            self.compile_choice = "eager: inductor has no C++ compiler here"
            return eager_step_s
        uncompiled = not_compiled_reason(auto.generator.model)
        if uncompiled:
            self.compile_choice = f"eager: the step of {uncompiled} is not compiled yet"
            return eager_step_s
        estimate, where = auto.estimate()
        saves = saved_seconds(estimate, eager_step_s, left)
        if not compile_pays(estimate, eager_step_s, left):
            self.compile_choice = (f"eager: compiling would take about {estimate.compile_s:.0f} s ({where}) and save "
                                   f"about {saves:.1f} s over {left} steps")
            return eager_step_s
        auto.announce(estimate, where, f" to save about {saves:.0f} s over {left} steps")
        self._step, self.compile_mode, self.compiles = auto.generator._compiled(self.device, auto.bf16,
                                                                                auto.compile_key)
        self._compiled_from = self.steps_run  # this step's call evaluates every guard
        self.compile_choice = f"compiled: about {estimate.compile_s:.0f} s ({where}) against about {saves:.0f} s saved"
        return eager_step_s


@dataclass
class _State:
    """The fixed-shape tensors of one generation (reused by the next one of the same shape)."""

    cache: StaticKVCache
    sequence: torch.Tensor  # (B, capacity) long: prompt, then the generated tokens
    key_valid: torch.Tensor  # (B, capacity) bool: cache positions a query may attend to
    column: torch.Tensor  # (1,) long: the column of the next step's input token
    rope_position: torch.Tensor  # (B,) long: that token's rotary position
    finished: torch.Tensor  # (B,) bool
    eos_from: torch.Tensor  # (1,) long: first column where an end token may be written

    def fill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, min_new_tokens: int) -> None:
        """Set every tensor in place for a new prompt (B, T) whose keys the prefill has just cached."""
        prompt = input_ids.shape[1]
        self.sequence.zero_()
        self.sequence[:, :prompt] = input_ids
        self.key_valid.zero_()
        self.key_valid[:, :prompt] = True if attention_mask is None else attention_mask.bool()
        self.column.fill_(prompt)  # the first new token, chosen from the prefill, goes to column `prompt`
        if attention_mask is None:
            self.rope_position.fill_(prompt)
        else:
            self.rope_position.copy_(attention_mask.long().sum(dim=1))
        self.finished.zero_()
        self.eos_from.fill_(prompt + min_new_tokens)


@dataclass
class _AutoCompile:
    """What a decoding needs to decide on a compile (compile="auto") and to record one: its generator,
    the compiled step's key and the shape key of its measured compile times."""

    generator: FastGenerator
    compile_key: tuple
    key: str
    bf16: bool = False  # the step computes in bf16 (its compile options differ on CPU)

    def estimate(self) -> tuple[CompileEstimate, str]:
        """The expected compile of this shape, and where the figure comes from (for the line that says so)."""
        estimate = self.times_store().estimate(self.key, self.generator.model.config.num_sublayers)
        return estimate, "measured on this machine" if estimate.measured else "a first estimate"

    def announce(self, estimate: CompileEstimate, where: str, gain: str = "") -> None:
        """The line logged before a compile starts."""
        self.generator.log(f"compiling the decode step: about {estimate.compile_s:.0f} s ({where}){gain}; "
                           f"the compiled code is cached for later runs (--no-compile or compile=False "
                           f"skips it)")

    def times_store(self) -> CompileTimes:
        if self.generator.times is None:
            self.generator.times = CompileTimes()
        return self.generator.times


def not_compiled_reason(model: AttnResLM) -> str | None:
    """Why the decode step of `model` is not compiled, or None where it is: its feed-forward, or a
    token mixer that says its step is not compiled yet (`TokenMixer.not_compiled`). A ModelConfig (what
    it took before) is built on the meta device to ask its token mixers."""
    if not isinstance(model, torch.nn.Module):
        with torch.device("meta"):
            model = AttnResLM(model)
    if model.config.moe is not None:  # its dispatch reads the experts' row counts to the host: a graph break
        return "a mixture-of-experts model"
    mixer = next((layer.self_attn.not_compiled for layer in model.layers if layer.self_attn.not_compiled), None)
    return None if mixer is None else f"a model with {mixer}"


def _own_copy(function):
    """`function` with a code object of its own. torch.compile keeps its compiled graphs on the code
    object, at most `recompile_limit` (8) of them: a copy per generator keeps one generator's models
    and shapes from filling another's entries, and frees them with the generator."""
    copy = types.FunctionType(function.__code__.replace(), function.__globals__, function.__name__,
                              function.__defaults__, function.__closure__)
    copy.__doc__, copy.__qualname__ = function.__doc__, function.__qualname__
    return copy


def _sync(device: torch.device) -> None:
    """Wait for the device (CUDA) before reading a clock; nothing on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_inputs(model: AttnResLM, input_ids, attention_mask, max_new_tokens, min_new_tokens, precision,
                  device: torch.device) -> None:
    """InputError naming the argument for inputs `FastGenerator.start` cannot take."""
    if not (torch.is_tensor(input_ids) and input_ids.dim() == 2 and input_ids.shape[1] > 0
            and not input_ids.dtype.is_floating_point and input_ids.dtype != torch.bool):
        got = tuple(input_ids.shape) if torch.is_tensor(input_ids) else type(input_ids).__name__
        raise InputError(f"input_ids must be a (batch, seq_len) integer tensor with seq_len >= 1, got {got}")
    if input_ids.device != device:
        raise InputError(f"input_ids are on {input_ids.device} and the model on {device}; move them with .to()")
    check_int(max_new_tokens, "max_new_tokens")
    check_int(min_new_tokens, "min_new_tokens", minimum=0)
    check_choice(precision, "precision", PRECISIONS)
    limit = model.config.max_seq_len
    if input_ids.shape[1] + max_new_tokens > limit:
        raise InputError(f"the prompt's {input_ids.shape[1]} tokens + max_new_tokens={max_new_tokens} exceed the "
                         f"model's max_seq_len={limit}")
    if attention_mask is not None:
        if tuple(attention_mask.shape) != tuple(input_ids.shape) or attention_mask.dtype.is_floating_point:
            raise InputError(f"attention_mask must be a bool or integer tensor of input_ids' shape "
                             f"{tuple(input_ids.shape)} (1 = real token, 0 = padding), got "
                             f"{tuple(attention_mask.shape)} {attention_mask.dtype}")
        if not bool(attention_mask[:, -1].bool().all()):
            raise InputError("attention_mask: fast generation needs left padding (every row's last token real); "
                             "pad on the left (tokenizer padding_side='left')")


def _check_cache_fits(model: AttnResLM, batch: int, prompt: int, max_new_tokens: int, capacity: int,
                      dtype: torch.dtype, device: torch.device) -> None:
    """InputError, before the static cache is allocated, where it and the weights exceed the machine's
    memory (attnres.model.memory_need), with the most new tokens that would fit."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    cache = cache_bytes(model, batch, capacity, dtype)
    fixed = cache_bytes(model, batch, 0, dtype)  # recurrent states: the same at any length
    per_position = cache_bytes(model, batch, 1, dtype) - fixed

    def fitting(have: int) -> str:
        room = (have - weights - fixed) // per_position if per_position else 0  # no length helps
        fit = max(0, (min(room, model.config.max_seq_len) // CAPACITY_STEP) * CAPACITY_STEP - prompt)
        return f"ask for at most {fit:,} new tokens" if fit else "shorten the prompt or the batch"

    check_fits(weights + cache, f"max_new_tokens={max_new_tokens:,}: a static cache of {capacity:,} positions for "
               f"{batch} row(s) ({gib(cache)}) and the weights ({gib(weights)}) need", device, fitting)


def _token_tensor(ids, name: str, vocab_size: int, device: torch.device) -> torch.Tensor | None:
    """An id or a list of ids -> (E,) long tensor; InputError naming `name` for anything else."""
    if ids is None:
        return None
    if torch.is_tensor(ids):
        ids = ids.flatten().tolist()
    values = [ids] if isinstance(ids, int) and not isinstance(ids, bool) else ids
    if not (isinstance(values, (list, tuple)) and values
            and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size for i in values)):
        raise InputError(f"{name} must be a token id in [0, {vocab_size}) or a non-empty list of them, got {ids!r}")
    return torch.tensor(values, dtype=torch.long, device=device)


def _stopped_length(generated: torch.Tensor, eos: torch.Tensor, steps: int) -> int:
    """Tokens generated until every row has produced an end token (or `steps`): generated (B, steps)."""
    hits = torch.isin(generated, eos)
    first = torch.where(hits.any(dim=1), hits.float().argmax(dim=1) + 1, torch.full_like(hits[:, 0], steps,
                                                                                     dtype=torch.long))
    return int(first.max())
