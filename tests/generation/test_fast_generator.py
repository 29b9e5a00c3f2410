"""Fast generation (attnres.generation.fast_generator): a static KV cache and one fixed-shape decode step.

For every variant of the table, greedy tokens equal those of the eager model decoding one token at
a time with its growing KVCache: with the step run eagerly (fast tests), and with the step compiled
by torch.compile(fullgraph=True) (marked `compile`: `-m "not compile"` skips them). fullgraph=True
fails on any graph break, so a host synchronisation in the step (`.item()`, a Python int read from
a tensor) fails these tests. aot_eager traces the same graph as inductor without generating code;
one test runs inductor itself.
"""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from attnres import AttnResLM, ModelConfig
from attnres.model import KVCache, StaticKVCache
from attnres.generation.fast_generator import FastGenerator, Sampling, choose_next
from attnres.residual import VARIANTS
from tests.helpers import activate_routing, exact_conversions, needs_fused_cpu, needs_inductor_cpu, options_of

CASES = [(name, 3 if variant.uses_blocks else None, exact)
         for name, variant in VARIANTS.items() for exact in (None, *exact_conversions(variant))]
IDS = [f"{name}-{exact}" for name, _, exact in CASES]
VOCAB = 64


def model_for(residual="block_attnres", num_blocks=3, exact=None, seed=0, max_seq_len=96, routing_impl="auto"):
    """A 3-layer model with non-uniform routing and weights scaled up, so logits are far from ties (and
    an untied head: tied, a model this small mostly repeats tokens)."""
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=VOCAB, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2,
                         intermediate_size=48, residual=residual,
                         residual_options=options_of(num_blocks=num_blocks, exact_conversion=exact),
                         max_seq_len=max_seq_len, tie_embeddings=False)
    model = AttnResLM(config).set_routing(routing_impl).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(8.0)
    activate_routing(model.routers)
    return model


@torch.no_grad()
def eager_greedy(model, ids, steps, attention_mask=None, with_margins=False):
    """ids (B, T) followed by `steps` argmax tokens, decoded by AttnResLM.forward with the growing KVCache.
    with_margins: also the (B, steps) top-1 minus top-2 logit margin of each step, over that step's max |logit|."""
    cache, out, margins = KVCache(), [ids], []
    logits = model(ids, cache=cache, attention_mask=attention_mask).logits[:, -1]
    mask = attention_mask
    for _ in range(steps):
        top = logits.float().topk(2, dim=-1).values
        margins.append((top[:, 0] - top[:, 1]) / logits.float().abs().amax(-1))
        token = logits.argmax(-1, keepdim=True)
        out.append(token)
        if mask is not None:
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        logits = model(token, cache=cache, attention_mask=mask).logits[:, -1]
    return (torch.cat(out, dim=1), torch.stack(margins, dim=1)) if with_margins else torch.cat(out, dim=1)


# Under bf16 autocast two valid computations (the eager model with its growing cache, the fixed-shape
# step with its static cache) round differently, and by how much depends on the CPU's bf16 kernels
# (native AVX-512 BF16/AMX CPUs round otherwise than AVX2 ones): a near-tie in the logits can flip the
# argmax, after which the two sequences continue from different prefixes. bf16 keeps 8 significant
# bits, so the largest logit is itself rounded by up to 2^-8 of its size (a bf16 ulp is 0.4-0.8% of
# it); the flips measured on an AMX CPU came at margins of 0, 0.0044 and 0.0069 x max |logit|.
# NEAR_TIE = 2e-2 (2.5 to 5 bf16 ulps of the largest logit) leaves room for other machines' kernels.
NEAR_TIE = 2e-2


def assert_greedy_agrees_until_a_near_tie(got, expected, margins, prompt_len, near_tie=NEAR_TIE):
    """Per row, the generated tokens equal the expected greedy ones step by step until the first step
    where they differ; a difference is allowed only where the expected model's top-1/top-2 margin
    (`margins`, relative to that step's max |logit|) is below `near_tie`, and ends the comparison.
    Returns the number of tokens that agreed, over the batch."""
    got, expected = got[:, prompt_len:].tolist(), expected[:, prompt_len:].tolist()
    agreed = 0
    for row, (g, e) in enumerate(zip(got, expected)):
        assert len(g) == len(e), (row, g, e)
        for step, (a, b) in enumerate(zip(g, e)):
            if a != b:
                margin = margins[row, step].item()
                assert margin < near_tie, f"row {row} step {step}: token {a} != {b} at margin {margin:.4f} >= {near_tie}"
                break
            agreed += 1
    return agreed


def prompt(batch=2, length=6, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("residual, num_blocks, exact", CASES, ids=IDS)
def test_the_fixed_shape_step_decodes_greedily_like_the_eager_model(residual, num_blocks, exact):
    model = model_for(residual, num_blocks, exact)
    ids = prompt()
    expected = eager_greedy(model, ids, 21)
    result = FastGenerator(model, compile=False).generate(ids, 21)
    assert result.sequences.tolist() == expected.tolist()
    assert len(set(expected[:, 6:].flatten().tolist())) >= 6  # not a degenerate repetition of one token
    assert result.new_tokens == 21 and result.decode_steps == 20 and result.compile_s == 0.0


def test_a_generator_follows_its_model_cast_to_another_dtype_and_forget_starts_it_afresh():
    model, ids = model_for(), prompt()
    generator = FastGenerator(model, compile=False)
    assert generator.generate(ids, 8).sequences.tolist() == eager_greedy(model, ids, 8).tolist()
    model.double()  # the kept fp32 cache would meet float64 queries
    assert generator.generate(ids, 8).sequences.tolist() == eager_greedy(model, ids, 8).tolist()
    generator.forget()
    assert generator.generate(ids, 8).sequences.tolist() == eager_greedy(model, ids, 8).tolist()


@pytest.mark.parametrize("residual, num_blocks, exact", CASES, ids=IDS)
def test_bf16_autocast_decodes_like_the_eager_model_under_autocast(residual, num_blocks, exact):
    model = model_for(residual, num_blocks, exact)
    ids = prompt()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, margins = eager_greedy(model, ids, 12, with_margins=True)
    result = FastGenerator(model, compile=False).generate(ids, 12, precision="bf16")
    # Not token equality: bf16 rounding differs between CPUs and near-ties may flip (see NEAR_TIE).
    assert result.sequences[:, :6].tolist() == ids.tolist()
    assert assert_greedy_agrees_until_a_near_tie(result.sequences, expected, margins, 6) >= 1


@pytest.mark.parametrize("residual, num_blocks, exact", CASES, ids=IDS)
def test_bf16_weights_decode_like_the_eager_bf16_model(residual, num_blocks, exact):
    """Weights in bf16 (`attnres generate --dtype bf16`): every variant's step keeps the model's dtype
    (the stream mixers compute in fp32 and hand the sub-layers bf16), and reads half the bytes."""
    model = model_for(residual, num_blocks, exact)
    ids = prompt()
    fp32_bytes = FastGenerator(model, compile=False).generate(ids, 3).decode_bytes_per_step
    model = model.to(torch.bfloat16)
    expected, margins = eager_greedy(model, ids, 12, with_margins=True)
    result = FastGenerator(model, compile=False).generate(ids, 12)
    # Looser than under autocast: with bf16 weights the activations and the residual stream are bf16
    # too, and each sub-layer's rounding (up to 2^-8 of a value) compounds; a flip was seen at 0.065.
    assert assert_greedy_agrees_until_a_near_tie(result.sequences, expected, margins, 6, near_tie=0.15) >= 1
    assert result.decode_bytes_per_step * 2 == fp32_bytes


@pytest.mark.compile
def test_the_compiled_step_is_one_graph_and_decodes_like_the_eager_model_for_every_variant():
    for residual, num_blocks, exact in CASES:
        torch._dynamo.reset()
        model = model_for(residual, num_blocks, exact)
        ids = prompt()
        counter = CompileCounterWithBackend("aot_eager")
        generator = FastGenerator(model, backend=counter)  # fullgraph=True: a graph break fails
        first = generator.generate(ids, 12)
        assert first.sequences.tolist() == eager_greedy(model, ids, 12).tolist(), residual
        assert first.compile_s > 0 and first.decode_steps == 10  # the first step compiled, the rest timed
        again = generator.generate(prompt(seed=2), 12)  # same shapes: no new compile, same graph
        assert again.compile_s == 0.0 and again.decode_steps == 11
        assert again.sequences.tolist() == eager_greedy(model, prompt(seed=2), 12).tolist(), residual
        assert counter.frame_count == 1  # one graph, captured once for both generations
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, margins = eager_greedy(model, ids, 12, with_margins=True)
    # bf16: equal up to a near-tie of the eager model's logits, not exactly (see NEAR_TIE).
    sequences = generator.generate(ids, 12, precision="bf16").sequences
    assert sequences[:, :6].tolist() == ids.tolist()
    assert assert_greedy_agrees_until_a_near_tie(sequences, expected, margins, 6) >= 1


@pytest.mark.compile
def test_a_generation_checks_every_guard_at_its_first_step_and_then_only_those_that_tell_graphs_apart(monkeypatch):
    torch._dynamo.reset()
    model = model_for("block_attnres", 3)
    counter = CompileCounterWithBackend("aot_eager")
    generator = FastGenerator(model, backend=counter)
    stances = []
    set_stance = torch.compiler.set_stance
    monkeypatch.setattr(torch.compiler, "set_stance", lambda *a, **k: stances.append(k) or set_stance(*a, **k))
    ids = prompt()
    assert generator.generate(ids, 8).sequences.tolist() == eager_greedy(model, ids, 8).tolist()
    assert stances == [{"skip_guard_eval_unsafe": True}] * 6  # steps 2..7 of 7; the first, compiling, checks all
    model.residual.impl = "lean"  # the step specialises on it: the next generation's first step must see it
    assert generator.generate(ids, 8).sequences.tolist() == eager_greedy(model, ids, 8).tolist()
    assert counter.frame_count == 2


def graph_ops(model, ids):
    """The op namespaces and names the compiled decode step's graph calls (captured by dynamo)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    result = FastGenerator(model, backend=backend).generate(ids, 6)
    assert result.sequences.tolist() == eager_greedy(model, ids, 6).tolist()
    return {str(node.target) for gm in graphs for node in gm.graph.nodes if node.op == "call_function"}


@pytest.mark.compile
@pytest.mark.parametrize("impl", ["lean", pytest.param("fused", marks=needs_fused_cpu)])
@pytest.mark.parametrize("residual, num_blocks", [("full_attnres", None), ("delta_attnres", None),
                                                  ("block_attnres", 3)])
def test_the_compiled_step_routes_without_python_custom_ops(residual, num_blocks, impl):
    """Without gradients, routing in the step is plain PyTorch or the fused kernel's C++ op called
    directly: a Python custom op (namespace attnres::) costs ~0.1 ms a call, 2L + 1 routers a token.
    With "fused", a group's phase 1 is one extern call, each router's results in buffers of their own,
    and the merges are plain PyTorch that inductor fuses with the norms (no merge_forward call)."""
    model = model_for(residual, num_blocks, routing_impl=impl)
    ops = graph_ops(model, prompt())
    assert not [op for op in ops if op.startswith("attnres.")], ops
    kernels = {op for op in ops if op.startswith("attnres_fused_cpu.")}
    if impl == "fused":
        assert "attnres_fused_cpu.route_forward_into" in kernels  # a router routed alone: route_forward
        assert kernels <= {"attnres_fused_cpu.route_forward_into", "attnres_fused_cpu.route_forward"}
    else:
        assert not kernels


@pytest.mark.compile
@needs_inductor_cpu
def test_inductor_compiles_the_step_and_keeps_every_buffer_in_place():
    torch._dynamo.reset()
    model = model_for("delta_block", 3, "gate")
    ids = prompt()
    generator = FastGenerator(model)  # inductor, the CPU default mode
    decoding = generator.start(ids, 10)
    state = decoding.state
    pointers = [t.data_ptr() for t in (*state.cache.keys.values(), *state.cache.values.values(), state.sequence, state.column)]
    shapes = [tuple(k.shape) for k in state.cache.keys.values()]
    result = decoding.finish()
    assert result.compile_mode == "default+no_size_asserts"  # inductor, its default Python wrapper, on CPU
    assert [t.data_ptr() for t in (*state.cache.keys.values(), *state.cache.values.values(), state.sequence, state.column)] == pointers
    assert [tuple(k.shape) for k in state.cache.keys.values()] == shapes == [(2, 2, 64, 8)] * 3  # capacity 16 -> 64
    assert result.sequences.tolist() == eager_greedy(model, ids, 10).tolist()


@pytest.mark.compile
@needs_inductor_cpu
@needs_fused_cpu
def test_the_cpp_wrapper_compiles_a_step_with_fused_routing():
    """options={"cpp_wrapper": True} (documented in how-to/generate.md): inductor's C++ wrapper calls an
    extern op only when its results are a tensor or a flat list of them, so the fused phase 1
    (`route_forward_into`) fills per-router buffers and returns one tensor. Block AttnRes (a group's
    phase 1) and Full AttnRes (chunks)."""
    torch._dynamo.reset()
    ids = prompt()
    for residual, num_blocks in (("block_attnres", 3), ("full_attnres", None)):
        model = model_for(residual, num_blocks, routing_impl="fused")
        result = FastGenerator(model, options={"cpp_wrapper": True}).generate(ids, 6)
        assert result.compile_mode == "default+cpp_wrapper"
        assert result.sequences.tolist() == eager_greedy(model, ids, 6).tolist()


@pytest.mark.compile
@needs_inductor_cpu
def test_a_bf16_step_compiles_its_one_row_products_as_reductions():
    """With bf16 weights the CPU step takes inductor's decompose_mm_pass (generation.CPU_BF16_OPTIONS):
    a one-row matrix product becomes a product and a sum; the tokens still follow the eager step's."""
    torch._dynamo.reset()
    model = model_for("block_attnres", 3).to(torch.bfloat16)
    ids = prompt(1, 6)
    generator = FastGenerator(model)
    assert generator.resolved_mode(torch.device("cpu"), bf16=True) == "default+no_size_asserts+decompose_mm_pass"
    assert generator.resolved_mode(torch.device("cpu")) == "default+no_size_asserts"
    result = generator.generate(ids, 10)
    assert result.compile_mode == "default+no_size_asserts+decompose_mm_pass" and result.compile_s > 0
    expected, margins = eager_greedy(model, ids, 10, with_margins=True)
    assert assert_greedy_agrees_until_a_near_tie(result.sequences, expected, margins, 6, near_tie=0.15) >= 1


def test_left_padded_rows_decode_as_they_would_alone():
    model = model_for("full_attnres", None, None)
    rows = [prompt(1, 7, seed=3)[0], prompt(1, 3, seed=4)[0]]
    ids = torch.zeros(2, 7, dtype=torch.long)
    mask = torch.zeros(2, 7, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, 7 - len(row):], mask[i, 7 - len(row):] = row, 1
    result = FastGenerator(model, compile=False).generate(ids, 10, attention_mask=mask)
    for i, row in enumerate(rows):
        alone = eager_greedy(model, row[None], 10)
        assert result.sequences[i, 7:].tolist() == alone[0, len(row):].tolist()


def test_rows_stop_at_an_end_token_and_are_padded_after_it():
    model = model_for()
    ids = prompt()
    free = eager_greedy(model, ids, 16)[:, 6:]
    eos = int(free[0, 4])  # row 0 makes it by its 5th new token
    stop_0 = free[0].tolist().index(eos) + 1
    stop_1 = free[1].tolist().index(eos) + 1 if eos in free[1].tolist() else 16
    never = next(t for t in range(VOCAB) if t not in free.flatten().tolist())
    result = FastGenerator(model, compile=False).generate(ids, 16, eos_token_id=[never, eos], pad_token_id=0)
    new = result.sequences[:, 6:]
    assert result.new_tokens == new.shape[1] == max(stop_0, stop_1)
    assert new[0, :stop_0].tolist() == free[0, :stop_0].tolist() and set(new[0, stop_0:].tolist()) <= {0}
    # min_new_tokens: the end token is suppressed until then, so row 0 goes on past it.
    later = FastGenerator(model, compile=False).generate(ids, 16, eos_token_id=eos, min_new_tokens=stop_0 + 1)
    assert eos not in later.sequences[0, 6:6 + stop_0 + 1].tolist()


def test_top_k_1_sampling_is_greedy_and_a_seed_repeats_a_sample():
    model = model_for()
    ids = prompt()
    generator = FastGenerator(model, compile=False)
    greedy = generator.generate(ids, 12).sequences
    assert generator.generate(ids, 12, sampling=Sampling(do_sample=True, top_k=1)).sequences.tolist() == \
        greedy.tolist()
    assert generator.generate(ids, 12, sampling=Sampling(do_sample=True, top_p=1e-6)).sequences.tolist() == \
        greedy.tolist()
    hot = Sampling(do_sample=True, temperature=5.0)
    torch.manual_seed(7)
    first = generator.generate(ids, 12, sampling=hot).sequences
    torch.manual_seed(7)
    assert generator.generate(ids, 12, sampling=hot).sequences.tolist() == first.tolist()
    assert first.tolist() != greedy.tolist()  # hot sampling leaves the greedy path


def test_sampling_follows_the_truncated_distribution():
    scores = torch.tensor([[0.0, 1.0, 2.0, 3.0, -1.0]]).repeat(4000, 1)
    torch.manual_seed(0)
    picks = choose_next(scores, Sampling(do_sample=True, top_k=3))
    assert set(picks.tolist()) == {1, 2, 3}  # only the 3 most likely
    probs = torch.softmax(torch.tensor([1.0, 2.0, 3.0]), 0)
    freq = torch.bincount(picks, minlength=5)[1:4].float() / len(picks)
    torch.testing.assert_close(freq, probs, atol=0.03, rtol=0)
    nucleus = choose_next(scores, Sampling(do_sample=True, top_p=0.7))  # p = .64, .23, .09, ...: the top two
    assert set(nucleus.tolist()) == {2, 3}


def test_the_static_cache_writes_in_place_and_attention_sees_only_filled_positions():
    cache = StaticKVCache(8)
    k = torch.randn(1, 2, 3, 4)
    keys, _ = cache.update(k, -k, 0)
    assert cache.keys[0].shape == (1, 2, 8, 4) and keys.shape == (1, 2, 3, 4)  # the prompt: a view of 3
    assert torch.equal(cache.keys[0][:, :, 3:], torch.zeros(1, 2, 5, 4))  # zero-filled, never garbage
    new = torch.randn(1, 2, 1, 4)
    full, _ = cache.at(torch.tensor([5])).update(new, -new, 0)
    assert full.data_ptr() == cache.keys[0].data_ptr() and full.shape == (1, 2, 8, 4)
    assert torch.equal(full[:, :, 5:6], new)
    with pytest.raises(ValueError, match="at most max_len=8 positions, 9 were asked for"):
        cache.update(torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4), 0)
    cache.reset()
    assert cache.get_seq_length() == 0 and cache.keys[0].data_ptr() == full.data_ptr()


def test_invalid_arguments_are_refused_by_name():
    model = model_for(max_seq_len=32)
    generator = FastGenerator(model, compile=False)
    ids = prompt()
    with pytest.raises(ValueError, match="max_new_tokens=40 exceed the model's max_seq_len=32"):
        generator.generate(ids, 40)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer, got 0"):
        generator.generate(ids, 0)
    with pytest.raises(ValueError, match="left padding"):
        generator.generate(ids, 4, attention_mask=torch.tensor([[1] * 6, [1] * 5 + [0]]))
    with pytest.raises(ValueError, match="precision must be one of"):
        generator.generate(ids, 4, precision="fp16")
    with pytest.raises(ValueError, match=r"eos_token_id must be a token id in \[0, 64\)"):
        generator.generate(ids, 4, eos_token_id=64)
    with pytest.raises(ValueError, match=r"Sampling.top_p must be None or a number in \(0, 1\]"):
        Sampling(do_sample=True, top_p=0.0)
    with pytest.raises(ValueError, match="FastGenerator mode must be None or one of"):
        FastGenerator(model, mode="fast")
