"""Fast generation of an AttnResLM: a static KV cache and one compiled decode step, the rule that
decides whether compiling pays (compile_choice), and the bytes a step reads (memory_traffic)."""

from attnres.generation.fast_generator import FastGenerator, GenerationResult, Sampling

__all__ = ["FastGenerator", "GenerationResult", "Sampling"]
