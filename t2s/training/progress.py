"""What a training run prints and writes: one block per step (reward components, tiers, episode rates, KL, beta, time
split) and a table of every step at the end, shared by ``train``, ``demo`` and ``bench learn``; every logged step's
metrics in ``OUTPUT/metrics.jsonl``, whatever ``report_to`` says; and the libraries quietened so that it reads."""

from __future__ import annotations


STEP_COLUMNS = (  # (log key, column title, format)
    ("reward", "reward", "{:.3f}"),
    ("rewards/dense/f1", "f1", "{:.3f}"),
    ("rewards/dense/join", "join", "{:.2f}"),
    ("rewards/dense/consensus", "consensus", "{:.2f}"),
    ("tier/equivalent", "equiv", "{:.2f}"),
    ("tier/executable", "exec", "{:.2f}"),
    ("tier/parsable", "parse", "{:.2f}"),
    ("tier/invalid", "invalid", "{:.2f}"),
    ("episodes/turns_mean", "turns", "{:.1f}"),
    ("episodes/submit_rate", "submit", "{:.2f}"),
    ("episodes/forced_rate", "forced", "{:.2f}"),
    ("kl", "kl", "{:.2e}"),
    ("beta", "beta", "{:.6f}"),
    ("step_time", "s/step", "{:.1f}"),
    ("time/generation", "s gen", "{:.1f}"),
    ("time/environment", "s env", "{:.2f}"),
    ("time/reward", "s reward", "{:.2f}"),
    ("time/forward_backward", "s fwd/bwd", "{:.1f}"),
)


def step_printer(console):
    """A TrainerCallback that prints each step's reward components, episode rates, KL, beta and time split as it
    ends."""
    from rich.text import Text
    from transformers import TrainerCallback

    class StepPrinter(TrainerCallback):
        def __init__(self):
            self.steps: list[dict] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "reward" not in logs:
                return
            self.steps.append(dict(logs, step=state.global_step))

            def show(key: str) -> str:
                fmt = next(f for k, _, f in STEP_COLUMNS if k == key)
                return fmt.format(logs[key]) if logs.get(key) is not None else "-"

            head = Text(f"step {state.global_step}/{state.max_steps}", style="bold")
            console.print(head, Text(
                f"  reward {show('reward')}  f1 {show('rewards/dense/f1')}  "
                f"join {show('rewards/dense/join')}  consensus {show('rewards/dense/consensus')}\n"
                f"  tiers: equivalent {show('tier/equivalent')}  executable {show('tier/executable')}  parsable "
                f"{show('tier/parsable')}  invalid {show('tier/invalid')}\n"
                f"  turns {show('episodes/turns_mean')}  submit {show('episodes/submit_rate')}  forced "
                f"{show('episodes/forced_rate')}  kl {show('kl')}  beta {show('beta')}\n"
                f"  time {show('step_time')} s: generation {show('time/generation')}  environment "
                f"{show('time/environment')}  reward {show('time/reward')}  forward/backward "
                f"{show('time/forward_backward')}"),
                sep="", highlight=False,
            )

        def table(self):
            from rich.table import Table

            table = Table(title="training steps")
            table.add_column("metric")
            for entry in self.steps:
                table.add_column(f"step {entry['step']}", justify="right")
            for key, title, fmt in STEP_COLUMNS:
                table.add_row(title, *(fmt.format(e[key]) if e.get(key) is not None else "-" for e in self.steps))
            return table

    return StepPrinter()


def step_counter(report, label: str, parts: int = 10):
    """A TrainerCallback calling ``report(line)`` ``parts`` times over a run: ``LABEL: step K/N, S s``, for a run that
    prints nothing else (the demo's warm start), so that a long one is never silent."""
    import time

    from transformers import TrainerCallback

    class StepCounter(TrainerCallback):
        started = time.perf_counter()

        def on_train_begin(self, args, state, control, **kwargs):
            StepCounter.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            every = max(1, state.max_steps // parts)
            if state.global_step % every == 0 or state.global_step == state.max_steps:
                report(f"{label}: step {state.global_step}/{state.max_steps}, "
                       f"{time.perf_counter() - StepCounter.started:.0f} s")

    return StepCounter()


def quiet_libraries() -> None:
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("trl").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


METRICS_FILE = "metrics.jsonl"


def metrics_file():
    """A TrainerCallback that appends each logged step's metrics (every key TRL and t2s log) as one JSON line
    ``{"step": N, ...}`` to ``output_dir/metrics.jsonl``, on the main process only; the run's closing summary
    (``train_runtime`` and the rest) is the last line, at the last step.

    When the run starts (its first step or log, once HF has restored a resumed run's state) the file keeps only what
    the run continues: a fresh run starts it afresh; a resumed one keeps the steps up to its checkpoint's, so the
    steps a crashed run logged after that checkpoint, which the resumed run trains again, are not there twice, and an
    earlier part's closing summary (or a line cut off by a crash) goes too."""
    import json
    import math
    import os

    from transformers import TrainerCallback

    def plain(value):
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)  # JSON has no NaN or infinity
        return value

    def continued(line: str, start: int) -> bool:
        try:
            entry = json.loads(line)
            step = entry.get("step")
        except (ValueError, AttributeError, RecursionError):  # a line cut off, or not ours
            return False
        return type(step) is int and step <= start and start > 0 and "train_runtime" not in entry

    def keep_continued(path: str, start: int) -> None:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                kept = [line for line in handle if continued(line, start)]
        except FileNotFoundError:
            return
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            handle.writelines(line if line.endswith("\n") else line + "\n" for line in kept)
        os.replace(path + ".tmp", path)

    class MetricsFile(TrainerCallback):
        started = False

        def start(self, args, state) -> str:
            path = os.path.join(args.output_dir, METRICS_FILE)
            if not self.started:
                self.started = True
                keep_continued(path, state.global_step)  # 0, or the resumed checkpoint's step
            return path

        def on_step_begin(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                self.start(args, state)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or not state.is_world_process_zero:
                return
            os.makedirs(args.output_dir, exist_ok=True)
            path = self.start(args, state)
            line = {"step": state.global_step, **{key: plain(value) for key, value in logs.items()}}
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(line, default=str) + "\n")

    return MetricsFile()
