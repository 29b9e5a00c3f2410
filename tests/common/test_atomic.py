"""Atomic publication gives published files and directories the mode the umask gives new ones."""

import os
import stat

import pytest
from safetensors.torch import save_file

from attnres.common.atomic import publish, umask_mode, write_atomic


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
