"""A paired comparison of two runs over the same questions.

Each run is an ``eval`` folder of one mode, one mode folder of an eval, a ``score`` folder (``scores.jsonl``), or the
per-question file itself (``t2s.evaluation.run_folders``).
Questions are paired on ``question_id``; with several samples per question, sample 0 is used. The report holds ``n``,
``acc_a``, ``acc_b``, ``delta`` (acc_b - acc_a), the seeded paired-bootstrap 95% CI ``ci_low`` / ``ci_high``, the exact
McNemar ``mcnemar_p``, and the discordant counts ``only_a`` (A right, B wrong) and ``only_b``. ``--output DIR`` writes
``DIR/compare.json``; ``--html`` adds ``DIR/compare.html``, the questions that flipped with both transcripts.
Questions that one run could not score (a null metric, e.g. a missing database) are left out of both, and counted.
"""

from __future__ import annotations

from pathlib import Path

from t2s.errors import T2SError
from t2s.evaluation.run_folders import EPISODES, SCORES

RUN_FILES = (SCORES, EPISODES)


class CompareError(T2SError, ValueError):
    """Runs that cannot be compared; the message begins with ``Error:``."""


def run_file(path) -> Path:
    """The per-question file of a run: the path itself, or scores.jsonl / episodes.jsonl of its (mode) folder."""
    from t2s.evaluation.run_folders import RunFolderError, mode_folder

    path = Path(path)
    if path.is_file():
        return path
    try:
        folder = mode_folder(path)
    except RunFolderError as exc:
        raise CompareError(str(exc)) from None
    found = next((folder / name for name in RUN_FILES if (folder / name).is_file()), None)
    if found is None:
        raise CompareError(f"Error: {folder} holds neither {' nor '.join(RUN_FILES)}")
    return found


def read_run(path, metric: str = "official") -> dict[str, float | None]:
    """question_id -> the metric of the lowest-numbered sample (normally sample 0); None when not scored. The lines
    are read as ``show`` and the report read them (``run_folders.read_episodes``: a last line cut off by a killed run
    is left out, and a line a reader would fail on is one error naming it)."""
    from t2s.evaluation.run_folders import RunFolderError, read_episodes

    file = run_file(path)
    chosen: dict[str, tuple[int, float | None]] = {}
    try:
        lines = read_episodes(file)
    except RunFolderError as exc:
        raise CompareError(str(exc)) from None
    for record in lines:
        question_id, sample = str(record["question_id"]), record.get("sample", 0)
        if metric not in record:
            raise CompareError(f"Error: {file}: the line of question {question_id} has no {metric!r} score")
        if question_id in chosen and chosen[question_id][0] == sample:
            raise CompareError(f"Error: {file}: question {question_id} appears twice as sample {sample}")
        if question_id not in chosen or sample < chosen[question_id][0]:
            value = record[metric]
            chosen[question_id] = (sample, None if value is None else float(value))
    if not chosen:
        raise CompareError(f"Error: {file} holds no questions")
    return {question_id: value for question_id, (_, value) in chosen.items()}


def nothing_played(run) -> str | None:
    """Why a run's paired episodes (each question's lowest sample, as ``read_run`` takes) measure nothing: every one
    ended in an error (its server, the environment) or before its first turn; None when one played, or the run holds
    no episodes (a score run). The file is read a line at a time, keeping only each question's stop reason."""
    import json

    from t2s.evaluation.records import UNPLAYED

    file = run_file(run)
    episodes = file.with_name(EPISODES) if file.name == SCORES else file
    if not episodes.is_file():
        return None
    chosen: dict[str, tuple[int, object]] = {}
    try:
        with open(episodes, encoding="utf-8") as handle:
            for text in handle:
                line = json.loads(text) if text.strip() else None
                if not isinstance(line, dict):
                    continue
                question, sample = str(line.get("question_id")), line.get("sample") or 0
                if not isinstance(sample, int) or isinstance(sample, bool):
                    return None  # read_run says what is wrong with it
                if question not in chosen or sample < chosen[question][0]:
                    chosen[question] = (sample, line.get("stop_reason"))
    except (OSError, ValueError, RecursionError):  # a cut-off last line, a damaged file: read_run speaks for it
        return None
    if chosen and all(reason in UNPLAYED for _, reason in chosen.values()):
        return f"every one of its {len(chosen)} episodes ended in an error or before its first turn"
    return None


def compare_runs(run_a, run_b, metric: str = "official") -> dict:
    """The paired report of two runs (see the module docstring)."""
    from t2s.scoring.metrics import mcnemar_exact, paired_bootstrap

    scores_a, scores_b = read_run(run_a, metric), read_run(run_b, metric)
    for label, run in (("A", run_a), ("B", run_b)):
        if problem := nothing_played(run):  # its zeros are the errors', not the policy's
            raise CompareError(f"Error: {label} ({run}): {problem}: it measures nothing to compare")
    missing_from_a = set(scores_b) - set(scores_a)
    missing_from_b = set(scores_a) - set(scores_b)
    if missing_from_a or missing_from_b:
        raise CompareError(
            f"Error: the runs cover different questions: {len(missing_from_a)} of B's questions are missing from A "
            f"and {len(missing_from_b)} of A's are missing from B"
        )
    paired = [q for q in scores_a if scores_a[q] is not None and scores_b[q] is not None]
    if not paired:
        raise CompareError("Error: no question is scored in both runs")
    a = [1.0 if scores_a[q] >= 1.0 else 0.0 for q in paired]
    b = [1.0 if scores_b[q] >= 1.0 else 0.0 for q in paired]
    only_a = sum(1 for x, y in zip(a, b) if x and not y)
    only_b = sum(1 for x, y in zip(a, b) if y and not x)
    low, high = paired_bootstrap(a, b)
    acc_a, acc_b = sum(a) / len(a), sum(b) / len(b)
    return {
        "n": len(paired),
        "acc_a": acc_a,
        "acc_b": acc_b,
        "delta": acc_b - acc_a,
        "ci_low": low,
        "ci_high": high,
        "mcnemar_p": mcnemar_exact(only_a, only_b),
        "only_a": only_a,
        "only_b": only_b,
        "not_scored": len(scores_a) - len(paired),
    }


def flipped_episodes(run_a, run_b, metric: str = "official") -> list[tuple[str, dict, dict]]:
    """The questions that flipped on ``metric`` between the two runs, with both episodes (``browse.flipped``), read
    from each run's episodes: the file named itself, or the ``episodes.jsonl`` beside its (mode) folder's
    ``scores.jsonl``. A CompareError when a run has no episodes (a score folder, or a file of scores)."""
    from t2s.evaluation.run_folders import RunFolderError, read_episodes
    from t2s.evaluation.browse import flipped, in_data_order

    lines = []
    for run in (run_a, run_b):
        file = run_file(run)
        episodes = file if Path(run).is_file() and file.name != SCORES else file.with_name(EPISODES)
        try:
            read = read_episodes(episodes) if episodes.is_file() else []
        except RunFolderError as exc:
            raise CompareError(str(exc)) from None
        if not episodes.is_file() or not all("turns" in line for line in read):
            raise CompareError(f"Error: --html needs the episodes of each run; {run} holds no {EPISODES} (scores "
                               "only)")
        lines.append(read)
    return flipped(in_data_order(lines[0]), lines[1], metric)


def write_html(run_a, run_b, report: dict, pairs: list[tuple[str, dict, dict]], out: Path) -> Path:
    """compare.html of the two runs' flipped questions (:func:`flipped_episodes`)."""
    from t2s.evaluation.report_html import write_compare_report

    return write_compare_report(out / "compare.html", report, pairs, (str(run_a), str(run_b)))
