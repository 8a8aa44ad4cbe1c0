"""A run folder whose lines are valid JSON but not what eval writes (a hand edit, another tool's file): resuming it,
`show` and `compare --html` each refuse it with one line naming the file, the line and the key, never a traceback."""

from __future__ import annotations

import json
import shutil

import pytest

from t2s.commands import main
from t2s.commands.eval import eval_config
from t2s.errors import EvalError
from t2s.evaluation.records import line_problem
from t2s.evaluation.runner import evaluate

DAMAGES = {  # the second line of episodes.jsonl, changed so: what a reader met
    "sample": lambda line: dict(line, sample="zz"),
    "not-an-object": lambda line: [1, 2],
    "official": lambda line: dict(line, official="yes"),
    "counters": lambda line: dict(line, counters="x"),
    "counter": lambda line: dict(line, counters={**line["counters"], "turns": "two"}),
    "turns": lambda line: dict(line, turns="abc"),
    "turn-text": lambda line: dict(line, turns=[{"assistant": 5, "calls": [], "observation": None}]),
    "pred_result": lambda line: dict(line, pred_result="x"),
    "gold_result": lambda line: dict(line, gold_result={"columns": 5, "rows": []}),
    "mode": lambda line: dict(line, mode=[1]),
    "no-sample": lambda line: {key: value for key, value in line.items() if key != "sample"},
    "no-official": lambda line: {key: value for key, value in line.items() if key != "official"},
}


def eval_argv(demo_dir, output) -> list[str]:
    return ["--policy", "gold", "--data", str(demo_dir), "--n", "3", "--mode", "withheld", "--output", str(output),
            "--quiet"]


@pytest.fixture(scope="module")
def finished_run(demo_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("finished") / "run"
    evaluate(eval_config(eval_argv(demo_dir, folder)))
    return folder


def damaged_copy(finished_run, tmp_path, damage: str):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    episodes = run / "withheld" / "episodes.jsonl"
    lines = episodes.read_text().splitlines()
    lines[1] = json.dumps(DAMAGES[damage](json.loads(lines[1])))
    episodes.write_text("\n".join(lines) + "\n")
    return run, episodes


def test_every_line_eval_writes_reads_back(finished_run):
    lines = [json.loads(line) for line in (finished_run / "withheld" / "episodes.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and [line_problem(line) for line in lines] == [None, None, None]
    scores = (finished_run / "withheld" / "scores.jsonl").read_text().splitlines()
    assert [line_problem(json.loads(line)) for line in scores] == [None, None, None]


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_line_is_one_error_line_for_resume_show_and_compare(finished_run, demo_dir, tmp_path, capsys,
                                                                      damage):
    run, episodes = damaged_copy(finished_run, tmp_path, damage)
    with pytest.raises(EvalError, match=f"^Error: {episodes} line 2: .*; move the file away to start over$"):
        evaluate(eval_config(eval_argv(demo_dir, run)))
    capsys.readouterr()
    if damage.startswith("no-"):  # a training run's episodes have neither: only a resumed eval needs them
        return
    for argv in (["show", str(episodes)], ["show", str(run), "--wrong"], ["show", str(run / "withheld"), "--id", "1"],
                 ["compare", str(finished_run / "withheld"), str(run / "withheld"), "--html", "--output",
                  str(tmp_path / "compared")]):
        code = main(argv)
        out, err = capsys.readouterr()
        assert code != 0 and "Traceback" not in out + err, argv
        assert err.strip().splitlines() == [err.strip()] and err.startswith(f"Error: {episodes} line 2: "), (argv, err)


def test_line_separators_inside_json_strings_are_text(finished_run, demo_dir, tmp_path, capsys):
    """eval writes model text as it is (``ensure_ascii=False``): U+2028, U+2029 and NEL inside a turn are characters
    of a JSON string, not line ends, for resume, show and compare alike."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    episodes = run / "withheld" / "episodes.jsonl"
    lines = [json.loads(line) for line in episodes.read_text().splitlines()]
    lines[0]["turns"][0]["assistant"] = "one\u2028two\u2029three\x85four " + lines[0]["turns"][0]["assistant"]
    episodes.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    evaluate(eval_config(eval_argv(demo_dir, run)))  # resumes: nothing to play again
    assert episodes.read_text(encoding="utf-8").count("\n") == 3
    capsys.readouterr()
    assert main(["show", str(run / "withheld"), "--id", str(lines[0]["question_id"])]) == 0
    assert "one" in capsys.readouterr().out
    assert main(["compare", str(finished_run / "withheld"), str(run / "withheld"), "--html", "--output",
                 str(tmp_path / "compared")]) == 0
