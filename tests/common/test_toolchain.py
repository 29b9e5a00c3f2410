"""attnres.common.toolchain: the C++ compiler torch would call, found by torch's own rules, and the
features that compile C++ on CPU refused in one line, naming what to install or to do instead, when
there is none. Compilers are stand-in scripts on a PATH of the test's own."""

import shutil

import pytest
import torch
from torch._inductor import config as inductor_config
from torch.utils import cpp_extension

from attnres import AttnResLM, ModelConfig
from attnres.common import toolchain
from attnres.distributed.data_parallel import DataParallel
from attnres.distributed.wrapper import StepSettings
from attnres.generation.fast_generator import FastGenerator

NO_GXX = "no C++ compiler found: CXX is unset and g++ is not on PATH"


def path_with(monkeypatch, tmp_path, *programs):
    """PATH = a folder holding stand-in executables named `programs`, and nothing else; CXX unset."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name in programs:
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.delenv("CXX", raising=False)
    return folder


def tiny_model():
    torch.manual_seed(0)
    return AttnResLM(ModelConfig(vocab_size=32, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                                 intermediate_size=32, residual="block_attnres", residual_options={"num_blocks": 2},
                                 max_seq_len=32))


def test_the_extension_build_calls_cxx_else_cpp_as_torch_does(monkeypatch, tmp_path):
    folder = path_with(monkeypatch, tmp_path, "c++", "wrapped-g++")
    assert toolchain.extension_compiler() == str(folder / "c++") == shutil.which(cpp_extension.get_cxx_compiler())
    monkeypatch.setenv("CXX", "wrapped-g++ -O2")  # ninja's rule runs $CXX through the shell: its first word
    assert toolchain.extension_compiler() == str(folder / "wrapped-g++")
    for nothing in ("g++-99", ""):  # CXX wins over c++ on PATH, even when it names nothing there
        monkeypatch.setenv("CXX", nothing)
        assert toolchain.extension_compiler() is None
    assert toolchain.missing("c++") == "no C++ compiler found: CXX='' is not on PATH"


def test_inductor_calls_its_configured_compiler(monkeypatch, tmp_path):
    folder = path_with(monkeypatch, tmp_path, "g++")
    assert inductor_config.cpp.cxx[-1] == "g++"  # $CXX when torch read its config (unset here), else g++
    assert toolchain.inductor_compiler() == str(folder / "g++")
    with inductor_config.patch({"cpp.cxx": (None, "clang++-77")}):
        assert toolchain.inductor_compiler() is None
    (folder / "g++").unlink()
    assert toolchain.inductor_compiler() is None and toolchain.missing("g++") == NO_GXX


def test_compiled_decoding_on_cpu_without_a_compiler_is_refused_in_one_line(monkeypatch, tmp_path):
    path_with(monkeypatch, tmp_path)
    model, ids = tiny_model(), torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError) as refused:
        FastGenerator(model).start(ids, 3)
    assert str(refused.value) == (
        f"the decode step is compiled by torch.compile's inductor, which on CPU needs a C++ compiler ({NO_GXX}); "
        "install g++ (Debian/Ubuntu: apt-get install g++), or decode without compiling (FastGenerator("
        "compile=False), generate(..., disable_compile=True), attnres generate --no-compile)")
    # What the message offers works there, and so does a backend that generates no code.
    assert FastGenerator(model, compile=False).generate(ids, 3).sequences.shape == (1, 7)
    torch._dynamo.reset()
    assert FastGenerator(model, backend="aot_eager").generate(ids, 2).sequences.shape == (1, 6)


def test_a_compiled_training_step_on_cpu_without_a_compiler_is_refused(monkeypatch, tmp_path):
    path_with(monkeypatch, tmp_path)
    with pytest.raises(ValueError, match=r"^train.compile=true: the training step is compiled by torch.compile's "
                                         r"inductor, .*; install g\+\+ .*, or set train.compile=false$"):
        DataParallel(tiny_model(), "none", torch.device("cpu"), step=StepSettings(compile=True))
    DataParallel(tiny_model(), "none", torch.device("cpu"), step=StepSettings(compile=False))
