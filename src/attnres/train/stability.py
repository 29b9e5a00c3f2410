"""Divergence events of a training run: loss spikes, gradient-norm spikes and clipped steps.

Small CPU runs are chaotic (two CPUs gave one run losses 0.45 nats apart), and what sends two runs
apart is a few events in their training: a batch whose loss jumps, a gradient far larger than its
neighbours, clipping that rescales most steps. `StabilityMonitor` sees every optimizer step's
training loss and pre-clip global gradient norm and counts them:

- **clipped step**: grad_norm > grad_clip (never when grad_clip is None; clip rate is then 0.0);
- **loss spike**: loss > median(L) + max(k * MAD(L), floor), where L are the previous W steps'
  losses and MAD(L) = median(|l - median(L)|);
- **gradient-norm spike**: grad_norm > r * median(G), G the previous W steps' gradient norms.

Spikes are looked for only once W previous steps exist (before that a "median of the previous
steps" is a handful of warm-up values). Why these rules: the median and the MAD are not moved by one
earlier spike in the window (a mean and standard deviation are, and would hide the next spike), and
both tests are one-sided, so the fast fall of the loss early in training is never an event. With
Gaussian batch noise 1.4826 MAD estimates the standard deviation, so the default k = 6 is about
4 sigma: ordinary batch-to-batch variation stays below it. Where the loss still falls fast (early
in a run) the window's spread includes that fall, so a spike there has to clear it too: the rule
errs towards missing a spike there rather than calling noise one. The floor (0.1 nats) keeps a very flat
window (MAD near 0, late in a run) from calling a rise of a few hundredths of a nat a spike. The
gradient norm changes by large factors over a run, so its spike is a ratio to the median; r = 3
(a tripled norm) is well above ordinary step-to-step variation.
The defaults are TrainConfig's `stability_window`, `loss_spike_mads`, `loss_spike_floor` and
`grad_spike_ratio` (docs/how-to/train.md).

    monitor = StabilityMonitor(grad_clip=1.0)
    events = monitor.observe(loss=3.2, grad_norm=0.8)   # e.g. [] or ["loss_spike"]
    monitor.counters()   # {"events/loss_spikes": 0, ..., "events/clip_rate": 0.0}

The counters are cumulative over the run; `state_dict` / `load_state_dict` carry them and the
window across a resume (the trainer keeps them in each checkpoint), so a resumed run counts what
an uninterrupted one does.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence

from attnres.common.checks import check_int, is_number
from attnres.common.errors import InputError

DEFAULT_WINDOW = 20
DEFAULT_LOSS_SPIKE_MADS = 6.0
DEFAULT_LOSS_SPIKE_FLOOR = 0.1  # nats
DEFAULT_GRAD_SPIKE_RATIO = 3.0

LOSS_SPIKE, GRAD_SPIKE = "loss_spike", "grad_spike"  # the names in a metrics record's "event" list
LOSS_SPIKES_KEY, GRAD_SPIKES_KEY = "events/loss_spikes", "events/grad_spikes"
CLIPPED_STEPS_KEY, CLIP_RATE_KEY = "events/clipped_steps", "events/clip_rate"
COUNTER_KEYS = (LOSS_SPIKES_KEY, GRAD_SPIKES_KEY, CLIPPED_STEPS_KEY, CLIP_RATE_KEY)


def check_stability_settings(window: object, loss_spike_mads: object, loss_spike_floor: object,
                             grad_spike_ratio: object, *, prefix: str = "", error: type[Exception] = InputError
                             ) -> None:
    """Raise `error` naming the setting (`prefix` + its name) unless the window is a positive integer,
    loss_spike_mads and loss_spike_floor numbers >= 0 and grad_spike_ratio a number > 1."""
    check_int(window, f"{prefix}stability_window", error=error)
    for name, value in (("loss_spike_mads", loss_spike_mads), ("loss_spike_floor", loss_spike_floor)):
        if not is_number(value) or not value >= 0:
            raise error(f"{prefix}{name} must be a number >= 0, got {value!r}")
    if not is_number(grad_spike_ratio) or not grad_spike_ratio > 1:
        raise error(f"{prefix}grad_spike_ratio must be a number > 1 (a multiple of the median gradient norm), "
                    f"got {grad_spike_ratio!r}")


def loss_spike_threshold(previous: Sequence[float], mads: float, floor: float) -> float:
    """The loss above which a step is a loss spike: median + max(mads * MAD, floor) of `previous`
    (the earlier steps' losses, at least one)."""
    middle = statistics.median(previous)
    spread = statistics.median(abs(value - middle) for value in previous)
    return middle + max(mads * spread, floor)


def is_loss_spike(loss: float, previous: Sequence[float], mads: float = DEFAULT_LOSS_SPIKE_MADS,
                  floor: float = DEFAULT_LOSS_SPIKE_FLOOR) -> bool:
    """Whether `loss` is above `loss_spike_threshold(previous, mads, floor)`; False with no previous steps."""
    return bool(previous) and loss > loss_spike_threshold(previous, mads, floor)


def is_grad_spike(grad_norm: float, previous: Sequence[float], ratio: float = DEFAULT_GRAD_SPIKE_RATIO) -> bool:
    """Whether `grad_norm` is above `ratio` x the median of `previous` (earlier steps' norms); False with none."""
    return bool(previous) and grad_norm > ratio * statistics.median(previous)


class StabilityMonitor:
    """Counts clipped steps, loss spikes and gradient-norm spikes over a run, one `observe` per step.

    grad_clip: the run's clipping threshold (None: no clipping, so no clipped steps); window: W, the
    number of previous steps a spike is measured against (spikes only from step W + 1 on); mads,
    floor: the loss rule's k and floor; grad_ratio: the gradient-norm rule's r (module docstring).
    """

    def __init__(self, grad_clip: float | None = None, window: int = DEFAULT_WINDOW,
                 mads: float = DEFAULT_LOSS_SPIKE_MADS, floor: float = DEFAULT_LOSS_SPIKE_FLOOR,
                 grad_ratio: float = DEFAULT_GRAD_SPIKE_RATIO) -> None:
        check_stability_settings(window, mads, floor, grad_ratio)
        self.grad_clip, self.window, self.mads, self.floor, self.grad_ratio = grad_clip, window, mads, floor, grad_ratio
        self.losses: deque[float] = deque(maxlen=window)
        self.grad_norms: deque[float] = deque(maxlen=window)
        self.steps = self.loss_spikes = self.grad_spikes = self.clipped_steps = 0

    def observe(self, loss: float, grad_norm: float) -> list[str]:
        """Count one optimizer step (its training loss and pre-clip gradient norm, finite floats); returns
        its spike events, a list of LOSS_SPIKE and/or GRAD_SPIKE (empty for an ordinary step). A
        clipped step is counted, not returned: with the default grad_clip most early steps are clipped."""
        events = []
        if len(self.losses) == self.window:  # a full window of previous steps
            if is_loss_spike(loss, self.losses, self.mads, self.floor):
                events.append(LOSS_SPIKE)
            if is_grad_spike(grad_norm, self.grad_norms, self.grad_ratio):
                events.append(GRAD_SPIKE)
        self.steps += 1
        self.loss_spikes += LOSS_SPIKE in events
        self.grad_spikes += GRAD_SPIKE in events
        self.clipped_steps += int(self.grad_clip is not None and grad_norm > self.grad_clip)
        self.losses.append(float(loss))
        self.grad_norms.append(float(grad_norm))
        return events

    @property
    def clip_rate(self) -> float:
        """Clipped steps / steps so far (0.0 before the first step)."""
        return self.clipped_steps / self.steps if self.steps else 0.0

    def counters(self) -> dict[str, int | float]:
        """The cumulative counters under their metrics keys (COUNTER_KEYS), for every metrics record."""
        return {LOSS_SPIKES_KEY: self.loss_spikes, GRAD_SPIKES_KEY: self.grad_spikes,
                CLIPPED_STEPS_KEY: self.clipped_steps, CLIP_RATE_KEY: self.clip_rate}

    def state_dict(self) -> dict:
        """Counters and window as a JSON-safe dict (kept in a checkpoint's trainer state)."""
        return {"steps": self.steps, "loss_spikes": self.loss_spikes, "grad_spikes": self.grad_spikes,
                "clipped_steps": self.clipped_steps, "losses": list(self.losses), "grad_norms": list(self.grad_norms)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state_dict()`'s output; a window longer than this monitor's keeps its newest steps."""
        self.steps, self.loss_spikes = int(state["steps"]), int(state["loss_spikes"])
        self.grad_spikes, self.clipped_steps = int(state["grad_spikes"]), int(state["clipped_steps"])
        self.losses = deque((float(v) for v in state["losses"]), maxlen=self.window)
        self.grad_norms = deque((float(v) for v in state["grad_norms"]), maxlen=self.window)


def run_totals(records: Sequence[dict]) -> dict | None:
    """A run's totals from its metrics records (`read_metrics`): {"loss_spikes", "grad_spikes",
    "clipped_steps" (ints), "clip_rate" (float), "steps"} from the last record that holds the counters;
    None when none does (a run logged before they were counted)."""
    last = next((r for r in reversed(records) if all(key in r for key in COUNTER_KEYS)), None)
    if last is None:
        return None
    return {"loss_spikes": last[LOSS_SPIKES_KEY], "grad_spikes": last[GRAD_SPIKES_KEY],
            "clipped_steps": last[CLIPPED_STEPS_KEY], "clip_rate": last[CLIP_RATE_KEY], "steps": last.get("step")}
