"""The protocol's equal-time arms (docs/explanation/protocol.md, "Equal time"), written as presets from the main
study's committed results: one per primary variant that meets the headline rule's first condition, standard
alone at its fitted rate for round(c x the main steps), c the variant's training-step ratio from the study's
own cost measurement, which must be the protocol's (one thread, 11 rounds or more).

    python -m tools.studies.equal_time [--results results/protocol-dense] [--force]

prints what it decided and writes src/attnres/configs/compare/protocol_equal_time_<variant>.yaml; then
`tools/studies/protocol.sh protocol_equal_time_<variant>` trains each arm."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from attnres.analysis.contrasts import paired_differences
from attnres.compare.headline import PRIMARY, Evidence, draw_headline
from attnres.report.compare_summary import cost_summary

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "src" / "attnres" / "configs" / "compare"
MAIN_PRESET = "protocol_dense"
PROTOCOL_REPEATS = 11  # the protocol's measurement: 11 interleaved rounds on one thread of an idle machine


def arms(results: dict) -> dict[str, float]:
    """Variant name -> c, for each primary variant whose main contrast survives Holm's correction with a
    negative mean. Raises ValueError where the cost measurement is not the protocol's."""
    cost = results.get("cost") or {}
    settings, machine = cost.get("settings") or {}, cost.get("machine") or {}
    if settings.get("repeats", 0) < PROTOCOL_REPEATS or machine.get("threads") != 1:
        raise ValueError(f"the cost measurement has {settings.get('repeats')} rounds on {machine.get('threads')} "
                         f"thread(s); the protocol's c needs {PROTOCOL_REPEATS} or more on one: OMP_NUM_THREADS=1 "
                         f"attnres compare --preset {MAIN_PRESET} --out results/protocol-dense --set cost.repeats=11")
    headline = draw_headline(Evidence(main=paired_differences(results, PRIMARY)))
    names = {v["residual"]: v["name"] for v in results["variants"]}
    base = names["standard"]
    out = {}
    for residual, verdict in headline.verdicts.items():
        if verdict.survives:
            ratio = cost_summary(cost, names[residual], base)["step_time_ratio"]
            if ratio is None:
                raise ValueError(f"the cost measurement has no training step for {names[residual]}")
            out[residual] = ratio
    return out


def arm_preset(main: dict, residual: str, c: float, results_folder: str) -> dict:
    """The preset of `residual`'s arm: the main preset's run, standard only, round(c x steps) steps."""
    run = json.loads(json.dumps(main["run"]))
    steps = round(c * run["train"]["steps"])
    run["train"]["steps"] = steps
    return {"description": f"the protocol's equal-time arm of {residual}: standard for {steps} steps ({c:.3f} x "
                           f"{main['run']['train']['steps']}, {residual}'s training-step cost), its fitted rate, "
                           f"the main setting's final seeds",
            "rates_from": results_folder, "seed_start": main["protocol"]["final_seed_start"], "seeds": main["seeds"],
            "variants": [{"residual": "standard"}], "run": run}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default="results/protocol-dense", help="the main study's folder")
    parser.add_argument("--force", action="store_true", help="replace presets already written")
    args = parser.parse_args(argv)
    results = json.loads((Path(args.results) / "results.json").read_text())
    main_preset = yaml.safe_load((PRESETS / f"{MAIN_PRESET}.yaml").read_text())
    found = arms(results)
    if not found:
        print("no primary contrast survives Holm's correction with a negative mean: the protocol runs no "
              "equal-time arm")
    for residual, c in found.items():
        path = PRESETS / f"protocol_equal_time_{residual}.yaml"
        if path.exists() and not args.force:
            raise SystemExit(f"{path} exists; pass --force to replace it")
        preset = arm_preset(main_preset, residual, c, args.results)
        header = (f"# Written by `python -m tools.studies.equal_time` from {args.results}/results.json (docs/"
                  f"explanation/protocol.md, 'Equal time'): c = {c:.4f}.\n")
        path.write_text(header + yaml.safe_dump(preset, sort_keys=False))
        print(f"{residual}: c = {c:.4f}, standard trains {preset['run']['train']['steps']} steps -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
