"""Without the fused CPU routing kernel and without a C++ compiler to build it, attnres still works:
routing_impl "auto" routes with the lean ops and says so once per process (only where a fast routing
path routes), and an explicit "fused" is refused in one line that names what to install. The
compiler is found as torch.utils.cpp_extension finds it: $CXX's first word, else c++, on PATH."""

import shutil
import warnings

import pytest
import torch
from torch.utils import cpp_extension

import attnres
from attnres.cli import main
from attnres.routing import fused_cpu, fused_cpu_build, resolve_impl
from attnres.routing import route as route_module

CPU = torch.device("cpu")
NOT_BUILT = "the fused CPU routing kernel is not built"
WHY = "no C++ compiler found: CXX is unset and c++ is not on PATH"
HOW = ("install a C++ compiler with OpenMP (Debian/Ubuntu: apt-get install g++), then run "
       "`python -m attnres.routing.fused_cpu_build` (in a checkout, tools/setup_env.sh runs it)")


@pytest.fixture
def no_compiler(monkeypatch, tmp_path):
    """The kernel not loaded, none in the (empty) cache, PATH without a compiler, CXX unset; the
    one-time note not yet given in this process; any build attempt fails the test."""
    monkeypatch.setitem(fused_cpu._state, "loaded", False)
    monkeypatch.setitem(route_module._noted, "lean_fallback", False)
    monkeypatch.setenv("ATTNRES_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CXX", raising=False)

    def no_build(*args, **kwargs):
        raise AssertionError("a build was started without a compiler")

    monkeypatch.setattr(cpp_extension, "load", no_build)


def notes(record):
    return [str(w.message) for w in record if NOT_BUILT in str(w.message)]


def test_the_compiler_is_the_one_torchs_build_calls(monkeypatch, tmp_path):
    for name in ("c++", "g++-wrapped"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    assert fused_cpu.find_compiler() == str(tmp_path / "c++") == shutil.which(cpp_extension.get_cxx_compiler())
    monkeypatch.setenv("CXX", "g++-wrapped -O2")  # ninja's rule runs $CXX as written: its first word
    assert fused_cpu.find_compiler() == str(tmp_path / "g++-wrapped")
    for missing in ("g++-99", ""):  # CXX wins over c++ on PATH, even when it names nothing
        monkeypatch.setenv("CXX", missing)
        assert fused_cpu.find_compiler() is None
    assert fused_cpu._no_compiler() == "no C++ compiler found: CXX='' is not on PATH"


def test_auto_routes_with_the_lean_ops_and_says_so_once(no_compiler):
    assert fused_cpu.unavailable_reason() == WHY
    with pytest.warns(UserWarning) as record:
        assert resolve_impl("auto", CPU) == "lean"
        assert resolve_impl("auto", CPU) == "lean"
    assert notes(record) == [
        f"attnres: {NOT_BUILT} ({WHY}), so routing_impl 'auto' routes with the lean PyTorch ops on CPU (the same "
        f"routing, slower). To build it, {HOW}. routing_impl='lean' asks for the lean ops without this note."]
    with warnings.catch_warnings(record=True) as later:
        warnings.simplefilter("always")
        assert resolve_impl("auto", CPU) == "lean"
    assert notes(later) == []


@pytest.mark.parametrize("residual, says", [
    ("standard", False), ("full_attnres", True), ("block_attnres", True), ("delta_attnres", True),
    ("delta_block", True), ("denseformer", False), ("hyper_connections", False), ("mhc", False)])
def test_only_a_model_that_routes_with_the_fast_paths_says_it(no_compiler, residual, says):
    blocks = {"num_blocks": 2} if "block" in residual else {}
    scheme = attnres.build_residual(residual, num_layers=2, hidden_size=16, **blocks)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        state = scheme.start(torch.randn(1, 4, 16))
    assert state.impl == "lean"
    assert len(notes(record)) == says


def test_an_explicit_fused_is_refused_in_one_line_naming_what_to_install(no_compiler):
    with pytest.raises(ValueError) as refused:
        resolve_impl("fused", CPU)
    message = str(refused.value)
    assert message == (f"routing_impl='fused' needs the fused CPU routing kernel, which is not built and cannot be "
                       f"({WHY}); {HOW}, or use routing_impl 'auto' or 'lean'")
    assert refused.value.__cause__ is None and refused.value.__context__ is None  # no build's traceback behind it


def test_a_model_with_fused_fails_at_its_first_step_with_that_line(no_compiler):
    model = attnres.AttnResLM(attnres.ModelConfig(vocab_size=32, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=2,
                                                  intermediate_size=32, residual="full_attnres")).set_routing("fused")
    with pytest.raises(ValueError, match=r"^routing_impl='fused' needs the fused CPU routing kernel.*apt-get install"):
        model(torch.zeros(1, 4, dtype=torch.long))


def test_the_cli_exits_2_with_that_line(no_compiler, capsys, tmp_path):
    assert main(["bench", "--quick", "--routing-impl", "fused", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attnres bench: error: routing_impl='fused' needs") and WHY in err
    assert not (tmp_path / "bench.json").exists()


def test_the_kernel_called_directly_raises_one_line_and_announces_no_build(no_compiler, capsys):
    sources = [torch.randn(1, 3, 8) for _ in range(2)]
    with pytest.raises(RuntimeError) as refused:
        fused_cpu.route_sources_fused(torch.randn(1, 8), sources, None, eps=1e-6)
    assert str(refused.value) == (f"{NOT_BUILT} and cannot be ({WHY}); {HOW}, or use routing_impl 'auto' or 'lean'")
    assert capsys.readouterr().err == ""  # no "building the fused CPU routing extension" note


def test_the_build_command_exits_1_with_that_line(no_compiler, capsys):
    assert fused_cpu_build.main([]) == 1
    err = capsys.readouterr().err
    assert err == f"attnres: {NOT_BUILT} and cannot be ({WHY}); {HOW}, or use routing_impl 'auto' or 'lean'\n"
