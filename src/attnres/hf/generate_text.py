"""Text generation from a model directory, as `attnres generate` does it: the request validated once
(`GenerationRequest`), the model loaded and decoded (`generate_text`), and the lines that say what
the decoding cost (`timing_lines`). The command line only parses its flags into a request.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from attnres.common.checks import check_choice, check_int, check_positive_number, is_int
from attnres.common.errors import InputError
from attnres.common.machine import available_cpus, cpu_has_native_bf16
from attnres.common.precision import PRECISIONS, WEIGHT_DTYPES
from attnres.hf.model_dir import load_model_dir
from attnres.generation.memory_bandwidth import read_bandwidth
from attnres.routing import IMPLS


def _check_utf8(prompt: str) -> None:
    """Refuse a prompt that is not UTF-8 text. Python keeps a command line's undecodable bytes as lone
    surrogates (U+DC80..U+DCFF); replacing them would feed the model text the user never wrote, so
    the byte and its place are named instead."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as err:
        code = ord(prompt[err.start])
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise InputError(f"--prompt is not valid UTF-8 text ({what} at character {err.start}); pass UTF-8, "
                         f"e.g. converted with `iconv -t UTF-8`") from None


@dataclass(frozen=True)
class GenerationRequest:
    """One generation: the prompt and how to decode it. Names are the command's flags; the checks run
    at construction and name the flag. `compile`: None decides by the measured cost (`generate_fast`'s
    "auto"); `temperature`, `top_k`, `top_p` and `seed` need `sample`."""

    prompt: str
    max_new_tokens: int = 64
    dtype: str = "fp32"
    precision: str = "fp32"
    compile: bool | None = None
    threads: int | None = None
    chat: bool = False
    sample: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    routing_impl: str = "auto"
    device: str = "cpu"

    def __post_init__(self) -> None:
        # the command's argparse choices, checked here too for a request built in Python
        check_choice(self.dtype, "--dtype", WEIGHT_DTYPES)
        check_choice(self.precision, "--precision", PRECISIONS)
        check_choice(self.routing_impl, "--routing-impl", IMPLS)
        check_int(self.max_new_tokens, "--max-new-tokens")
        check_int(self.threads, "--threads", allow_none=True)
        if self.threads is not None and self.threads > available_cpus():
            raise InputError(f"--threads {self.threads} is more than the {available_cpus()} CPUs this process may "
                             f"use; give at most {available_cpus()} (more threads than CPUs only slow decoding)")
        if self.seed is not None and not (is_int(self.seed) and 0 <= self.seed < 2 ** 64):
            raise InputError(f"--seed must be an integer from 0 to 2**64 - 1 (torch's seed range), got {self.seed!r:.40}")
        if not isinstance(self.prompt, str) or not self.prompt:
            raise InputError(f"--prompt must be a non-empty text, got {self.prompt!r:.80}")
        _check_utf8(self.prompt)
        if self.temperature is not None:
            check_positive_number(self.temperature, "--temperature")
        if self.top_k is not None:
            check_int(self.top_k, "--top-k", minimum=0)
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise InputError(f"--top-p must be a number in (0, 1], got {self.top_p}")
        given = [flag for flag, value in (("--temperature", self.temperature), ("--top-k", self.top_k),
                                          ("--top-p", self.top_p), ("--seed", self.seed)) if value is not None]
        if given and not self.sample:
            raise InputError(f"{', '.join(given)} only apply with --sample (greedy decoding has no randomness)")

    def sampling_options(self) -> dict:
        """`generate_fast`'s decoding keywords: greedy, or sampling with the values given (the model's
        generation defaults for the others)."""
        if not self.sample:
            return {"do_sample": False}
        given = (("temperature", self.temperature), ("top_k", self.top_k), ("top_p", self.top_p))
        return {"do_sample": True, **{key: value for key, value in given if value is not None}}


def generate_text(model_dir: str | Path, request: GenerationRequest,
                  note: Callable[[str], None] = lambda line: print(line, file=sys.stderr)):
    """(the generated text, `generate_fast`'s result) for `request` from the model in `model_dir` (a
    converted model or a training checkpoint). `note` gets one-line advice, such as bf16 being
    emulated on this CPU. Sets torch's threads when the request names them."""
    if request.threads is not None:
        torch.set_num_threads(request.threads)
    model, tokenizer = load_model_dir(model_dir, request.device, WEIGHT_DTYPES[request.dtype])
    model.set_routing(request.routing_impl)
    if request.dtype == "bf16" and request.device == "cpu" and not cpu_has_native_bf16():
        note("note: this CPU has no native bf16 (avx512_bf16, amx_bf16): bf16 is emulated here and slower than "
             "fp32; drop --dtype bf16")
    text = request.prompt
    if request.chat:
        if not getattr(tokenizer, "chat_template", None):
            raise InputError(f"--chat: the tokenizer of {model_dir} has no chat template; drop --chat")
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt")["input_ids"].to(request.device)
    if request.sample and request.seed is not None:
        torch.manual_seed(request.seed)
    result = model.generate_fast(ids, max_new_tokens=request.max_new_tokens, precision=request.precision,
                                 compile="auto" if request.compile is None else request.compile,
                                 **request.sampling_options())
    return tokenizer.decode(result.sequences[0, ids.shape[1]:], skip_special_tokens=True), result


def timing_lines(result, request: GenerationRequest) -> list[str]:
    """What the decoding cost: prompt and prefill, compile, decode, and on a CPU the bytes each step
    read against this machine's read bandwidth (attnres.generation.memory_bandwidth: measured once
    per machine and thread count, then kept)."""
    if request.compile is False:
        compiled = "none (--no-compile: the same fixed-shape step runs eagerly)"
    elif result.compile_mode is None:
        compiled = f"none ({result.compile_choice}; --compile forces it)"
    else:
        compiled = f"{result.compile_s:.1f} s (the first decode step: torch.compile, mode {result.compile_mode!r})"
    lines = [f"prompt: {result.prompt_tokens} tokens, prefill {result.prefill_s:.3f} s "
             f"({_rate(result.prefill_tokens_per_s)})\n"
             f"compile: {compiled}\n"
             f"decode: {result.decode_steps} tokens in {result.decode_s:.3f} s "
             f"({_rate(result.decode_tokens_per_s)}); {result.new_tokens} new tokens in all, weights "
             f"{request.dtype}, precision {request.precision}, {torch.get_num_threads()} threads, {request.device}"]
    if result.decode_steps and request.device == "cpu":
        limit = read_bandwidth()
        size = result.decode_bytes_per_step
        size = f"{size / 1e6:.0f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"
        kept = "measured now" if limit.fresh else f"measured {limit.measured}"
        kept += f", kept in {limit.path}" if limit.path is not None else ""
        lines.append(f"memory: {size} of weights and KV cache read per step, "
                     f"{result.decode_gb_per_s:.1f} GB/s: {100 * result.decode_gb_per_s / limit.gb_s:.0f} % of this "
                     f"machine's read bandwidth ({limit.gb_s:.1f} GB/s, {kept})")
    return lines


def _rate(tokens_per_s: float) -> str:
    """"123.4 tokens/s", or why there is no rate (nothing timed: no decode step, or a time below the clock's)."""
    return f"{tokens_per_s:.1f} tokens/s" if math.isfinite(tokens_per_s) else "no rate: nothing long enough to time"
