"""Fuzzing what `attnres compare` and `attnres scaling` read back from disk: a finished run's record file,
reused instead of training again, and then what the report summarisers (`summarize`, `summarize_sweep`)
make of an accepted record (the records are the only part of their input read from disk), starting from
the committed results of results/compare-default and results/scaling (trimmed)."""

import copy
import json
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from attnres.common.config_files import bundled_config_dir
from attnres.common.errors import InputError
from attnres.compare import run_comparison as compare_run
from attnres.report.compare_summary import summarize
from attnres.scaling import sweep as scaling_sweep
from attnres.scaling.summary import summarize_sweep
from attnres.train.run_config import RunConfig
from tests.fuzz.helpers import check_reader, json_garbage, json_keys, json_text, json_values, mostly, mutated, \
    unchanged

ERRORS = (InputError,)
RESULTS = Path(__file__).resolve().parents[2] / "results"
REPLICATES = 8  # bootstrap replicates of the scaling fit: enough to run every path of it


def _trimmed_run(run: dict) -> dict:
    """A record with its curves and depth statistics cut to a few points (the same keys and types)."""
    run = copy.deepcopy(run)
    for key in ("val_curve", "train_curve"):
        if key in run:
            run[key] = run[key][:3]
    for key, value in (run.get("depth_stats") or {}).items():
        if isinstance(value, list):
            run["depth_stats"][key] = value[:3]
    return run


def _compare_results() -> dict:
    results = json.loads((RESULTS / "compare-default" / "results.json").read_text())
    variants = [v for v in results["variants"] if v["residual"] in ("standard", "block_attnres")]
    return {"variants": [{**v, "runs": [_trimmed_run(r) for r in v["runs"][:2]]} for v in variants]}


def _scaling_variants() -> list[dict]:
    results = json.loads((RESULTS / "scaling" / "results.json").read_text())
    return [{**v, "runs": [_trimmed_run(r) for r in v["runs"]]} for v in results["variants"][:2]]


COMPARE = _compare_results()
SCALING = _scaling_variants()
OUT = "@out_dir@"  # the record's run folder, replaced by the temporary folder it is written to
RUN = RunConfig.from_dict({**yaml.safe_load((bundled_config_dir("") / "cpu-tiny.yaml").read_text()), "out_dir": OUT})


def _record_files(record: dict):
    """A record file's text: {"run": settings, "record": record}, either mutated, or not JSON at all."""
    saved = {"run": RUN.to_dict(), "record": record}
    records = st.builds(lambda run, changed: json_text({"run": run, "record": changed}),
                        mostly(saved["run"], mutated(saved["run"], json_values, json_keys)),
                        mutated(record, json_values, json_keys))
    return st.one_of(records, records, mutated(saved, json_values, json_keys).map(json_text),
                     json_values.map(json_text), json_garbage)


def _reuse(directory: Path, name: str, text, keys) -> dict | None:
    run = RunConfig.from_dict({**RUN.to_dict(), "out_dir": str(directory)})
    path = directory / name
    if isinstance(text, str):
        text = text.replace(json.dumps(OUT), json.dumps(str(directory))).encode("utf-8", "surrogatepass")
    path.write_bytes(text)
    with unchanged(directory):
        return check_reader(lambda: compare_run.finished_record(run, name, keys), ERRORS)


@given(data=st.data())
def test_reused_compare_record(data):
    standard = COMPARE["variants"][0]
    text = data.draw(_record_files(standard["runs"][0]))
    with tempfile.TemporaryDirectory() as tmp:
        record = _reuse(Path(tmp), compare_run.RECORD_FILE, text, compare_run.RECORD_KEYS)
    if isinstance(record, dict):  # what `attnres compare` does with a reused record
        check_reader(lambda: f"{record['final_val_loss']:.4f}", ERRORS)
        results = {"variants": [{**standard, "runs": [record]}, COMPARE["variants"][1]]}
        assert isinstance(check_reader(lambda: summarize(results), ERRORS), (dict, InputError))


@given(data=st.data())
def test_reused_scaling_record(data):
    standard = SCALING[0]
    text = data.draw(_record_files(standard["runs"][0]))
    with tempfile.TemporaryDirectory() as tmp:
        record = _reuse(Path(tmp), scaling_sweep.RECORD_FILE, text, scaling_sweep.RECORD_KEYS)
    if isinstance(record, dict):  # what `attnres scaling` does with a reused record
        variants = [{**standard, "runs": [record, *standard["runs"][1:]]}, SCALING[1]]
        result = check_reader(lambda: summarize_sweep(variants, replicates=REPLICATES), ERRORS)
        assert isinstance(result, (dict, InputError))


@pytest.mark.parametrize("module", [compare_run, scaling_sweep], ids=["compare", "scaling"])
def test_committed_records_are_reused(module):
    """The unmutated records pass: the fuzz tests above start from inputs the readers accept."""
    record = (COMPARE["variants"][0] if module is compare_run else SCALING[0])["runs"][0]
    with tempfile.TemporaryDirectory() as tmp:
        text = json.dumps({"run": RUN.to_dict(), "record": record})
        assert _reuse(Path(tmp), module.RECORD_FILE, text, module.RECORD_KEYS) == record
    assert isinstance(summarize(COMPARE), dict) and isinstance(summarize_sweep(SCALING, replicates=REPLICATES), dict)
