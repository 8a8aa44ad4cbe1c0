"""`python -m t2s bench learn-real`: the recipe in miniature on a real pretrained model, judged on unseen databases.

The published claim is that GRPO against real SQLite execution raises a model's execution accuracy on databases it
never trained on. This bench runs that experiment on SmolLM2-135M-Instruct (the converted model ``make
install-models`` caches; ``--model DIR`` names another model folder) on a 2-core CPU:

- **Data, split by database** (fixed here, printed, never tuned): the questions of 14 Spider dev databases train;
  the five Spider dev databases ``UNSEEN_SPIDER`` and BIRD dev's superhero are the unseen databases it is judged on.
  The shared data is read where the tests read it (``T2S_DATA_DIR``, default ``../shared/data``); the bench writes
  BIRD-style files of the split into ``OUTPUT/data`` with links to the databases. Nothing is copied into the
  repository.
- **Stages**: (1) zero-shot, the base model through the harness; (2) a supervised warm start
  (``recipes/learn_real_sft.yaml``) on gold trajectories of ``--sft-questions`` training questions, played by the GRPO
  recipe's own environment, cached under ``.cache/`` keyed on what determines it; (3) GRPO
  (``recipes/learn_real.yaml``) from the warm start for ``--steps`` steps on ``--grpo-questions`` other training
  questions, with the colocated vLLM engine generating; (4) the control: the same run with each step's rewards permuted
  across its episodes (``bench learn``'s control).
- **Evaluation**: ``t2s eval --policy vllm`` of each stage's model on the unseen databases, in full mode at
  temperature 0, with the GRPO recipe's own episode settings (``OUTPUT/eval_args.txt`` holds those flags on one line).
  GRPO is compared with the warm start and with the control by ``t2s compare``'s paired test (McNemar and a bootstrap
  CI). Each evaluation runs in its own process beside the next stage's training (the zero-shot one beside the warm
  start, the warm start's beside GRPO, GRPO's beside the control).

Departures from the published recipe, each forced by a 135M model on two CPU cores, are listed in docs/benchmarks.md.
The last line is ``learn-real: zero_shot=Z warm=W grpo=G control=C delta=D ci=[lo,hi] train_gain=T control_gain=K
seconds=S`` (accuracies and gains as fractions; delta and ci are GRPO minus the warm start on the unseen databases).
The bench exits 1 naming each target missed (``TARGETS``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from t2s.settings import PACKAGE_DIR, RECIPES_DIR

UNSEEN_SPIDER = ("concert_singer", "employee_hire_evaluation", "network_1", "orchestra", "pets_1")
UNSEEN_BIRD = "bird_dev_superhero"  # the shared data's BIRD dev subset: one database, superhero
SFT_RECIPE, RL_RECIPE = "learn_real_sft.yaml", "learn_real.yaml"
MODEL = ".cache/models/smollm2-135m-instruct"
SFT_QUESTIONS = 256
GRPO_QUESTIONS = 16
STEPS = 32
TARGETS = {"format_deviations": 0.10, "train_margin": 0.10, "seconds": 5400.0}
STAGES = ("zero_shot", "warm", "grpo", "control")
NO_BF16_NOTE = ("this CPU has no bfloat16 instructions, so every pass and engine runs float32; the time target holds "
                "on 2 cores with them (without them the warm start ran about 4 times slower: docs/benchmarks.md)")


@dataclass(frozen=True)
class Split:
    """The split's files in ``folder``: BIRD-style JSON (``SQL`` gold) with ``databases/<db_id>`` links beside them."""

    folder: Path
    train_questions: int  # all questions of the training databases
    sft: Path
    grpo: Path
    unseen: Path
    train_dbs: tuple[str, ...]
    unseen_counts: dict


def _bird_row(row: dict, prefix: str) -> dict:
    return {"question_id": f"{prefix}-{row['question_id']}", "db_id": row["db_id"], "question": row["question"],
            "evidence": row.get("evidence") or "", "SQL": row["gold_sql"], "difficulty": row.get("difficulty")}


def write_split(data_dir: Path, folder: Path, seed: int, sft_questions: int, grpo_questions: int) -> Split:
    """Read Spider dev and BIRD superhero from ``data_dir``, split them by database, and write the split's files. The
    SFT and GRPO questions are disjoint, drawn with ``seed`` from every training database's questions."""
    from t2s.data.loaders import load_bird, load_spider

    spider = load_spider(data_dir / "spider_dev" / "dev.json", require_databases=False)
    bird = load_bird(data_dir / UNSEEN_BIRD / "dev.json", require_databases=False)
    spider_root, bird_root = data_dir / "spider_dev" / "database", data_dir / UNSEEN_BIRD / "dev_databases"
    present = [row for row in spider if row["db_id"] not in spider.missing_databases]
    train = [_bird_row(r, "spider") for r in present if r["db_id"] not in UNSEEN_SPIDER]
    unseen = [_bird_row(r, "spider") for r in present if r["db_id"] in UNSEEN_SPIDER]
    unseen += [_bird_row(r, "bird") for r in bird if r["db_id"] not in bird.missing_databases]
    if not train or not unseen or sft_questions + grpo_questions > len(train):
        raise ValueError(f"Error: {data_dir} gives {len(train)} training and {len(unseen)} unseen questions; "
                         f"--sft-questions + --grpo-questions must fit the training ones")
    random.Random(seed).shuffle(shuffled := list(train))
    databases = folder / "databases"
    shutil.rmtree(folder, ignore_errors=True)
    databases.mkdir(parents=True)
    for row in train + unseen:
        link = databases / row["db_id"]
        if not link.exists():
            root = bird_root if row["question_id"].startswith("bird-") else spider_root
            link.symlink_to((root / row["db_id"]).resolve(), target_is_directory=True)
    files = {"sft": shuffled[:sft_questions], "grpo": shuffled[sft_questions:][:grpo_questions], "unseen": unseen}
    for name, rows in files.items():
        (folder / f"{name}.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    counts = {db: sum(row["db_id"] == db for row in unseen) for db in {row["db_id"] for row in unseen}}
    return Split(folder, len(train), folder / "sft.json", folder / "grpo.json", folder / "unseen.json",
                 tuple(sorted({r["db_id"] for r in train})), counts)


def derived_recipe(split: Split, output: Path) -> Path:
    """A copy of ``recipes/learn_real.yaml`` whose data is the SFT questions and whose paths are absolute: the SFT
    recipe's ``rl_recipe`` (it plays the trajectories with that environment)."""
    import yaml

    recipe = yaml.safe_load((RECIPES_DIR / RL_RECIPE).read_text(encoding="utf-8"))
    recipe.update(dataset_path=str(split.sft), max_train_rows=None,
                  system_prompt_file=str(RECIPES_DIR / Path(recipe["system_prompt_file"]).name))
    path = output / "recipes" / "sft_environment.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
    return path


def eval_flags(split: Split, n: int, overrides: tuple[str, ...] = ()) -> list[str]:
    """The ``t2s eval`` flags of the unseen-database evaluation: the GRPO run's episode settings and engine dtype (its
    recipe with ``overrides``), full mode, temperature 0, seed 0 whatever ``--seed`` (so ``--unseen-n`` picks the same
    questions for every seed), without ``--model`` and ``--output``."""
    import dataclasses

    from t2s.training.configs import parse_recipe

    _, args, _ = parse_recipe(["--config", str(RECIPES_DIR / RL_RECIPE), *overrides])
    episode = args.episode_config()
    flags = ["--policy", "vllm", "--data", str(split.unseen), "--mode", episode.mode, "--temperature", "0", "--top-p",
             "1", "--top-k", "0", "--seed", "0", *(["--dtype", args.vllm_dtype] if args.vllm_dtype else []), "--n",
             str(n), "--quiet"]  # without vllm_dtype, eval's engine runs the checkpoint's dtype, as GRPO's did
    for field in dataclasses.fields(episode):
        value = getattr(episode, field.name)
        if field.name in ("mode", "column_descriptions"):
            continue
        if field.name == "enable_thinking":
            flags.append("--enable-thinking" if value else "--no-enable-thinking")
        elif field.name == "system_prompt_file":
            if value:
                flags += ["--system-prompt-file", str(RECIPES_DIR / Path(value).name)]
        else:
            flags += ["--" + field.name.replace("_", "-"), str(value)]
    return flags


class PendingEval:
    """``t2s eval`` of a model in its own process (the engine's memory goes with it), started by :meth:`start` (with
    ``launch``, ``subprocess.Popen``'s arguments) and waited for by :meth:`summary`, beside the next stage's training.
    ``then`` runs once the evaluation has succeeded (the zero-shot cache's copy)."""
    launch = staticmethod(subprocess.Popen)

    def __init__(self, output: Path, process: subprocess.Popen | None = None, model: Path | None = None, then=None):
        self.output, self.process, self.model, self.then = output, process, model, then

    @classmethod
    def start(cls, model: Path, flags: list[str], output: Path, *, then=None):
        shutil.rmtree(output, ignore_errors=True)  # a fresh evaluation: eval resumes only a run of the same weights
        output.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "t2s", "eval", *flags, "--model", str(model), "--output", str(output)]
        with open(output.with_suffix(".log"), "w", encoding="utf-8") as handle:
            process = cls.launch(command, stdout=handle, stderr=subprocess.STDOUT, env=dict(os.environ),
                                 start_new_session=True)  # its own process group: stop() ends its engine too
        return cls(output, process, model, then)

    def stop(self) -> None:
        """End the evaluation and its engine's processes if it still runs (a stage beside it failed)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def summary(self) -> dict:
        """The full mode's summary, once the evaluation has ended; a failed eval raises with the tail of its log."""
        if self.process is not None:
            code, self.process = self.process.wait(), None
            log_file = self.output.with_suffix(".log")
            if code != 0:
                tail = log_file.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-5:]
                raise RuntimeError(f"Error: eval of {self.model} failed (exit {code}); {log_file}: " + " | ".join(tail))
            if self.then:
                self.then()
        return json.loads((self.output / "summary.json").read_text(encoding="utf-8"))["modes"]["full"]


def zero_shot_key(model: Path, split: Split, flags: list[str]) -> str:
    """The zero-shot evaluation's cache key: the base model's files, the unseen questions, the flags (a path's name
    only: what it holds is keyed), the prompt, the t2s sources, the library versions."""
    from t2s.bench.learn import content_key

    paths = {flags.index(f) + 1 for f in ("--data", "--system-prompt-file") if f in flags}
    return content_key([
        (model, sorted(model.glob("*.json"))), (split.folder, [split.unseen]),
        (RECIPES_DIR, [RECIPES_DIR / "learn_real_system_prompt.txt"]), (PACKAGE_DIR, sorted(PACKAGE_DIR.rglob("*.py"))),
    ], extra=(" ".join(Path(f).name if i in paths else f for i, f in enumerate(flags)),))


def zero_shot(model: Path, split: Split, flags: list[str], output: Path, cache: Path, log) -> PendingEval:
    """The base model's evaluation into ``output``: copied from ``cache`` when its key (:func:`zero_shot_key`)
    matches, else started (beside the warm start) and cached when it ends; the same for every seed."""
    cached = cache / f"learn-real-zero-shot-{zero_shot_key(model, split, flags)}"
    if (cached / "summary.json").is_file():
        log(f"zero-shot: cached in {cached}")
        shutil.rmtree(output, ignore_errors=True)
        shutil.copytree(cached, output)
        return PendingEval(output)

    def store() -> None:
        partial = cached.with_name(cached.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(output, partial)
        shutil.rmtree(cached, ignore_errors=True)
        partial.rename(cached)

    log("zero-shot: evaluating the base model on the unseen databases, beside the warm start")
    return PendingEval.start(model, flags, output, then=store)


def warm_start_folder(model: Path, split: Split, seed: int, sft_recipe: Path, cache: Path, log) -> Path:
    """``model`` warm-started: from ``cache`` when its key (recipes, prompt, SFT questions, base model, t2s sources,
    library versions, seed) matches, else trained there now."""
    from t2s.bench.learn import content_key, warm_start
    from t2s.training.warm_start import SUMMARY_FILE

    key = content_key([
        (RECIPES_DIR, [RECIPES_DIR / n for n in (SFT_RECIPE, RL_RECIPE, "learn_real_system_prompt.txt")]),
        (split.folder, [split.sft]), (model, sorted(model.glob("*.json"))),
        (PACKAGE_DIR, sorted(PACKAGE_DIR.rglob("*.py")))], extra=(f"seed={seed}",))
    folder = cache / f"learn-real-warm-{key}"
    if (folder / SUMMARY_FILE).is_file():
        log(f"warm start: cached in {folder}")
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    warm_start(partial, seed, ("--model_name_or_path", str(model), "--rl_recipe", str(sft_recipe)), report=log,
               recipe=RECIPES_DIR / SFT_RECIPE)
    partial.rename(folder)
    return folder


def copy_model(source: Path, target: Path) -> Path:
    """``source``'s model files (weights, config, tokenizer) into ``target``, a folder `eval --model` loads."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target, ignore=lambda folder, names: [n for n in names if (Path(folder) / n).is_dir()],
                    ignore_dangling_symlinks=True)
    return target


GRPO_START_METHOD = "spawn"  # how a GRPO stage's child starts (multiprocessing's name; the tests use "forkserver")


def grpo_stage(warm: Path, folder: Path, *, steps: int, seed: int, control: bool, overrides: tuple[str, ...]):
    """``recipes/learn_real.yaml`` from ``warm`` into ``folder``, in a child process: each run's colocated engine,
    process group and memory end with it (a second run in one process finds the first's process group torn down).
    Returns the run's logged steps (``folder/metrics.jsonl``, written afresh); a failed run raises."""
    import multiprocessing

    shutil.rmtree(folder, ignore_errors=True)  # metrics.jsonl is appended to
    child = multiprocessing.get_context(GRPO_START_METHOD).Process(target=_grpo_child,
                                                                   args=(warm, folder, steps, seed, control, overrides))
    child.start()
    child.join()
    if child.exitcode != 0:
        raise RuntimeError(f"Error: the {folder.name} run failed (exit {child.exitcode}); its output is above")
    from t2s.training.progress import METRICS_FILE

    lines = (folder / METRICS_FILE).read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return [row for row in rows if "reward" in row]  # not the closing train_runtime line


def _grpo_child(warm: Path, folder: Path, steps: int, seed: int, control: bool, overrides: tuple[str, ...]) -> None:
    from t2s.settings import RECIPES_DIR, offline_environment
    from t2s.training.cpu_threads import configure_cpu_threads

    configure_cpu_threads(on_cpu=True)
    offline_environment()
    import datasets

    from t2s.bench.learn import grpo_run
    from t2s.training.pipeline import free_finished_run
    from t2s.training.progress import quiet_libraries, step_printer
    from t2s.ui.console import console

    quiet_libraries()
    datasets.disable_progress_bars()
    grpo_run(warm, folder, steps=steps, seed=seed, control=control, callbacks=[step_printer(console())],
             overrides=overrides, recipe=RECIPES_DIR / RL_RECIPE)
    free_finished_run()  # the trainer and its engine go before this process's interpreter shuts down


def stage_table(summaries: dict[str, dict]):
    """EX per stage and unseen database (``n``: its questions evaluated), then the format-deviation, submit and
    executes rates."""
    from rich.table import Table

    table = Table(title="bench learn-real: EX on the unseen databases (full mode, temperature 0)")
    for column in ("database", "n", *summaries):
        table.add_column(column, justify="left" if column == "database" else "right")
    any_summary = next(iter(summaries.values()))
    for db, counts in sorted(any_summary.get("per_db", {}).items()):
        cells = [_rate(s.get("per_db", {}).get(db, {}).get("execution_accuracy_official")) for s in summaries.values()]
        table.add_row(db, str(counts.get("n", 0)), *cells)
    table.add_row("all", str(any_summary.get("n", 0)),
                  *[_rate(s.get("execution_accuracy_official")) for s in summaries.values()])
    for label, key in (("format deviations", "format_deviation_rate"), ("submit rate", "submit_rate"),
                       ("executes", "executes_rate")):
        table.add_row(label, "", *[_rate(s.get(key)) for s in summaries.values()])
    return table


def _rate(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _evaluated(stage: str, summary: dict, log) -> dict:
    line = f"{stage}: EX {summary['execution_accuracy_official']:.3f}"
    log(line + (f", format deviations {summary['format_deviation_rate']:.3f}" if stage == "warm" else ""))
    return summary


def missed_targets(ex: dict, warm_format: float, delta_control: float, train_margin: float, seconds: float,
                   no_bf16: bool | None = None):
    missed = []
    if warm_format > TARGETS["format_deviations"]:
        missed.append(f"warm format deviations {warm_format:.3f} > {TARGETS['format_deviations']}")
    if ex["warm"] <= ex["zero_shot"]:
        missed.append(f"warm EX {ex['warm']:.3f} <= zero-shot {ex['zero_shot']:.3f}")
    if train_margin < TARGETS["train_margin"]:
        missed.append(f"train_gain - control_gain {train_margin:.3f} < {TARGETS['train_margin']}")
    if ex["grpo"] <= ex["warm"]:
        missed.append(f"GRPO EX {ex['grpo']:.3f} <= warm start {ex['warm']:.3f} on the unseen databases")
    if delta_control <= 0:
        missed.append(f"GRPO EX {ex['grpo']:.3f} <= control {ex['control']:.3f} on the unseen databases")
    if seconds > TARGETS["seconds"]:
        missed.append(f"seconds {seconds:.0f} > {TARGETS['seconds']:.0f}" + (
            " on a CPU without bfloat16 instructions" if no_bf16 else ""))
    return missed


def run(*, seed=0, output="runs/bench-learn-real", steps=STEPS, sft_questions=SFT_QUESTIONS,
        grpo_questions=GRPO_QUESTIONS, unseen_n=0, model: str | Path | None = None, cache: Path | None = None,
        grpo_overrides: tuple[str, ...] = ()) -> int:
    """The experiment (see the module's docstring). ``model`` is the base model's folder (default: the converted
    SmolLM2, ``MODEL``); ``cache`` holds the warm starts and the zero-shot evaluation (default ``.cache/``);
    ``grpo_overrides`` are recipe flags for both GRPO runs, whose episode settings the evaluations share (the smoke
    test's smaller groups and shorter turns)."""
    from t2s.backends.cpu_precision import native_bf16
    from t2s.settings import offline_environment, shared_data_dir, workspace
    from t2s.training.cpu_threads import configure_cpu_threads

    started = time.perf_counter()
    configure_cpu_threads(on_cpu=True)  # before torch is imported
    offline_environment()
    import datasets

    from t2s.bench.learn import cycle_window, pass_gain, plot_curves
    from t2s.evaluation.compare import compare_runs
    from t2s.training.progress import quiet_libraries
    from t2s.ui.console import console as make_console, print_table

    quiet_libraries()
    datasets.disable_progress_bars()  # SFT's dataset preparation: one bar per pass otherwise
    console = make_console()

    def log(line: str) -> None:
        console.print(f"[{time.perf_counter() - started:5.0f} s] {line}", markup=False, highlight=False)

    output = workspace() / output
    model = Path(model).resolve() if model else workspace() / MODEL
    if not (model / "config.json").is_file():
        print(f"Error: no model folder at {model} (no config.json)" + (
            "; run `make install-models` first" if model == workspace() / MODEL else ""), file=sys.stderr)
        return 2
    if no_bf16 := native_bf16() is False:
        log(f"note: {NO_BF16_NOTE}")
    try:
        split = write_split(shared_data_dir(), output / "data", seed, sft_questions, grpo_questions)
    except (OSError, ValueError) as exc:
        print(str(exc) if str(exc).startswith("Error:") else f"Error: {exc}", file=sys.stderr)
        return 2
    log(f"split: training databases ({len(split.train_dbs)}, {split.train_questions} questions): "
        f"{', '.join(split.train_dbs)}")
    log("split: unseen databases: " + ", ".join(f"{db} ({n})" for db, n in sorted(split.unseen_counts.items())))
    log(f"split: SFT on {sft_questions} training questions, GRPO on {grpo_questions} others (seed {seed})")
    flags = eval_flags(split, unseen_n, grpo_overrides)
    (output / "eval_args.txt").write_text(" ".join(flags) + "\n", encoding="utf-8")
    log(f"eval flags (also in {output / 'eval_args.txt'}): {' '.join(flags)}")

    summaries: dict[str, dict] = {}
    cache = cache or workspace() / ".cache"
    grpo_flags = ("--dataset_path", str(split.grpo), "--max_train_rows", str(grpo_questions), *grpo_overrides)
    pending = zero_shot(model, split, flags, output / "eval" / "zero_shot", cache, log)
    try:
        warm_folder = warm_start_folder(model, split, seed, derived_recipe(split, output), cache, log)
        summaries["zero_shot"] = pending.summary()
        log(f"zero-shot: EX {summaries['zero_shot']['execution_accuracy_official']:.3f}")
        warm = copy_model(warm_folder, output / "warm")
        runs: dict[str, list[dict]] = {}
        evaluated = "warm"  # each stage's evaluation runs beside the next stage's training
        pending = PendingEval.start(warm, flags, output / "eval" / "warm")
        for name, control in (("grpo", False), ("control", True)):
            console.rule(f"{name}: {steps} steps" + (" (rewards permuted within each step)" if control else "") +
                         f", beside the {evaluated} evaluation")
            runs[name] = grpo_stage(warm, output / name, steps=steps, seed=seed, control=control, overrides=grpo_flags)
            summaries[evaluated] = _evaluated(evaluated, pending.summary(), log)
            evaluated, pending = name, PendingEval.start(output / name, flags, output / "eval" / name)
        summaries[evaluated] = _evaluated(evaluated, pending.summary(), log)
    except BaseException:
        pending.stop()
        raise
    print_table(console, stage_table(summaries))
    paired = {other: compare_runs(output / "eval" / other, output / "eval" / "grpo") for other in ("warm", "control")}
    for other, report in paired.items():
        log(f"GRPO vs {other}: n={report['n']} delta={report['delta']:+.3f} CI [{report['ci_low']:+.3f}, "
            f"{report['ci_high']:+.3f}] McNemar p={report['mcnemar_p']:.3f} (only {other} right {report['only_a']}, "
            f"only GRPO right {report['only_b']})")
    equiv = {name: [s.get("tier/equivalent", 0.0) for s in steps] for name, steps in runs.items()}
    window = cycle_window(RECIPES_DIR / RL_RECIPE, grpo_questions, steps, grpo_flags)
    log(f"gains: the mean equivalence of the last {window} steps minus the first {window} (each one pass over the "
        f"{grpo_questions} GRPO questions)")
    train_gain, control_gain = pass_gain(equiv["grpo"], window), pass_gain(equiv["control"], window)
    plot = output / "learn_real.png"
    plot_curves(plot, runs, f"{model.name}: GRPO vs permuted-reward control on training questions (seed {seed})")
    log(f"curves in {plot}")
    ex = {stage: summaries[stage]["execution_accuracy_official"] for stage in STAGES}
    seconds = time.perf_counter() - started
    (output / "learn_real.json").write_text(json.dumps({
        "seed": seed, "steps": steps, "sft_questions": sft_questions, "grpo_questions": grpo_questions,
        "ex": ex, "paired": paired, "gain_window": window, "train_gain": train_gain, "control_gain": control_gain,
        "seconds": seconds, "summaries": summaries, "runs": runs}, indent=1, default=str), encoding="utf-8")
    missed = missed_targets(ex, summaries["warm"]["format_deviation_rate"], paired["control"]["delta"],
                            train_gain - control_gain, seconds, no_bf16)
    for line in missed:
        console.print(f"target missed: {line}", highlight=False)
    delta = paired["warm"]
    print(f"learn-real: zero_shot={ex['zero_shot']:.3f} warm={ex['warm']:.3f} grpo={ex['grpo']:.3f} "
          f"control={ex['control']:.3f} delta={delta['delta']:.3f} ci=[{delta['ci_low']:.3f},{delta['ci_high']:.3f}] "
          f"train_gain={train_gain:.3f} control_gain={control_gain:.3f} seconds={seconds:.0f}", flush=True)
    return 1 if missed else 0
