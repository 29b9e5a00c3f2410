"""Fixtures of the report tests: two tiny trained runs that `attnres analyze` reads (shared by the
analyze tests and the browser test, so they are trained once per session)."""

import pytest
import yaml

from attnres.train import load_run_config, train
from tests.train.conftest import corpus_dir, tiny_run  # noqa: F401  (corpus_dir is a fixture)


@pytest.fixture(scope="session")
def runs(tmp_path_factory, corpus_dir):  # noqa: F811
    """Two 2-layer runs of 6 steps on the tiny corpus, with their own data cache; yields (root, run dirs)."""
    root = tmp_path_factory.mktemp("analyze")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNRES_CACHE", str(root / "cache"))
        dirs = {}
        for residual, blocks in (("block_attnres", 2), ("standard", None)):
            run = tiny_run(corpus_dir, root / residual, steps=6, eval_every=3, checkpoint_every=3)
            run["model"].update(residual=residual, num_blocks=blocks)
            path = root / f"{residual}.yaml"
            path.write_text(yaml.safe_dump(run))
            dirs[residual] = train(load_run_config(path), log=lambda *_: None).run_dir
        yield root, dirs


@pytest.fixture
def cache(runs, monkeypatch):
    monkeypatch.setenv("ATTNRES_CACHE", str(runs[0] / "cache"))
