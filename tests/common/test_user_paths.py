"""Paths as a shell user expects (issue 59, item 5): `~` expanded where a path is read, an empty path
refused by name, `convert --out` into an existing empty folder (a mount point) and two conversions
into one new --out, out_dir/checkpoints that would fail only at the first save, and an out_dir no
folder can be made in: each one line, before any work."""

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnres.common.errors import InputError
from attnres.checkpoint.run_lock import LOCK_FILE
from attnres.common.run_options import check_out_dir
from attnres.common.user_paths import broken_link, user_path
from attnres.hf import export
from attnres.hf.conversion_error import ConversionError
from attnres.train import load_run_config, train
from attnres.train.run_config import RunConfigError
from tests.train.conftest import tiny_run


def one_line(caught) -> str:
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.fixture
def home(tmp_path, monkeypatch):
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    return folder


# ------------------------------------------------------------------ ~ and the empty path


def test_user_path_expands_home_and_refuses_empty_paths_by_name(home):
    assert user_path("~/runs/x", "out_dir") == home / "runs" / "x"
    assert user_path(Path("~"), "--out") == home
    assert user_path("runs/x", "out_dir") == Path("runs/x")  # relative paths stay relative
    for empty in ("", "   "):
        with pytest.raises(InputError, match=r"^out_dir is empty; give a path") as caught:
            user_path(empty, "out_dir")
        one_line(caught)
    with pytest.raises(InputError, match=r"--out ~no-such-user-59/x: there is no user 'no-such-user-59'"):
        user_path("~no-such-user-59/x", "--out")
    with pytest.raises(InputError, match=r"out_dir must be a path, got None"):
        user_path(None, "out_dir")


def test_a_run_configs_out_dir_expands_home_and_an_empty_one_is_refused(tmp_path, home):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    run = tiny_run(corpus, "~/runs/x")
    assert load_run_config(None, base=run).out_dir == str(home / "runs" / "x")
    assert load_run_config(None, ["out_dir=~/other"], base=run).out_dir == str(home / "other")
    with pytest.raises(RunConfigError, match=r"^out_dir is empty") as caught:
        load_run_config(None, ["out_dir="], base=run)  # `--set out_dir=`: not the working directory
    one_line(caught)
    assert not (Path.cwd() / "~").exists()


def test_check_out_dir_refuses_an_empty_path_and_an_unexpanded_home(tmp_path):
    with pytest.raises(InputError, match=r"^--out is empty; give a folder path"):
        check_out_dir("")
    with pytest.raises(InputError, match=r"^--out ~/x begins with a '~' that was not expanded .*write --out ~/x "
                                         r"as two words, or the full path$") as caught:
        check_out_dir("~/x")  # `--out=~/x`, left as written by the shell: it would make a folder named ~ here
    one_line(caught)
    assert check_out_dir(tmp_path / "new") == tmp_path / "new"


# ------------------------------------------------------------------ folders that cannot be made or used


def test_a_symlink_loop_is_named(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert broken_link(tmp_path / "a").startswith("a symlink loop")
    with pytest.raises(InputError, match=r"--out \S*/a is a symlink loop") as caught:
        check_out_dir(tmp_path / "a")
    one_line(caught)
    with pytest.raises(InputError, match=r"--out \S*/a/run cannot be created: \S*/a is a symlink loop"):
        check_out_dir(tmp_path / "a" / "run")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs a /proc file system")
def test_an_out_dir_in_proc_is_one_line_not_file_not_found():
    with pytest.raises(InputError, match=r"^out_dir /proc/attnres-59/run ") as caught:
        check_out_dir("/proc/attnres-59/run", "out_dir")
    message = one_line(caught)
    assert "cannot be created" in message or "not writable" in message


@pytest.mark.parametrize("kind", ["file", "dangling", "loop", "fine"])
def test_out_dir_checkpoints_must_be_a_folder_or_missing(tmp_path, kind):
    out = tmp_path / "run"
    out.mkdir()
    inner = out / "checkpoints"
    if kind == "file":
        inner.write_text("x")
    elif kind == "dangling":
        inner.symlink_to(tmp_path / "gone")
    elif kind == "loop":
        inner.symlink_to(inner)
    elif kind == "fine":
        inner.mkdir()
    if kind == "fine":
        check_out_dir(out, "out_dir")
        return
    expected = {"file": "is a file, not a folder", "dangling": "is a symlink to \\S*gone, which does not exist",
                "loop": "is a symlink loop"}[kind]
    with pytest.raises(InputError, match=rf"^out_dir \S*run: its checkpoints {expected}") as caught:
        check_out_dir(out, "out_dir")
    one_line(caught)
    check_out_dir(out, "--out")  # a report folder: its checkpoints are not this job's
    check_out_dir(out, "--out", folders=())


@pytest.mark.parametrize("kind", ["file", "dangling", "loop"])
def test_training_refuses_a_broken_checkpoints_folder_before_step_one(tmp_path, monkeypatch, kind):
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "doc.txt").write_text("a few words of text. " * 50)
    out = tmp_path / "run"
    out.mkdir()
    inner = out / "checkpoints"
    {"file": lambda: inner.write_text("x"), "dangling": lambda: inner.symlink_to(tmp_path / "gone"),
     "loop": lambda: inner.symlink_to(inner)}[kind]()
    with pytest.raises(InputError, match=r"^out_dir \S*run: its checkpoints ") as caught:
        train(load_run_config(None, base=tiny_run(corpus, out)))
    one_line(caught)
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints"]  # nothing trained, nothing written
    assert not (tmp_path / "cache").exists()  # the data was not even read


# ------------------------------------------------------------------ convert --out


def write_model(tmp: Path) -> None:
    (tmp / "model.safetensors").write_bytes(b"weights")
    (tmp / "config.json").write_text("{}")


def test_convert_publishes_into_an_existing_empty_folder_without_replacing_it(tmp_path, monkeypatch):
    """A mount point cannot be removed or renamed over (EBUSY): the model is moved into it, file by file."""
    out = tmp_path / "mount"
    out.mkdir()
    inode = out.stat().st_ino
    real_replace, real_rmdir = os.replace, os.rmdir

    def replace(src, dst):
        if Path(dst) == out:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(dst))
        return real_replace(src, dst)

    def rmdir(path, *args, **kwargs):
        if Path(path) == out:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))
        return real_rmdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "rmdir", rmdir)
    assert export.build_hf_dir(out, write_model) == out
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]  # no lock, no build folder
    assert out.stat().st_ino == inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mount"]
    # a second conversion into it is refused as before: nothing is overwritten
    with pytest.raises(ConversionError, match="already exists and is not empty"):
        export.build_hf_dir(out, write_model)


def test_convert_expands_home_in_out(home):
    assert export.build_hf_dir("~/model", write_model) == home / "model"
    assert (home / "model" / "config.json").is_file()
    with pytest.raises(ConversionError, match=r"^--out is empty"):
        export.check_new_dir("")


def test_two_conversions_into_one_new_out_the_second_fails_in_one_line(tmp_path):
    """The first conversion publishes while the second is still building: the second finds the first's
    model at --out and fails in one line, leaving it as it is and nothing of its own."""
    out = tmp_path / "model"

    def slow_write(tmp: Path) -> None:
        write_model(tmp)
        (tmp / "model.safetensors").write_bytes(b"second")
        export.build_hf_dir(out, write_model)  # the other conversion finishes meanwhile

    with pytest.raises(ConversionError, match=r"^--out '\S*model' was filled by another process while this "
                                              r"conversion ran") as caught:
        export.build_hf_dir(out, slow_write)
    one_line(caught)
    assert (out / "model.safetensors").read_bytes() == b"weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_two_conversions_into_one_existing_empty_folder_do_not_mix(tmp_path):
    out = tmp_path / "mount"
    out.mkdir()

    def slow_write(tmp: Path) -> None:
        (tmp / "model.safetensors").write_bytes(b"second")
        (tmp / "config.json").write_text('{"second": true}')
        export.build_hf_dir(out, write_model)

    with pytest.raises(ConversionError, match=r"^--out '\S*mount' was filled by another process") as caught:
        export.build_hf_dir(out, slow_write)
    one_line(caught)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {"config.json": b"{}", "model.safetensors": b"weights"}


def test_a_conversion_still_building_there_is_named_and_a_killed_ones_leftover_is_cleared(tmp_path):
    out = tmp_path / "model"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / f".model.{live.pid}.abc.tmp").mkdir()
        with pytest.raises(ConversionError, match=rf"^--out '\S*model' is being written by another conversion "
                                                  rf"\(pid {live.pid}\)") as caught:
            export.check_new_dir(out)
        one_line(caught)
    finally:
        live.kill()
        live.wait()
    # its process gone, the folder is a killed conversion's: cleared, beside a new --out or inside an empty one
    out.mkdir()
    (out / f".model.{live.pid}.def.tmp").mkdir()
    (out / LOCK_FILE).write_text("")  # what a killed holder of the folder's lock leaves: taken over, then removed
    export.build_hf_dir(out, write_model)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_the_convert_command_publishes_into_a_mount_point_and_expands_home(tmp_path, home, monkeypatch, capsys):
    """`attnres convert` end to end: --out an existing empty folder that cannot be renamed over or removed
    (as a mount point), and --out=~/model, which a shell leaves as written."""
    transformers = pytest.importorskip("transformers")
    import torch

    from attnres.cli import main

    config = transformers.Qwen3Config(vocab_size=80, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                      max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    source = tmp_path / "source"
    transformers.Qwen3ForCausalLM(config).save_pretrained(source)
    out = tmp_path / "mount"
    out.mkdir()
    real_replace, real_rmdir = os.replace, os.rmdir

    def busy(real):
        def call(path, *args, **kwargs):
            target = args[0] if real is real_replace else path
            if Path(target) == out:
                raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(target))
            return real(path, *args, **kwargs)
        return call

    monkeypatch.setattr(os, "replace", busy(real_replace))
    monkeypatch.setattr(os, "rmdir", busy(real_rmdir))
    assert main(["convert", str(source), "--residual", "block_attnres", "--option", "num_blocks=2",
                 "--out", str(out)]) == 0, capsys.readouterr().err
    assert transformers.AutoModelForCausalLM.from_pretrained(out).config.residual == "block_attnres"
    assert not any(p.name.startswith(".") for p in out.iterdir())
    monkeypatch.undo()
    monkeypatch.setenv("HOME", str(home))
    assert main(["convert", str(source), "--out=~/model"]) == 0, capsys.readouterr().err
    assert (home / "model" / "config.json").is_file() and not (Path.cwd() / "~").exists()


@pytest.mark.parametrize("command", [["compare", "--preset", "smoke", "--dry-run"], ["bench", "--quick"],
                                     ["analyze", "no-such-checkpoint"]])
def test_every_out_flag_refuses_an_empty_path_in_one_line(command, capsys):
    from attnres.cli import main

    assert main([*command, "--out", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out is empty" in err[0]


def test_every_out_flag_expands_the_home_folder(tmp_path, monkeypatch):
    from attnres.cli import main

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))
    assert main(["compare", "--preset", "protocol_dense", "--dry-run", "--out", "~/studies/dense"]) == 0
    assert not (tmp_path / "~").exists()


def test_init_from_expands_the_home_folder(tmp_path, monkeypatch):
    from attnres.train.run_config import RunConfig, RunConfigError

    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(RunConfigError, match=f"init_from: {tmp_path}/model/config.json does not exist"):
        RunConfig.from_dict({"init_from": "~/model", "out_dir": str(tmp_path / "run")})


def test_lm_eval_out_refuses_an_empty_path(capsys):
    from attnres.cli import main

    assert main(["lm-eval", "no-such-model", "--tasks", "piqa", "--out", ""]) == 2
    assert "--out is empty" in capsys.readouterr().err
