"""Run folders edited by hand or written by another tool, in the ways a reader could trip on: question ids that look
like numbers but are not ASCII ones, a summary.json whose "modes" is no object, a step, a call or a score of the
wrong type or range, garbage in an earlier mode's episodes, a training run's damaged completions. Each command skips
and counts the damaged line or stops with one ``Error:`` line; none fails with a traceback."""

from __future__ import annotations

import json
import shutil

import pytest

from t2s.commands import main
from t2s.commands.eval import eval_config
from t2s.errors import EvalError
from t2s.evaluation.browse import id_order, in_data_order
from t2s.evaluation.records import line_problem
from t2s.evaluation.runner import evaluate
from tests.test_damaged_runs import eval_argv


@pytest.fixture(scope="module")
def finished_run(demo_dir, tmp_path_factory):
    """A finished eval of three questions in mode withheld."""
    folder = tmp_path_factory.mktemp("finished") / "run"
    evaluate(eval_config(eval_argv(demo_dir, folder)))
    return folder


def copy_with_lines(finished_run, tmp_path, change) -> tuple:
    """A copy of the finished run whose episode lines are ``change(lines)`` (JSON texts or objects)."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    episodes = run / "withheld" / "episodes.jsonl"
    lines = change([json.loads(text) for text in episodes.read_text().splitlines()])
    episodes.write_text("".join((text if isinstance(text, str) else json.dumps(text)) + "\n" for text in lines))
    return run, episodes


def run_command(capsys, argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, argv
    return code, out, err


# ------------------------------------------------------------------------------------------------- question ids
def test_id_order_is_total_for_any_text():
    ids = ["10", "2", "\u00b2", "9" * 5000, "\u0663", "spider:17", "spider:9", "a", "", 7, "007"]
    ordered = sorted(ids, key=id_order)  # no ValueError, whatever the digits
    assert ordered[:5] == ["", "2", "007", 7, "10"]
    assert ordered.index("spider:9") < ordered.index("spider:17")
    assert ordered.index("9" * 5000) > ordered.index("10")  # past the digits compared as numbers: text
    assert id_order("\u00b2") == ((1, 0, "\u00b2"),)
    lines = [{"question_id": "\u00b2", "mode": "m"}, {"question_id": "3", "mode": "m", "step": 0}]
    assert [line["question_id"] for line in in_data_order(lines)] == ["3", "\u00b2"]


def test_question_ids_of_odd_digits_are_shown_and_reported(finished_run, demo_dir, tmp_path, capsys):
    def odd_ids(lines):
        lines[1]["question_id"], lines[2]["question_id"] = "\u00b2", "9" * 5000
        return lines

    run, episodes = copy_with_lines(finished_run, tmp_path, odd_ids)
    code, out, _ = run_command(capsys, ["show", str(run)])
    assert code == 0 and "\u00b2" in out
    code, out, _ = run_command(capsys, ["show", str(run), "--id", "\u00b2"])
    assert code == 0 and "question \u00b2" in out
    (run / "report.html").unlink()
    evaluate(eval_config(eval_argv(demo_dir, run)))  # resumes: plays the two questions no line holds now
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "\\u00b2" in page or "\u00b2" in page
    assert len(episodes.read_text().splitlines()) == 5


# ------------------------------------------------------------------------------------------------- summary.json
@pytest.mark.parametrize("modes", [5, "withheld", [1], None])
def test_a_summary_whose_modes_is_no_object(finished_run, tmp_path, capsys, modes):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "summary.json").write_text(json.dumps({"modes": modes}))
    code, out, _ = run_command(capsys, ["show", str(run)])
    assert code == 0 and "3 of 3 episodes" in out
    code, out, _ = run_command(capsys, ["compare", str(run), str(finished_run)])
    assert code == 0


# --------------------------------------------------------------------------------- lines a reader cannot use
DAMAGES = {  # the second line of episodes.jsonl, changed so
    "step-text": lambda line: dict(line, step="x"),
    "step-list": lambda line: dict(line, step=[1]),
    "step-bool": lambda line: dict(line, step=True),
    "step-negative": lambda line: dict(line, step=-1),
    "calls-number": lambda line: dict(line, turns=[{"assistant": "a", "calls": [5], "observation": ""}]),
    "calls-list": lambda line: dict(line, turns=[{"assistant": "a", "calls": [["run_query"]], "observation": ""}]),
    "call-tool": lambda line: dict(line, turns=[{"assistant": "a", "calls": [{"tool": 5}], "observation": ""}]),
    "official-5": lambda line: dict(line, official=5),
    "official-nan": lambda line: dict(line, official=float("nan")),
    "official-inf": lambda line: dict(line, official=float("inf")),
    "official-negative": lambda line: dict(line, official=-1),
    "soft_f1-inf": lambda line: dict(line, soft_f1=float("-inf")),
    "prompt_tokens-nan": lambda line: dict(line, prompt_tokens=float("nan")),
    "counter-nan": lambda line: dict(line, counters={**line["counters"], "turns": float("nan")}),
    "counter-huge": lambda line: dict(line, counters={**line["counters"], "calls": 10**400}),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_line_a_reader_cannot_use_is_one_error_line(finished_run, demo_dir, tmp_path, capsys, damage):
    def change(lines):
        lines[1] = DAMAGES[damage](lines[1])
        return lines

    run, episodes = copy_with_lines(finished_run, tmp_path, change)
    damaged = episodes.read_bytes()
    with pytest.raises(EvalError, match=f"^Error: {episodes} line 2: .*; move the file away to start over$"):
        evaluate(eval_config(eval_argv(demo_dir, run)))
    assert episodes.read_bytes() == damaged  # the file is kept as it was
    for argv in (["show", str(episodes)], ["show", str(run)], ["show", str(run / "withheld"), "--id", "1"],
                 ["compare", str(finished_run / "withheld"), str(run / "withheld"), "--html", "--output",
                  str(tmp_path / "compared")]):
        code, out, err = run_command(capsys, argv)
        assert code == 1 and err.strip().splitlines() == [err.strip()], (argv, err)
        assert err.startswith(f"Error: {episodes} line 2: "), (argv, err)


def test_calls_as_eval_writes_them_are_accepted(finished_run):
    line = json.loads((finished_run / "withheld" / "episodes.jsonl").read_text().splitlines()[0])
    assert line["turns"] and line_problem(line) is None
    line["turns"] = [{"assistant": "a", "calls": [{"tool": "run_query", "args": "not an object"}, {"tool": "x"}],
                      "observation": ""}]
    assert line_problem(dict(line, official=0.5, step=3)) is None


# ----------------------------------------------------------------------------------- an earlier mode's garbage
def test_adding_a_mode_beside_a_damaged_one_writes_the_report(finished_run, demo_dir, tmp_path, capsys):
    def garbage(lines):
        return [lines[0], "{not json", dict(lines[1], step="x"), lines[2], '{"question_id": "cut off']

    run, episodes = copy_with_lines(finished_run, tmp_path, garbage)
    (run / "report.html").unlink()
    capsys.readouterr()
    argv = eval_argv(demo_dir, run)
    argv[argv.index("withheld")] = "single"
    summaries = evaluate(eval_config(argv))
    err = capsys.readouterr().err
    assert set(summaries) == {"single"} and "Traceback" not in err
    assert f"Warning: report.html leaves out 3 damaged line(s) of {episodes} (first: line 2: not valid JSON)" in err
    page = (run / "report.html").read_text(encoding="utf-8")
    data = json.loads(page.split('<script type="application/json" id="data">')[1].split("</script>")[0])
    assert sorted(e["mode"] for e in data["episodes"]) == ["single"] * 3 + ["withheld"] * 2
    assert set(json.loads((run / "summary.json").read_text())["modes"]) == {"withheld", "single"}


# -------------------------------------------------------------------------------------------- a training run
def training_run(tmp_path, finished_run, rows: list[dict]):
    import pandas as pd

    completions = tmp_path / "train" / "completions"
    completions.mkdir(parents=True)
    episode = (finished_run / "withheld" / "episodes.jsonl").read_text().splitlines()[0]
    rows = [{"step": 1, "episode": episode, "dense": 1.0, "advantage": 0.0, "tier": "equivalent", **row}
            for row in rows]
    pd.DataFrame(rows).to_parquet(completions / "completions_00001.parquet")
    return tmp_path / "train", completions / "completions_00001.parquet"


def test_a_training_run_shows_its_episodes(finished_run, tmp_path, capsys):
    run, _ = training_run(tmp_path, finished_run, [{}, {"step": 2}])
    code, out, _ = run_command(capsys, ["show", str(run)])
    assert code == 0 and "2 of 2 episodes" in out


@pytest.mark.parametrize("row, problem", [
    ({"episode": "{not json"}, "'episode' is not an episode record in JSON"),
    ({"episode": "[1, 2]"}, "is a JSON list, not an object"),
    ({"episode": json.dumps({"question_id": "1", "turns": [{"calls": [5]}]})}, "turn 0's calls must be objects"),
    ({"step": "x"}, "'step' must be a whole number"),
    ({"step": float("nan")}, "'step' must be a whole number"),
    ({"dense": "high"}, "the rewards must be numbers"),
])
def test_a_damaged_completions_row_is_one_error_line(finished_run, tmp_path, capsys, row, problem):
    run, parquet = training_run(tmp_path, finished_run, [row, row])  # a parquet column holds one type
    code, _, err = run_command(capsys, ["show", str(run)])
    assert code == 1 and err.strip().splitlines() == [err.strip()], err
    assert err.startswith(f"Error: {parquet} row 1: {problem}"), err


def test_a_cut_off_completions_file_is_one_error_line(finished_run, tmp_path, capsys):
    run, parquet = training_run(tmp_path, finished_run, [{}])
    parquet.write_bytes(parquet.read_bytes()[:100])
    for argv in (["show", str(run)], ["show", str(parquet)]):
        code, _, err = run_command(capsys, argv)
        assert code == 1 and err.strip().splitlines() == [err.strip()], err
        assert err.startswith(f"Error: {parquet} cannot be read as parquet: "), err
