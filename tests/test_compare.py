"""`compare`: pairing two runs on question_id, McNemar, bootstrap CI, and the error cases."""

from __future__ import annotations

import json

import pytest

from t2s.commands import main
from t2s.evaluation.compare import compare_runs
from t2s.scoring.metrics import mcnemar_exact

REPORT_KEYS = {"n", "acc_a", "acc_b", "delta", "ci_low", "ci_high", "mcnemar_p", "only_a", "only_b", "not_scored"}


def _scores(path, values, key="official", extra=None):
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "scores.jsonl", "w") as handle:
        for i, value in enumerate(values):
            handle.write(json.dumps({"question_id": f"q{i}", "db_id": "d", "difficulty": None, key: value,
                                     "strict": value, "soft_f1": value, "error": None, **(extra or {})}) + "\n")
    return path


def test_hand_computed_comparison(tmp_path, capsys):
    # 20 questions: both right 5, only A 2, only B 10, both wrong 3
    a = [1] * 5 + [1] * 2 + [0] * 10 + [0] * 3
    b = [1] * 5 + [0] * 2 + [1] * 10 + [0] * 3
    run_a, run_b = _scores(tmp_path / "a", a), _scores(tmp_path / "b", b)
    out = tmp_path / "report"
    assert main(["compare", str(run_a), str(run_b), "--output", str(out)]) == 0
    report = json.loads((out / "compare.json").read_text())
    assert set(report) == REPORT_KEYS
    assert report["n"] == 20 and report["only_a"] == 2 and report["only_b"] == 10
    assert report["acc_a"] == pytest.approx(7 / 20) and report["acc_b"] == pytest.approx(15 / 20)
    assert report["delta"] == pytest.approx(0.4)
    assert report["mcnemar_p"] == pytest.approx(0.0386, abs=5e-5)
    assert report["ci_low"] < 0.4 < report["ci_high"] and report["ci_low"] > 0
    printed = capsys.readouterr().out
    assert '"mcnemar_p"' in printed and "only_b" in printed
    # the console names which run is A and which is B, and what each figure means
    assert f"A = {run_a}\nB = {run_b}\n" in printed
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.split("│")[1:-1]]
                                               for line in printed.splitlines() if line.startswith("│"))}
    assert rows["acc_a"] == ["0.3500", "official accuracy of A"]
    assert rows["acc_b"] == ["0.7500", "official accuracy of B"]
    assert rows["only_b"] == ["10", "questions B got right and A wrong"]
    # deterministic: the same report again
    assert compare_runs(run_a, run_b) == compare_runs(run_a, run_b)


def test_a_tiny_p_value_is_not_shown_as_zero(tmp_path, capsys):
    run_a, run_b = _scores(tmp_path / "a", [1] * 40), _scores(tmp_path / "b", [0] * 40)
    assert main(["compare", str(run_a), str(run_b)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "mcnemar_p" in line and "│" in line)
    assert "1.82e-12" in row


def test_episodes_file_uses_sample_zero(tmp_path):
    run_a = _scores(tmp_path / "a", [1, 0, 1])
    episodes = tmp_path / "b" / "episodes.jsonl"
    episodes.parent.mkdir()
    lines = []
    for i, (s0, s1) in enumerate([(0, 1), (1, 0), (1, 1)]):
        lines.append({"question_id": f"q{i}", "sample": 1, "official": s1, "strict": s1})
        lines.append({"question_id": f"q{i}", "sample": 0, "official": s0, "strict": s0})
    episodes.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    report = compare_runs(run_a, tmp_path / "b")
    assert (report["acc_b"], report["only_a"], report["only_b"]) == (pytest.approx(2 / 3), 1, 1)
    assert compare_runs(run_a, episodes) == report  # the file path works too


def test_strict_metric(tmp_path):
    run_a = _scores(tmp_path / "a", [1, 1])
    run_b = tmp_path / "b"
    run_b.mkdir()
    (run_b / "scores.jsonl").write_text("\n".join(json.dumps({"question_id": f"q{i}", "official": 1, "strict": s})
                                                  for i, s in enumerate([1, 0])))
    assert compare_runs(run_a, run_b, "official")["delta"] == 0.0
    strict = compare_runs(run_a, run_b, "strict")
    assert strict["delta"] == pytest.approx(-0.5) and strict["mcnemar_p"] == mcnemar_exact(1, 0)


def test_mismatched_question_sets_fail_with_counts(tmp_path, capsys):
    run_a = _scores(tmp_path / "a", [1, 0, 1, 1])
    run_b = _scores(tmp_path / "b", [1, 0])
    assert main(["compare", str(run_a), str(run_b)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("Error:") and "0 of B's questions are missing from A" in err
    assert "2 of A's are missing from B" in err and "\n" not in err


def test_unscored_questions_are_left_out_of_both(tmp_path):
    run_a = _scores(tmp_path / "a", [1, None, 0])
    run_b = _scores(tmp_path / "b", [1, None, 1])
    report = compare_runs(run_a, run_b)
    assert report["n"] == 2 and report["not_scored"] == 1 and report["only_b"] == 1


def test_unreadable_runs(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["compare", str(empty), str(empty)]) == 1
    assert "neither scores.jsonl nor episodes.jsonl" in capsys.readouterr().err
    for mode in ("full", "withheld"):  # the root of a several-mode eval: the message names its mode folders
        (empty / mode).mkdir()
        (empty / mode / "eval_config.json").write_text("{}")
        (empty / mode / "episodes.jsonl").write_text('{"question_id": "q0", "official": 1}\n')
    assert main(["compare", str(empty), str(empty)]) == 1
    assert f"is an eval of several modes: name one of {empty / 'full'}, {empty / 'withheld'}" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": "q0", "official": 1}\n{oops\n')
    assert main(["compare", str(bad), str(bad)]) == 1
    assert capsys.readouterr().err.startswith("Error:")
    assert main(["compare", str(tmp_path / "nope"), str(bad)]) == 1
    assert "run not found" in capsys.readouterr().err


@pytest.mark.parametrize("line, problem", [
    ('{"question_id": "q0", "official": 1, "sample": 1e400}', "'sample' must be a whole number of 0 or more"),
    ('{"question_id": "q0", "official": 1, "sample": NaN}', "'sample' must be a whole number of 0 or more"),
    ('{"question_id": "q0", "official": NaN}', "'official' must be a number from 0 to 1"),
    ('{"question_id": "q0", "official": Infinity}', "'official' must be a number from 0 to 1"),
    ('{"question_id": "q0", "official": 0.5, "sample": -1}', "'sample' must be a whole number of 0 or more"),
])
def test_a_line_compare_would_misread_is_refused_as_show_refuses_it(tmp_path, capsys, line, problem):
    """compare reads a run's lines with show's reader: an infinite or NaN sample once raised a traceback, and a NaN
    or infinite score was counted as wrong or right."""
    run = tmp_path / "run.jsonl"
    run.write_text(line + "\n")
    assert main(["compare", str(run), str(run)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"Error: {run} line 1: {problem}") and "Traceback" not in err
    assert main(["show", str(run)]) == 1 and problem in capsys.readouterr().err


def test_a_mode_folder_without_scores_and_a_cut_off_last_line(tmp_path, capsys):
    """A mode folder holding no per-question file is one line, not a traceback; a last line cut off by a killed run is
    left out as show leaves it out, while a complete last line without its newline is kept."""
    (tmp_path / "m" / "full").mkdir(parents=True)
    (tmp_path / "m" / "full" / "eval_config.json").write_text("{}")
    run = _scores(tmp_path / "a", [1, 0, 1])
    assert main(["compare", str(run), str(tmp_path / "m")]) == 1
    assert capsys.readouterr().err.strip() == \
        f"Error: {tmp_path / 'm' / 'full'} holds neither scores.jsonl nor episodes.jsonl"
    cut = _scores(tmp_path / "cut", [1, 0, 1])
    (cut / "scores.jsonl").write_text((cut / "scores.jsonl").read_text() + '{"question_id": "q3", "offi')
    whole = tmp_path / "whole.jsonl"
    whole.write_text((run / "scores.jsonl").read_text().rstrip("\n"))
    for other in (cut, whole):
        assert compare_runs(run, other)["n"] == 3


@pytest.mark.parametrize("reason", ["error", "prompt_too_long"])
def test_a_run_whose_every_episode_played_no_turn_is_refused(tmp_path, capsys, reason):
    """Its zeros measure its server's errors (or prompts too long for the budget), not the policy: no paired
    result, one line naming the run."""
    run_a = _scores(tmp_path / "a", [1, 1, 0])
    run_b = _scores(tmp_path / "b", [0, 0, 0])
    (run_b / "episodes.jsonl").write_text("".join(json.dumps({"question_id": f"q{i}", "sample": 0, "official": 0,
                                                             "strict": 0, "stop_reason": reason}) + "\n"
                                                  for i in range(3)))
    assert main(["compare", str(run_a), str(run_b)]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"Error: B ({run_b}): every one of its 3 episodes ended in an error or before its first "
                           "turn")
    with open(run_b / "episodes.jsonl", "a") as handle:  # another sample of each played: only sample 0 is paired
        handle.write("".join(json.dumps({"question_id": f"q{i}", "sample": 1, "official": 1, "strict": 1,
                                         "stop_reason": "submitted"}) + "\n" for i in range(3)))
    assert main(["compare", str(run_a), str(run_b)]) == 1 and "every one of its 3 episodes" in capsys.readouterr().err
    with open(run_b / "episodes.jsonl", "a") as handle:  # one played: a result, whatever it scored
        handle.write(json.dumps({"question_id": "q9", "sample": 0, "official": 0, "strict": 0,
                                 "stop_reason": "submitted"}) + "\n")
    assert compare_runs(run_a, run_b)["n"] == 3
