"""The reference pages list what the code has: every config field, every variant, every command."""

import dataclasses
import re
from pathlib import Path

import pytest

from attnres.data import DataConfig
from attnres.model import ModelConfig, MoEConfig
from attnres.model.attention_config import KDAConfig, MLAConfig
from tools.pages.cli_help import subparsers
from tools.pages.markers import find_blocks
from attnres.residual import VARIANTS
from attnres.train import RunConfig, TrainConfig
from attnres.train.train_config import PipelineSettings

REFERENCE = Path(__file__).resolve().parents[3] / "docs" / "reference"


def documented_fields(page: str, heading: str) -> list[str]:
    """The backticked names in the first column of the tables under `## heading`."""
    section = re.split(r"^## ", (REFERENCE / page).read_text(), flags=re.MULTILINE)
    text = next(s for s in section if s.startswith(heading + "\n"))
    return re.findall(r"^\| `([a-z_0-9]+)` \|", text, flags=re.MULTILINE)


@pytest.mark.parametrize("config, page", [(ModelConfig, "config.md"), (MoEConfig, "kimi-linear.md"),
                                          (MLAConfig, "kimi-linear.md"), (KDAConfig, "kimi-linear.md"),
                                          (DataConfig, "config.md"), (TrainConfig, "config.md"),
                                          (RunConfig, "config.md"), (PipelineSettings, "config.md")])
def test_every_config_field_is_documented_once(config, page):
    fields = [f.name for f in dataclasses.fields(config)]
    documented = documented_fields(page, config.__name__)
    assert sorted(documented) == sorted(fields)


def test_every_variant_is_in_the_variant_table():
    text = (REFERENCE / "variants.md").read_text()
    missing = [name for name in VARIANTS if f"`{name}`" not in text]
    assert not missing


def test_every_command_has_its_generated_help():
    names = {b.name for page in ("cli.md", "cli-experiments.md") for b in find_blocks((REFERENCE / page).read_text())}
    assert names == {f"cli-{name}" for name in subparsers()}
