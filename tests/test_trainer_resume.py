"""Resuming from checkpoints a real training run wrote, then damaged: ``latest`` passes over incomplete ones, and β
comes back from the controller file, else from the logged history, with a warning."""

from __future__ import annotations

import json
import logging
import re
import shutil
import zipfile

import pytest

from _train_script import build_trainer, make_config
from t2s.training.checkpoints import checkpoint_problem
from t2s.training.configs import ConfigError
from t2s.settings import RECIPES_DIR
from t2s.training.pipeline import resume_checkpoint
from t2s.training.checkpoints import KL_STATE_FILE, restored_beta

pytestmark = pytest.mark.slow

# β moves every step (KL far above target), so a restored β is told apart from the initial 0.01.
RUN = dict(learning_rate=1e-2, target_kl=1e-9, kl_horizon=8, beta=0.01, save_strategy="steps", save_steps=1)


def _betas(trainer) -> list[float]:
    return [entry["beta"] for entry in trainer.state.log_history if "beta" in entry]


@pytest.fixture(scope="module")
def finished_run(tiny_model_dir, tmp_path_factory):
    """A real 3-step run saving checkpoint-1..3, and the β it logged after each step."""
    output = tmp_path_factory.mktemp("run") / "out"
    trainer, _ = build_trainer(tiny_model_dir, output, max_steps=3, **RUN)
    trainer.train()
    for step in (1, 2, 3):
        assert checkpoint_problem(output / f"checkpoint-{step}") is None
    return output, _betas(trainer)


@pytest.fixture
def run_copy(finished_run, tmp_path):
    output, betas = finished_run
    copy = tmp_path / "out"
    shutil.copytree(output, copy)
    return copy, betas


def _truncate(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _zip_without_pickle(path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/readme.txt", "a zip, but no torch.save file")


def _edit_state(checkpoint, **changes) -> None:
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    (checkpoint / "trainer_state.json").write_text(json.dumps({**state, **changes}))


DAMAGE = {
    "no trainer_state": (lambda c: (c / "trainer_state.json").unlink(), "trainer_state.json is missing"),
    "no weights": (lambda c: (c / "model.safetensors").unlink(), "no model weights"),
    "no optimizer": (lambda c: (c / "optimizer.pt").unlink(), "no optimizer state"),
    "no scheduler": (lambda c: (c / "scheduler.pt").unlink(), "no scheduler state"),
    "cut weights": (lambda c: _truncate(c / "model.safetensors"), "model.safetensors is cut off"),
    "cut optimizer": (lambda c: _truncate(c / "optimizer.pt"), "optimizer.pt is cut off"),
    "cut trainer_state": (lambda c: _truncate(c / "trainer_state.json"), "trainer_state.json is unreadable"),
    # files HF Trainer would hand to torch.load, and fail in with a traceback
    "garbage optimizer": (lambda c: (c / "optimizer.pt").write_bytes(b"not a torch file\n" * 64),
                          "optimizer.pt is not a torch file"),
    "garbage rng state": (lambda c: (c / "rng_state.pth").write_bytes(bytes(range(256))),
                          "rng_state.pth is not a torch file"),
    "zip optimizer": (lambda c: _zip_without_pickle(c / "optimizer.pt"),
                      "optimizer.pt is not a torch file: a zip archive without data.pkl"),
    # a state the trainer would take up and carry on from wrongly: steps logged from -6, or a crash after a step
    "negative step": (lambda c: _edit_state(c, global_step=-7), "trainer_state.json has a negative global_step (-7)"),
    "log_history text": (lambda c: _edit_state(c, log_history="oops"),
                         "trainer_state.json has a log_history that is not a list"),
}



@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_latest_passes_over_an_incomplete_newest_checkpoint_with_one_warning(run_copy, damage, caplog):
    output, _ = run_copy
    spoil, problem = DAMAGE[damage]
    spoil(output / "checkpoint-3")
    assert problem in checkpoint_problem(output / "checkpoint-3")
    with caplog.at_level(logging.WARNING, logger="t2s.training.pipeline"):
        found = resume_checkpoint(make_config(output, resume_from_checkpoint="latest"))
    assert found == str(output / "checkpoint-2")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "checkpoint-3" in warnings[0] and "checkpoint-2" in warnings[0] and problem in warnings[0]
    # a folder named explicitly is refused with its reason instead of failing inside HF Trainer
    with pytest.raises(ConfigError, match=re.escape(f"cannot be resumed: {problem}")):
        resume_checkpoint(make_config(output, resume_from_checkpoint=str(output / "checkpoint-3")))


@pytest.mark.parametrize("damage", ["no trainer_state", "cut weights"])
def test_training_resumes_from_the_complete_checkpoint(tiny_model_dir, finished_run, run_copy, damage):
    output, betas = run_copy
    DAMAGE[damage][0](output / "checkpoint-3")
    args_checkpoint = resume_checkpoint(make_config(output, resume_from_checkpoint="latest"))
    trainer, runner = build_trainer(tiny_model_dir, output, max_steps=3, **RUN)
    trainer.train(resume_from_checkpoint=args_checkpoint)
    assert trainer.state.global_step == 3 and len(runner.seen) == 1  # step 3 trained again, steps 1-2 restored
    assert _betas(trainer) == pytest.approx(betas, rel=1e-9)
    # metrics.jsonl holds each step once: the lines the first run wrote after checkpoint-2 gave way to the resumed ones
    assert _logged_steps(output) == _logged_steps(finished_run[0]) == [1, 2, 3, 3]  # the last: the run's summary
    assert ["train_runtime" in line for line in _logged(output)] == [False, False, False, True]


def _logged(output) -> list[dict]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


def _logged_steps(output) -> list[int]:
    return [line["step"] for line in _logged(output)]


def test_a_fresh_run_starts_its_metrics_file_afresh_and_train_refuses_a_used_folder(tiny_model_dir, run_copy,
                                                                                       capsys):
    from t2s.commands import main

    output, _ = run_copy
    with (output / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 0, "eval_loss": 1.0}\n{"step": 7, "loss": 0.')  # a line a crash cut off
    (output / "train_summary.json").write_text("{}")  # as `train` writes at the end of a run
    for name in ("checkpoint-1", "checkpoint-2", "checkpoint-3", "train_summary.json"):
        with pytest.raises(ConfigError, match="already holds a training run") as refused:
            resume_checkpoint(make_config(output))  # what `train` checks before it loads anything
        # resuming is offered only while a complete checkpoint is there to resume
        assert ("--resume_from_checkpoint latest" in str(refused.value)) == (name != "train_summary.json")
        shutil.rmtree(output / name) if (output / name).is_dir() else (output / name).unlink(missing_ok=True)
    assert resume_checkpoint(make_config(output)) is None  # a metrics file alone is no run to lose
    trainer, _ = build_trainer(tiny_model_dir, output, max_steps=1, **RUN)
    trainer.train()
    assert _logged_steps(output) == [1, 1]  # the step and the run's summary line, nothing of the earlier run
    capsys.readouterr()
    code = main(["train", "--config", str(RECIPES_DIR / "smoke.yaml"), "--model_name_or_path", str(tiny_model_dir),
                 "--output_dir", str(output)])  # the run above left checkpoint-1
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"Error: {output} already holds a training run (checkpoint-1)"), err
    assert "--resume_from_checkpoint latest" in err[0]


def test_only_incomplete_checkpoints_is_one_error_line(run_copy, tiny_model_dir, capsys):
    from t2s.commands import main

    output, _ = run_copy
    for step in (1, 2, 3):
        (output / f"checkpoint-{step}" / "optimizer.pt").unlink()
    with pytest.raises(ConfigError, match="no complete checkpoint .*checkpoint-3 .*checkpoint-1"):
        resume_checkpoint(make_config(output, resume_from_checkpoint="latest"))
    code = main(["train", "--config", str(RECIPES_DIR / "smoke.yaml"), "--model_name_or_path", str(tiny_model_dir),
                 "--output_dir", str(output), "--resume_from_checkpoint", "latest"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("Error: no complete checkpoint"), err


def test_save_only_model_checkpoints_need_no_optimizer_state(run_copy):
    output, _ = run_copy
    (output / "checkpoint-3" / "optimizer.pt").unlink()
    config = make_config(output, resume_from_checkpoint="latest", save_only_model=True)
    assert resume_checkpoint(config) == str(output / "checkpoint-3")


def test_beta_without_controller_file_comes_from_the_logged_history(tiny_model_dir, run_copy, caplog):
    output, betas = run_copy
    checkpoint = output / "checkpoint-2"
    (checkpoint / KL_STATE_FILE).unlink()
    with caplog.at_level(logging.WARNING, logger="t2s.training.trainer"):
        assert restored_beta(str(checkpoint), 0.01) == pytest.approx(betas[1], rel=1e-12) != 0.01
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert KL_STATE_FILE in warning and "is missing" in warning and "step 2" in warning

    # and a real resume continues with that β: the same β history as the uninterrupted run
    trainer, _ = build_trainer(tiny_model_dir, output, max_steps=3, **RUN)
    trainer.train(resume_from_checkpoint=str(checkpoint))
    assert _betas(trainer) == pytest.approx(betas, rel=1e-9)


def test_beta_without_controller_file_or_logged_beta_restarts_with_a_warning(run_copy, caplog):
    output, _ = run_copy
    checkpoint = output / "checkpoint-2"
    (checkpoint / KL_STATE_FILE).unlink()
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    state["log_history"] = [{k: v for k, v in entry.items() if k != "beta"} for entry in state["log_history"]]
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    with caplog.at_level(logging.WARNING, logger="t2s.training.trainer"):
        assert restored_beta(str(checkpoint), 0.01) == 0.01
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "logs no beta" in warning and "initial 0.01" in warning


def test_the_controller_file_is_written_before_trainer_state(finished_run):
    output, betas = finished_run
    for step in (1, 2, 3):
        folder = output / f"checkpoint-{step}"
        saved = json.loads((folder / KL_STATE_FILE).read_text())
        assert saved == {"beta": pytest.approx(betas[step - 1], rel=1e-12), "global_step": step}
        assert (folder / KL_STATE_FILE).stat().st_mtime_ns <= (folder / "trainer_state.json").stat().st_mtime_ns


def test_checkpoint_weights_are_readable_as_every_other_file(finished_run):
    """A checkpoint's weights have its other files' mode (the libraries write them 0600 through a temp file)."""
    output, _ = finished_run
    for step in (1, 2, 3):
        folder = output / f"checkpoint-{step}"
        weights = list(folder.glob("*.safetensors"))
        assert weights
        for path in weights:
            assert path.stat().st_mode & 0o777 == (folder / "config.json").stat().st_mode & 0o777, path
