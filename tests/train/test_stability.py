"""Divergence events: the detector on hand-made sequences, and the counters of real training runs
(logged off the interval, right clip rate, continued exactly across a resume)."""

import json
import math

import pytest

from attnres.train import TrainConfig, TrainConfigError, load_run_config, train
from attnres.train.metrics import read_metrics
from attnres.train.stability import (CLIP_RATE_KEY, CLIPPED_STEPS_KEY, COUNTER_KEYS, GRAD_SPIKE, GRAD_SPIKES_KEY,
                                     LOSS_SPIKE, LOSS_SPIKES_KEY, StabilityMonitor, is_grad_spike, is_loss_spike,
                                     loss_spike_threshold, run_totals)

# Hair-trigger settings for real runs: a 2-step window, any loss above the window's median and any
# norm 0.01 % above its median is a spike, so a 12-step run has events on many steps.
HAIR_TRIGGER = dict(stability_window=2, loss_spike_mads=0.0, loss_spike_floor=0.0, grad_spike_ratio=1.0001)


def feed(monitor, losses, grad_norms):
    """Observe each step; returns {step index: its events} for the steps that have any."""
    return {i: events for i, (loss, norm) in enumerate(zip(losses, grad_norms)) if (events := monitor.observe(loss, norm))}


def smooth_losses(n=120):
    """A falling loss curve with small batch noise (a deterministic wiggle of +-0.02 nats)."""
    return [2.5 + 3.0 * math.exp(-i / 30) + 0.02 * math.sin(1.7 * i) for i in range(n)]


def smooth_norms(n=120):
    return [0.5 + 2.0 * math.exp(-i / 40) + 0.05 * math.cos(1.3 * i) for i in range(n)]


# ---------------------------------------------------------------- the detector

def test_a_smooth_run_has_no_events():
    monitor = StabilityMonitor(grad_clip=None)
    assert feed(monitor, smooth_losses(), smooth_norms()) == {}
    assert monitor.counters() == {LOSS_SPIKES_KEY: 0, GRAD_SPIKES_KEY: 0, CLIPPED_STEPS_KEY: 0, CLIP_RATE_KEY: 0.0}


def test_inserted_loss_spikes_are_found_once_each_and_only_after_a_full_window():
    losses = smooth_losses()
    for step in (10, 75, 100):  # 10 is within the first window (20 steps): not looked for
        losses[step] += 0.8
    for step in (40, 41):  # the curve still falls fast here (0.7 nats over the window), which widens its MAD
        losses[step] += 1.5
    monitor = StabilityMonitor(grad_clip=None, window=20)
    events = feed(monitor, losses, smooth_norms())
    # 41 right after 40 is a spike too: the window's median is not moved by the one spike in it, and
    # the steps after each spike are not (their window holds it)
    assert events == {40: [LOSS_SPIKE], 41: [LOSS_SPIKE], 75: [LOSS_SPIKE], 100: [LOSS_SPIKE]}
    assert monitor.loss_spikes == 4 and monitor.grad_spikes == 0


def test_inserted_gradient_norm_spikes_above_the_ratio_are_found():
    norms = smooth_norms()
    norms[30] *= 5.0  # above 3 x the median
    norms[60] *= 2.5  # a jump, but under 3 x: not a spike
    norms[90] *= 4.0
    monitor = StabilityMonitor(grad_clip=None)
    assert feed(monitor, smooth_losses(), norms) == {30: [GRAD_SPIKE], 90: [GRAD_SPIKE]}
    assert monitor.counters()[GRAD_SPIKES_KEY] == 2


def test_both_spikes_on_one_step_are_both_named():
    losses, norms = [3.0] * 25, [1.0] * 25
    losses[22], norms[22] = 4.0, 10.0
    assert feed(StabilityMonitor(window=20), losses, norms) == {22: [LOSS_SPIKE, GRAD_SPIKE]}


def test_loss_rule_uses_median_plus_mads_with_a_floor():
    previous = [3.0, 3.1, 2.9, 3.0, 3.2]  # median 3.0, deviations 0, .1, .1, 0, .2: MAD 0.1
    assert loss_spike_threshold(previous, mads=6.0, floor=0.1) == pytest.approx(3.6)
    assert loss_spike_threshold(previous, mads=0.5, floor=0.1) == pytest.approx(3.1)  # the floor wins
    flat = [3.0] * 20  # MAD 0: only the floor separates noise from a spike
    assert not is_loss_spike(3.05, flat) and is_loss_spike(3.2, flat)
    assert not is_loss_spike(100.0, [])  # nothing to compare with
    assert is_grad_spike(3.1, [1.0, 1.0, 5.0]) and not is_grad_spike(2.9, [1.0, 1.0, 5.0])


def test_clipped_steps_are_those_above_grad_clip():
    monitor = StabilityMonitor(grad_clip=1.0)
    feed(monitor, [3.0] * 6, [0.5, 1.5, 1.0, 2.0, 0.99, 7.0])  # 1.0 itself is not clipped: clipping scales above it
    assert monitor.counters()[CLIPPED_STEPS_KEY] == 3 and monitor.clip_rate == pytest.approx(0.5)
    unclipped = StabilityMonitor(grad_clip=None)
    feed(unclipped, [3.0] * 3, [10.0, 20.0, 30.0])
    assert unclipped.clipped_steps == 0 and unclipped.clip_rate == 0.0


def test_state_dict_through_json_continues_exactly():
    losses, norms = smooth_losses(), smooth_norms()
    for step in (50, 70, 71):
        losses[step] += 1.5
        norms[step + 2] *= 6.0
    whole = StabilityMonitor(grad_clip=1.0)
    expected = feed(whole, losses, norms)
    first = StabilityMonitor(grad_clip=1.0)
    events = feed(first, losses[:51], norms[:51])  # cut right after a spike; a grad spike one step later
    second = StabilityMonitor(grad_clip=1.0)
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    events.update({51 + i: e for i, e in feed(second, losses[51:], norms[51:]).items()})
    assert events == expected and len(expected) == 6
    assert second.counters() == whole.counters()


@pytest.mark.parametrize("overrides, pattern", [
    (dict(stability_window=0), r"TrainConfig.stability_window must be a positive integer, got 0"),
    (dict(loss_spike_mads=-1), r"TrainConfig.loss_spike_mads must be a number >= 0, got -1"),
    (dict(loss_spike_floor="x"), r"TrainConfig.loss_spike_floor must be a number >= 0, got 'x'"),
    (dict(grad_spike_ratio=1.0), r"TrainConfig.grad_spike_ratio must be a number > 1 .*got 1.0"),
])
def test_settings_are_validated_by_name(overrides, pattern):
    with pytest.raises(TrainConfigError, match=pattern):
        TrainConfig(**overrides)


def test_run_totals_read_the_last_record_with_counters():
    assert run_totals([{"step": 1, "loss": 3.0}]) is None  # metrics of a run before events were counted
    records = [{"step": 1, **dict.fromkeys(COUNTER_KEYS, 0)},
               {"step": 2, LOSS_SPIKES_KEY: 1, GRAD_SPIKES_KEY: 2, CLIPPED_STEPS_KEY: 1, CLIP_RATE_KEY: 0.5},
               {"step": 2, "val_loss": 3.0}]
    assert run_totals(records) == {"loss_spikes": 1, "grad_spikes": 2, "clipped_steps": 1, "clip_rate": 0.5,
                                   "steps": 2}


# ---------------------------------------------------------------- real training runs

def test_a_tiny_grad_clip_clips_every_step_and_counters_are_in_every_record(write_config):
    path, run = write_config(steps=6, eval_every=6, checkpoint_every=6, grad_clip=1e-6)
    records = read_metrics(train(load_run_config(path), log=lambda *_: None).run_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r[CLIPPED_STEPS_KEY] for r in records] == [1, 2, 3, 4, 5, 6]
    assert all(r[CLIP_RATE_KEY] == 1.0 for r in records)
    assert run_totals(records)["clip_rate"] == 1.0 and run_totals(records)["steps"] == 6


def test_clipped_steps_match_the_logged_norms(write_config):
    path, run = write_config(steps=8, eval_every=8, checkpoint_every=8, grad_clip=None)
    records = read_metrics(train(load_run_config(path), log=lambda *_: None).run_dir)
    assert records[-1][CLIPPED_STEPS_KEY] == 0 and records[-1][CLIP_RATE_KEY] == 0.0  # nothing to clip at
    clip = sorted(r["grad_norm"] for r in records)[3]  # between the 4th and 5th norm: 4 of 8 steps above it
    path, run = write_config("clipped", steps=8, eval_every=8, checkpoint_every=8, grad_clip=clip)
    records = read_metrics(train(load_run_config(path), log=lambda *_: None).run_dir)
    above = [r["step"] for r in records if r["grad_norm"] > clip]  # the pre-clip norms of this run
    assert records[-1][CLIPPED_STEPS_KEY] == len(above) and 0 < len(above) < 8
    assert records[-1][CLIP_RATE_KEY] == pytest.approx(len(above) / 8)


def test_spike_steps_are_logged_off_the_interval_and_flagged(write_config):
    path, run = write_config(steps=12, log_every=100, eval_every=12, checkpoint_every=12, **HAIR_TRIGGER)
    records = read_metrics(train(load_run_config(path), log=lambda *_: None).run_dir)
    flagged = [r for r in records if "event" in r]
    assert flagged, "hair-trigger settings found no event"
    # without events only step 1 and the last step would be logged: every other record is an event
    assert all("event" in r for r in records if r["step"] not in (1, 12))
    assert set(e for r in flagged for e in r["event"]) <= {LOSS_SPIKE, GRAD_SPIKE}
    assert all(r["step"] > 2 for r in flagged)  # a full window of 2 previous steps first
    last = records[-1]
    assert last[LOSS_SPIKES_KEY] == sum(LOSS_SPIKE in r["event"] for r in flagged)
    assert last[GRAD_SPIKES_KEY] == sum(GRAD_SPIKE in r["event"] for r in flagged)


class Interrupted(Exception):
    pass


def test_resumed_run_counts_the_same_events_as_an_uninterrupted_one(write_config):
    settings = dict(steps=12, eval_every=12, checkpoint_every=4, grad_clip=0.5, **HAIR_TRIGGER)
    path, run = write_config("whole", **settings)
    whole = read_metrics(train(load_run_config(path), log=lambda *_: None).run_dir)

    def stop_at_six(record):
        if record["step"] == 6:
            raise Interrupted

    path, run = write_config("interrupted", **settings)
    with pytest.raises(Interrupted):  # after step 6: the last checkpoint is step 4's
        train(load_run_config(path), log=lambda *_: None, on_step=stop_at_six)
    resumed = read_metrics(train(load_run_config(path), resume=True, log=lambda *_: None).run_dir)

    def events(records):
        return [(r["step"], r["loss"], r.get("event"), *(r[key] for key in COUNTER_KEYS)) for r in records]

    assert events(resumed) == events(whole)
    totals = run_totals(whole)
    assert totals["loss_spikes"] + totals["grad_spikes"] > 0 and run_totals(resumed) == totals
