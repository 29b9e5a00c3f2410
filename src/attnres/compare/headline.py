"""The headline rule of the protocol (docs/explanation/protocol.md, "The headline rule").

A primary variant is recommended over standard only if all three hold:
1. its main-setting contrast (paired t test of test loss, variant minus standard) survives Holm's
   correction over the primary contrasts, with a negative mean;
2. its mean difference is negative in every replication, and the random-effects pooled interval over
   the settings (Hartung-Knapp) lies below 0;
3. its equal-time contrast has a negative mean (a missing arm fails this).
Otherwise no variant is recommended, and the headline says where each one leads.

`draw_headline` applies the rule to differences that `attnres.analysis.contrasts.paired_differences`
reads from each setting's results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from attnres.analysis.contrasts import paired_differences
from attnres.analysis.inference import PairedTest, Pooled, best_by_paired_comparisons, holm, paired_t, random_effects
from attnres.analysis.intervals import mean

ALPHA = 0.05
MAIN = "main"
PRIMARY = ("block_attnres", "hyper_connections", "delta_block")  # docs/explanation/protocol.md, besides standard
PROTOCOL_COMMAND = "tools/studies/protocol.sh protocol_dense"


@dataclass(frozen=True)
class Evidence:
    """The rule's inputs, per primary variant (residual name, standard excluded): `main` and each
    replication's per-seed differences to standard (setting -> variant -> diffs); `equal_time` the
    differences to standard trained as long as the variant's step costs; `step_cost` its training-step
    multiple of standard's, which orders variants that pass together."""

    main: dict[str, list[float]]
    replications: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    equal_time: dict[str, list[float]] = field(default_factory=dict)
    step_cost: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """One primary variant under the rule: its main test, Holm-adjusted p, replication means, pooled
    effect, equal-time mean, and which of the three conditions hold."""

    variant: str
    main: PairedTest | None
    holm_p: float | None
    replication_means: dict[str, float]
    pooled: Pooled | None
    equal_time_mean: float | None
    survives: bool
    replicates: bool
    holds_at_equal_time: bool

    @property
    def recommended(self) -> bool:
        return self.survives and self.replicates and self.holds_at_equal_time


@dataclass(frozen=True)
class Headline:
    """recommended: the variants the rule recommends, best first; verdicts by variant; leads: per setting with
    differences, the variant (or "standard") with the lowest mean loss; best_shown: whether the first recommended one
    is shown better than the others it passed with."""

    recommended: list[str]
    verdicts: dict[str, Verdict]
    leads: dict[str, str]
    best_shown: bool


def _test(diffs) -> PairedTest | None:
    return paired_t(diffs) if len(diffs) >= 2 and len(set(diffs)) > 1 else None


def draw_headline(evidence: Evidence, alpha: float = ALPHA) -> Headline:
    """Apply the rule to `evidence`: which primary variants are recommended over standard, and why."""
    tests = {v: _test(d) for v, d in evidence.main.items()}
    adjusted = holm({v: t.p_two_sided for v, t in tests.items() if t is not None}, alpha=alpha).adjusted \
        if any(t is not None for t in tests.values()) else {}
    verdicts = {}
    for variant, test in tests.items():
        holm_p = adjusted.get(variant)
        survives = test is not None and test.mean < 0 and holm_p is not None and holm_p <= alpha
        means = {s: mean(d[variant]) for s, d in evidence.replications.items() if d.get(variant)}
        settings = [evidence.main[variant]] + [d[variant] for d in evidence.replications.values() if d.get(variant)]
        pooled = None
        if len(settings) >= 2 and all(len(d) >= 2 and len(set(d)) > 1 for d in settings):
            pooled = random_effects([mean(d) for d in settings], [paired_t(d).se ** 2 for d in settings])
        replicates = (len(means) == len(evidence.replications) > 0 and all(m < 0 for m in means.values())
                      and pooled is not None and pooled.ci_hk[1] < 0)
        equal = evidence.equal_time.get(variant)
        equal_mean = mean(equal) if equal else None
        verdicts[variant] = Verdict(variant, test, holm_p, means, pooled, equal_mean, survives, replicates,
                                    equal_mean is not None and equal_mean < 0)
    passing = [v for v, verdict in verdicts.items() if verdict.recommended]
    best_shown = False
    if len(passing) > 1:
        best = best_by_paired_comparisons({v: evidence.main[v] for v in passing}, alpha=alpha)
        best_shown = best.shown_best
        rest = sorted((v for v in passing if v != best.candidate or not best_shown),
                      key=lambda v: evidence.step_cost.get(v, math.inf))
        passing = [best.candidate] + rest if best_shown else rest
    settings = {MAIN: evidence.main, **evidence.replications}
    leads = {}
    for setting, diffs in settings.items():
        means = {v: mean(d) for v, d in diffs.items() if d}
        if means:  # a replication not yet run leads nowhere
            best_variant = min(means, key=means.get)
            leads[setting] = best_variant if means[best_variant] < 0 else "standard"
    return Headline(passing, verdicts, leads, best_shown or len(passing) == 1)


def comparison_headline(results: dict) -> dict | None:
    """The rule applied to one comparison's own runs (`attnres compare` without a protocol), as plain data for
    its report: {"seeds", "loss" (the key compared: test loss where every run has one, else validation),
    "survives": the primary variants better than standard after Holm's correction, "recommended" (always
    empty: one comparison has no replication and no equal-time arm), "protocol": the command that runs it}.
    None where the comparison holds no primary contrast (no standard, or no primary variant beside it)."""
    if "standard" not in {v["residual"] for v in results["variants"]}:
        return None
    runs = [r for v in results["variants"] for r in v["runs"]]
    key = "final_test_loss" if runs and all("final_test_loss" in r for r in runs) else "final_val_loss"
    diffs = paired_differences(results, PRIMARY, key=key)
    if not diffs:
        return None
    seeds = min((len(d) for d in diffs.values()), default=0)
    headline = draw_headline(Evidence(main=diffs)) if seeds >= 2 else None
    survives = [] if headline is None else [v for v, verdict in headline.verdicts.items() if verdict.survives]
    return {"seeds": seeds, "loss": key, "survives": survives,
            "recommended": [] if headline is None else headline.recommended, "protocol": PROTOCOL_COMMAND}
