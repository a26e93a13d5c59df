"""The GRPO entropy brake (config ``entropy_brake``) and the format penalty."""

from __future__ import annotations

import pytest


class _Sched:
    """A stand-in LR scheduler: only ``base_lrs`` (what the brake changes and checkpoints keep)."""

    def __init__(self, lr):
        self.base_lrs = [lr, lr]


class _Args:
    learning_rate = 5e-5


class _State:
    def __init__(self):
        self.global_step = 0


def _feed(brake, entropies, sched):
    state, logs_out = _State(), []
    for i, e in enumerate(entropies, start=1):
        state.global_step = i
        logs = {"entropy": e}
        brake.on_log(_Args(), state, None, logs=logs, lr_scheduler=sched)
        logs_out.append(logs["entropy_brake/lr_scale"])
    return logs_out


def test_brake_engages_below_the_floor_once_per_window_and_stops_at_min_scale():
    from drgym.training.callbacks import EntropyBrake

    brake = EntropyBrake(floor=0.3, window=3, factor=0.5, min_scale=0.25)
    sched = _Sched(5e-5)
    scales = _feed(brake, [0.9, 0.8, 0.7, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2], sched)
    # mean of the last 3 falls under 0.3 at step 6; then once per 3 steps down to 0.25
    assert scales[:5] == [1.0] * 5
    assert scales[5] == 0.5 and scales[8] == 0.25 and scales[-1] == 0.25
    assert sched.base_lrs == [pytest.approx(5e-5 * 0.25)] * 2
    assert [e["step"] for e in brake.engagements] == [6, 9]
    # a scheduler restored from a checkpoint keeps the scale: a new brake reads it back
    again = EntropyBrake(floor=0.3, window=3)
    assert _feed(again, [0.9], sched) == [0.25]


def test_brake_ignores_steps_without_a_forward_pass():
    """A step whose groups were all zero-variance logs entropy 0 (no forward pass): not a collapse."""
    from drgym.training.callbacks import EntropyBrake

    brake, sched, state = EntropyBrake(floor=0.3, window=2), _Sched(5e-5), _State()
    for i, (e, f) in enumerate([(0.5, 0.0), (0.0, 1.0), (0.0, 1.0), (0.4, 0.5)], start=1):
        state.global_step = i
        brake.on_log(_Args(), state, None, logs={"entropy": e, "zero_variance/filtered_frac": f}, lr_scheduler=sched)
    assert sched.base_lrs == [5e-5, 5e-5] and not brake.engagements


def test_brake_stays_off_while_entropy_holds():
    from drgym.training.callbacks import EntropyBrake

    sched = _Sched(5e-5)
    assert set(_feed(EntropyBrake(floor=0.3, window=2), [0.5, 0.4, 0.31, 0.9, 0.35], sched)) == {1.0}
    assert sched.base_lrs == [5e-5, 5e-5]


@pytest.mark.parametrize("bad", [{"floor": 0}, {"floor": 0.3, "factor": 1.5}, {"floor": 0.3, "window": 0},
                                 {"floor": "x"}, {"floor": 0.3, "ceiling": 1.0}])
def test_brake_config_is_checked(bad):
    from drgym.errors import ConfigError
    from drgym.training.config import load_config

    with pytest.raises(ConfigError, match="entropy_brake"):
        load_config("smollm2_answerable_cpu", {"entropy_brake": bad})


def test_format_penalty_never_pays():
    from drgym.errors import ConfigError
    from drgym.records import Episode, Task
    from drgym.rewards.qa import FormatReward

    eps = [Episode(Task("t", "q", ["x"]), "Paris"), Episode(Task("t", "q", ["x"]), "...")]
    assert FormatReward(mode="penalty").score(eps).scores == [0.0, -1.0]
    assert FormatReward().score(eps).scores == [1.0, 0.0]
    with pytest.raises(ConfigError, match="mode"):
        FormatReward(mode="reward")
