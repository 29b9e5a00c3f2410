"""attnres.hf.generate_text: what `attnres generate` does, for Python users. A request is checked at
construction with the command's messages; generation from a directory gives plain greedy decoding's
text; the timing lines say what the decoding cost."""

import pytest

pytest.importorskip("transformers")

from attnres.common.errors import InputError  # noqa: E402
from attnres.hf.generate_text import GenerationRequest, generate_text, timing_lines  # noqa: E402
from tests.hf.test_generate_cli import PROMPT, converted, plain_greedy_text  # noqa: E402,F401  (the fixture)


@pytest.mark.parametrize("fields, message", [
    (dict(prompt=""), r"--prompt must be a non-empty text"),
    (dict(prompt="x", max_new_tokens=0), r"--max-new-tokens"),
    (dict(prompt="x", top_p=1.5), r"--top-p must be a number in \(0, 1\], got 1.5"),
    (dict(prompt="x", temperature=0.7, seed=3), r"--temperature, --seed only apply with --sample"),
    (dict(prompt="x", dtype="fp16"), r"--dtype must be one of \['fp32', 'bf16'\], got 'fp16'"),
    (dict(prompt="x", routing_impl="fast"), r"--routing-impl must be one of \["),
    # `--prompt $'\xff\xfe king'`: Python keeps undecodable argv bytes as lone surrogates
    (dict(prompt="\udcff\udcfe king"), r"--prompt is not valid UTF-8 text \(byte 0xff at character 0\)"),
    (dict(prompt="ok \ud800"), r"--prompt is not valid UTF-8 text \(U\+D800 at character 3\)"),
    (dict(prompt=b"king"), r"--prompt must be a non-empty text, got b'king'"),
    (dict(prompt="x", threads=10 ** 5), r"--threads 100000 is more than the \d+ CPUs this process may use"),
    (dict(prompt="x", sample=True, seed=2 ** 64), r"--seed must be an integer from 0 to 2\*\*64 - 1"),
    (dict(prompt="x", sample=True, seed=-1), r"--seed must be an integer from 0 to 2\*\*64 - 1"),
])
def test_a_bad_request_is_refused_at_construction_naming_the_flag(fields, message):
    with pytest.raises(InputError, match=message):
        GenerationRequest(**fields)


def test_sampling_options_carry_only_what_was_given():
    assert GenerationRequest(prompt="x").sampling_options() == {"do_sample": False}
    assert GenerationRequest(prompt="x", sample=True, top_k=5).sampling_options() == {"do_sample": True, "top_k": 5}


def test_generate_text_is_plain_greedy_decoding_and_says_what_it_cost(converted):
    notes = []
    request = GenerationRequest(prompt=PROMPT, max_new_tokens=8, compile=False)
    text, result = generate_text(converted, request, note=notes.append)
    assert text == plain_greedy_text(converted, 8)
    lines = timing_lines(result, request)
    assert lines[0].startswith("prompt: ") and "compile: none (--no-compile" in lines[0]
    assert lines[-1].startswith("memory: ")  # decoded on a CPU: the bytes per step against the copy bandwidth
    assert notes == []  # fp32 weights: no advice


def test_a_decode_too_short_to_time_says_so_instead_of_nan(converted):
    request = GenerationRequest(prompt=PROMPT, max_new_tokens=1, compile=False)
    _, result = generate_text(converted, request)
    result.decode_steps, result.decode_s, result.prefill_s = 0, 0.0, 0.0  # nothing timed
    text = "\n".join(timing_lines(result, request))
    assert "nan" not in text and text.count("no rate: nothing long enough to time") == 2
