"""attnres.common.run_options: a job's --out, --seeds and --shard, refused before any work, naming the flag."""

import os

import pytest

from attnres.common.errors import InputError
from attnres.common.run_options import check_out_dir, check_run_options, parse_shard


def test_an_out_that_is_a_file_is_refused_and_a_missing_or_existing_folder_is_fine(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match=r"--out \S*file is a file, not a folder"):
        check_out_dir(tmp_path / "file")
    check_out_dir(tmp_path)
    check_out_dir(tmp_path / "new")


def test_an_out_inside_a_file_or_through_a_dangling_symlink_is_refused_and_nothing_is_created(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match=r"--out \S*file/run cannot be created: \S*file is a file, not a folder"):
        check_out_dir(tmp_path / "file" / "run")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    with pytest.raises(InputError, match=r"--out \S*dangling is a symlink to \S*gone, which does not exist"):
        check_out_dir(tmp_path / "dangling")
    with pytest.raises(InputError, match=r"out_dir \S*dangling/run cannot be created: \S*dangling is a symlink"):
        check_out_dir(tmp_path / "dangling" / "run", "out_dir")
    (tmp_path / "empty").mkdir()
    (tmp_path / "to-empty").symlink_to(tmp_path / "empty")
    check_out_dir(tmp_path / "to-empty")  # a symlink to a folder is that folder
    check_out_dir(tmp_path / "to-empty" / "a" / "b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "empty", "file", "to-empty"]
    assert not any((tmp_path / "empty").iterdir())


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_out_is_refused(tmp_path):
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o555)
    try:
        with pytest.raises(InputError, match=r"--out \S*ro/run is not writable by this user \(it would be created"):
            check_out_dir(tmp_path / "ro" / "run")
    finally:
        (tmp_path / "ro").chmod(0o755)


def test_seeds_must_be_a_positive_integer_or_the_presets(tmp_path):
    check_run_options(tmp_path, None)
    check_run_options(tmp_path, 3)
    with pytest.raises(InputError, match="--seeds"):
        check_run_options(tmp_path, 0)


@pytest.mark.parametrize("text, expected", [(None, (0, 1)), ("0/2", (0, 2)), ("3/4", (3, 4))])
def test_a_shard_is_index_over_count(text, expected):
    assert parse_shard(text) == expected


@pytest.mark.parametrize("text", ["2/2", "-1/2", "1", "a/b", "1/2/3", "0/0"])
def test_a_bad_shard_is_refused_with_an_example(text):
    with pytest.raises(InputError, match=r"--shard must be I/N with 0 <= I < N, e\.g\. 0/2"):
        parse_shard(text)
