"""Atomic publication gives published files and directories the mode the umask gives new ones; a failing
write of the machine's storage names its file."""

import errno
import os
import stat

import pytest
from safetensors import SafetensorError
from safetensors.torch import save_file

from attnres.common.atomic import naming_failures, publish, storage_failure, umask_mode, write_atomic


@pytest.mark.parametrize("mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750),
                                                       (0o077, 0o600, 0o700)])
def test_published_entries_get_the_umask_mode(tmp_path, mask, file_mode, dir_mode):
    import tempfile

    import torch

    previous = os.umask(mask)
    try:
        assert umask_mode() == file_mode and umask_mode(directory=True) == dir_mode
        path = write_atomic(tmp_path / "report.md", "text")
        tmp = tempfile.mkdtemp(dir=tmp_path)  # owner-only, as a checkpoint's build directory is
        save_file({"w": torch.zeros(2)}, os.path.join(tmp, "model.safetensors"))  # safetensors writes 0600
        os.mkdir(os.path.join(tmp, "sub"))
        publish(tmp, tmp_path / "published")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == file_mode
    assert stat.S_IMODE((tmp_path / "published").stat().st_mode) == dir_mode
    assert stat.S_IMODE((tmp_path / "published" / "model.safetensors").stat().st_mode) == file_mode
    assert stat.S_IMODE((tmp_path / "published" / "sub").stat().st_mode) == dir_mode


def test_a_write_error_naming_no_file_is_raised_again_naming_the_path(tmp_path):
    with pytest.raises(OSError) as caught, naming_failures(tmp_path / "log.jsonl"):
        raise OSError(errno.ENOSPC, "No space left on device")  # what file.write() raises
    assert caught.value.filename == str(tmp_path / "log.jsonl") and caught.value.errno == errno.ENOSPC
    with pytest.raises(OSError) as caught, naming_failures(tmp_path / "model.safetensors"):
        raise SafetensorError("Error while serializing: I/O error: Disk quota exceeded (os error 122)")
    assert (caught.value.errno, caught.value.filename) == (errno.EDQUOT, str(tmp_path / "model.safetensors"))
    assert storage_failure(caught.value).startswith(f"{tmp_path / 'model.safetensors'}: Disk quota exceeded; ")
    with pytest.raises(SafetensorError), naming_failures(tmp_path / "x"):  # not an OS error: unchanged
        raise SafetensorError("header too large")


def test_only_the_storage_s_errors_become_one_line():
    assert storage_failure(OSError(errno.EROFS, "Read-only file system", "/data/x")) is not None
    assert storage_failure(FileNotFoundError(errno.ENOENT, "No such file or directory", "/x")) is None  # a bug's
