"""`python -m t2s train --config recipes/X.yaml [overrides]`: GRPO training from a recipe.

Single process: ``python -m t2s train --config recipes/smoke.yaml``. Several GPUs:
``accelerate launch --config_file accelerate_configs/multi_gpu.yaml --num_processes 3 -m t2s train --config
recipes/bird.yaml`` (what ``make train RECIPE=bird`` runs). Overrides are recipe keys as flags, e.g.
``--learning_rate 5e-6 --max_steps 100``; ``--resume_from_checkpoint runs/bird/checkpoint-200`` (or ``latest``)
continues from that step with the same β and data order.
The rows, filters and trainer are ``t2s.training.pipeline``'s.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from t2s.ui.args import add_recipe_arguments

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_recipe_arguments(parser, "Any other flag overrides a recipe key, e.g. --learning-rate 5e-6 --max-steps 100 "
                         "--resume-from-checkpoint latest", recipe_keys_help, "recipes/bird.yaml, recipes/smoke.yaml")


def recipe_keys_help() -> str:
    """Every recipe key with its help and default (imports TRL: only on --help)."""
    from t2s.training.recipe_help import recipe_keys_help as keys_help

    return keys_help()


def run(args: argparse.Namespace) -> int:
    from t2s.training.pipeline import (build_trainer, fit, free_finished_run, resume_checkpoint, say_written,
                                       start_command, use_step_printer)

    config = start_command(args.config)
    if config is None:  # a missing recipe file is bad input, as every other missing file
        return 1
    from t2s.training.startup import setup_error
    from t2s.training.configs import parse_recipe
    from t2s.run_lock import rank_zero_lock

    try:
        script_args, training_args, model_args = parse_recipe(["--config", str(config), *args.overrides])
        checkpoint = resume_checkpoint(training_args)
        trainer, counts = build_trainer(script_args, training_args, model_args)
    except (ValueError, OSError) as exc:  # ConfigError (a model folder that cannot load), TRL/transformers config
        return setup_error(exc)  # errors, unreadable data
    use_step_printer(trainer)
    with rank_zero_lock(training_args.output_dir):  # one run per output_dir; a second stops with one Error: line
        fit(trainer, counts, checkpoint, recipe={"recipe": config.name, "overrides": list(args.overrides)})
    checkpoints = sorted(Path(training_args.output_dir).glob("checkpoint-*"))
    saved = f"{len(checkpoints)} checkpoint{'s' if len(checkpoints) != 1 else ''}, " if checkpoints else ""
    say_written(trainer, f"the trained model and tokenizer, {saved}train_summary.json and metrics.jsonl")
    del trainer
    free_finished_run()  # the model and its process group, freed while Python is fully alive
    return 0
