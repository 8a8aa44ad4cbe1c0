"""`python -m t2s sft --config recipes/sft_warmstart.yaml`: a supervised warm start on trajectories the environment
plays (the gold policy, recorded correct episodes and near misses), loss on the model's own tokens only; the library is
``t2s.training.warm_start``.
"""

from __future__ import annotations

import argparse
import logging

from t2s.ui.args import add_recipe_arguments

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_recipe_arguments(parser, "Any other flag overrides a recipe key: those below, or any field of trl.SFTConfig or "
                         "trl.ModelConfig, e.g. --max-steps 50 --learning-rate 1e-5", warm_start_keys_help,
                         "recipes/sft_warmstart.yaml, recipes/demo_sft.yaml")


def warm_start_keys_help() -> str:
    import dataclasses
    import textwrap

    from t2s.training.warm_start import T2SSFTArguments

    lines = ["warm-start keys:"]
    for spec in dataclasses.fields(T2SSFTArguments):
        lines.append(f"  --{spec.name.replace('_', '-')} (default: {spec.default})")
        lines += textwrap.wrap(spec.metadata["help"], 100, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    from t2s.training.pipeline import free_finished_run, say_written, start_command

    config_path = start_command(args.config)
    if config_path is None:  # a missing recipe file is bad input, as every other missing file
        return 1
    from t2s.training.startup import setup_error
    from t2s.training.warm_start import SUMMARY_FILE, build_sft_trainer, fit, parse_sft_recipe
    try:
        sft_args, config, model_args = parse_sft_recipe(["--config", str(config_path), *args.overrides])
        trainer, counts = build_sft_trainer(sft_args, config, model_args)
    except (ValueError, OSError) as exc:  # ConfigError (a model folder that cannot load), TRL/transformers config
        return setup_error(exc)  # errors, unreadable data
    log.info("warm-start trajectories: %s", counts)
    fit(trainer, counts)
    say_written(trainer, f"the warm-started model and tokenizer, {SUMMARY_FILE} ({counts['examples']} examples; "
                f"trajectories off the call format: {counts['format_deviations']})")
    del trainer
    free_finished_run()  # as in `train`: the model and any process group, freed while Python is fully alive
    return 0
