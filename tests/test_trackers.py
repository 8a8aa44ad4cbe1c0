"""Trackers: ``report_to: tensorboard`` works in training and writes event files with the step's metrics."""

from __future__ import annotations

import gc

import pytest
from _train_script import build_trainer

pytestmark = pytest.mark.slow


def test_report_to_tensorboard_writes_event_files(tiny_model_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from t2s.training.pipeline import fit

    trainer, _ = build_trainer(tiny_model_dir, tmp_path / "run", max_steps=1, report_to="tensorboard")
    fit(trainer, {"rows": 4})
    del trainer
    gc.collect()

    events = sorted((tmp_path / "run").rglob("events.out.tfevents.*"))
    assert events, "report_to tensorboard writes event files under output_dir"
    rewards, tags = [], set()
    for folder in {path.parent for path in events}:
        accumulator = EventAccumulator(str(folder))
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
        if "train/reward" in accumulator.Tags()["scalars"]:
            rewards += accumulator.Scalars("train/reward")
    assert {"train/loss", "train/reward", "train/kl", "train/beta", "train/episodes/turns_mean"} <= tags, sorted(tags)
    # one logged step; the scripted rewards are 0, 1, 2, 3 in each group of 4
    assert [(event.step, event.value) for event in rewards] == [(1, pytest.approx(1.5))]
