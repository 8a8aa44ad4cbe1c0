"""`score`: both predictions formats, the output files, bad input, and real BIRD / Spider data."""

from __future__ import annotations

import dataclasses
import json
import re
import sqlite3

import pytest

from t2s.env import databases
from t2s.env.databases import limits
from t2s.commands import main
from t2s.data.loaders import load_json_rows
from t2s.scoring.metrics import score_sql
from t2s.errors import EvalError
from t2s.evaluation.score import read_predictions, score_files

SEP = "\t----- bird -----\t"
LINE_KEYS = {"question_id", "db_id", "difficulty", "official", "strict", "soft_f1", "error", "unscored"}
SUMMARY_KEYS = {"n", "questions", "execution_accuracy_official", "strict", "soft_f1", "per_difficulty", "missing",
                "missing_ids", "errors", "error_ids", "gold_failures", "gold_failure_ids", "skipped_missing_dbs",
                "missing_db_ids", "skipped_unusable_dbs", "unusable_db_ids", "unusable_dbs", "repeated_question_ids"}
SLOW_SQL = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


@pytest.fixture()
def bird_dir(tmp_path):
    """A tiny BIRD-layout dev set: dev.json plus dev_databases/heroes/heroes.sqlite."""
    db_dir = tmp_path / "dev_databases" / "heroes"
    db_dir.mkdir(parents=True)
    conn = sqlite3.connect(db_dir / "heroes.sqlite")
    conn.executescript(
        """
        CREATE TABLE hero (id INTEGER PRIMARY KEY, name TEXT, height REAL);
        INSERT INTO hero VALUES (1, 'Ann', 1.5), (2, 'Bob', NULL), (3, 'Cy', 2.0);
        """
    )
    conn.commit()
    conn.close()
    questions = [
        ("SELECT name FROM hero WHERE id = 1", "simple"),
        ("SELECT name, height FROM hero ORDER BY id", "moderate"),
        ("SELECT count(*) FROM hero", "simple"),
        ("SELECT nope FROM hero", "challenging"),  # gold that errors
    ]
    data = [{"question_id": 100 + i, "db_id": "heroes", "question": f"q{i}", "evidence": "", "SQL": sql,
             "difficulty": difficulty} for i, (sql, difficulty) in enumerate(questions)]
    (tmp_path / "dev.json").write_text(json.dumps(data))
    return tmp_path


def _write(path, obj):
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


def _lines(out):
    return [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]


def _summary(out):
    return json.loads((out / "summary.json").read_text())


def test_bird_format_with_every_kind_of_bad_prediction(bird_dir, tmp_path, capsys):
    predictions = _write(tmp_path / "predict_dev.json", {
        "0": "SELECT name FROM hero WHERE name = 'Ann'" + SEP + "heroes",
        "1": "SELECT height, name FROM hero" + SEP + "other_db",  # column order wrong, db_id disagrees
        # "2" missing
        "3": "SELECT nope FROM hero" + SEP + "heroes",  # gold errors: not scored, not blamed on the prediction
        "7": "SELECT 1" + SEP + "heroes",  # no such position
        "x": "SELECT 1",
    })
    out = tmp_path / "out"
    assert main(["score", "--data", str(bird_dir / "dev.json"), "--predictions", str(predictions), "--output",
                 str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    lines = _lines(out)
    assert [set(line) for line in lines] == [LINE_KEYS] * 4
    assert [line["question_id"] for line in lines] == ["100", "101", "102", "103"]
    assert [line["official"] for line in lines] == [1, 0, 0, None]
    assert lines[2]["error"] == "Error: no prediction for this question"
    assert lines[3]["error"].startswith("Error: the gold SQL failed") and lines[3]["unscored"] == "gold failed"
    assert lines[3]["strict"] is None and lines[3]["soft_f1"] is None
    summary = _summary(out)
    assert set(summary) == SUMMARY_KEYS
    # n counts the questions scored, as eval's summary does: the gold failure is in questions only
    assert summary["n"] == 3 and summary["questions"] == 4
    assert summary["execution_accuracy_official"] == pytest.approx(1 / 3)
    assert summary["missing"] == 1 and summary["missing_ids"] == ["102"]
    assert summary["errors"] == 0 and summary["error_ids"] == []
    assert summary["gold_failures"] == 1 and summary["gold_failure_ids"] == ["103"]
    assert summary["per_difficulty"]["simple"]["n"] == 2
    assert summary["per_difficulty"]["simple"]["execution_accuracy_official"] == 0.5
    # a group where nothing could be scored has no average (not an accuracy of 0), and the table says so
    assert summary["per_difficulty"]["challenging"] == {"n": 0, "questions": 1, "execution_accuracy_official": None,
                                                         "strict": None, "soft_f1": None}
    assert re.search(r"challenging\W+1\W+0\W+-\W+-\W+-", printed), printed
    problems = json.loads((out / "problems.json").read_text())
    assert sorted(problems["unknown_ids"]) == ["7", "x"]
    assert problems["db_id_mismatches"] == [{"question_id": "101", "data": "heroes", "prediction": "other_db"}]
    assert "not in the data" in printed and "db_id other than the data's" in printed
    assert "their gold SQL fails" in printed and "failed or were blank" not in printed
    evaluated = tmp_path / "eval"  # the same questions played by eval: the same n, the gold failure left out of both
    assert main(["eval", "--policy", "gold", "--data", str(bird_dir / "dev.json"), "--output", str(evaluated),
                 "--quiet"]) == 0
    assert json.loads((evaluated / "summary.json").read_text())["modes"]["full"]["n"] == summary["n"]
    assert problems["gold_failure_ids"] == ["103"]


def test_jsonl_format_non_string_and_blank_sql_score_zero(bird_dir, tmp_path):
    gold_empty = bird_dir / "dev.json"
    data = json.loads(gold_empty.read_text())
    data[2]["SQL"] = "SELECT name FROM hero WHERE id > 99"  # an empty gold result
    gold_empty.write_text(json.dumps(data))
    predictions = _write(tmp_path / "p.jsonl", "\n".join(json.dumps(x) for x in [
        {"question_id": 100, "sql": 42},
        {"question_id": "101", "sql": "SELECT name, height FROM hero"},
        {"question_id": "102", "sql": "   "},  # BIRD would call this correct, the gold being empty
        {"question_id": "103", "sql": None},  # its gold SQL fails: not scored, whatever the prediction
        {"question_id": "999", "sql": "SELECT 1"},
    ]))
    result = score_files(gold_empty, predictions, tmp_path / "out", progress=False)
    lines = result["lines"]
    assert [line["official"] for line in lines] == [0, 1, 0, None]
    assert [line["strict"] for line in lines] == [0, 1, 0, None]
    assert "not a string" in lines[0]["error"] and "blank" in lines[2]["error"]
    assert lines[3]["unscored"] == "gold failed"
    assert result["problems"]["unknown_ids"] == ["999"]
    assert result["summary"]["errors"] == 2 and result["summary"]["missing"] == 0
    assert result["summary"]["gold_failure_ids"] == ["103"]


def test_gold_timeout_is_reported_and_never_correct(bird_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "LIMITS", dataclasses.replace(limits.LIMITS, scoring_max_timeout=0.2))
    data = json.loads((bird_dir / "dev.json").read_text())
    data[0]["SQL"] = SLOW_SQL
    (bird_dir / "dev.json").write_text(json.dumps(data))
    predictions = _write(tmp_path / "p.jsonl", json.dumps({"question_id": 100, "sql": SLOW_SQL}))
    lines = score_files(bird_dir / "dev.json", predictions, tmp_path / "out", progress=False)["lines"]
    assert lines[0]["official"] is None and "gold SQL failed" in lines[0]["error"]
    assert "timed out" in lines[0]["error"] and lines[0]["unscored"] == "gold failed"


def test_score_sql_prediction_timeout_and_over_cap(bird_dir, monkeypatch):
    ref = databases.benchmark_db(bird_dir / "dev_databases" / "heroes" / "heroes.sqlite", "heroes")
    monkeypatch.setattr(limits, "LIMITS", dataclasses.replace(limits.LIMITS, scoring_min_timeout=0.2))
    slow = score_sql(ref, SLOW_SQL, "SELECT count(*) FROM hero")
    assert slow["official"] == 0 and "timed out" in slow["error"]
    gold = "SELECT name FROM hero"
    assert score_sql(ref, "SELECT name FROM hero ORDER BY name DESC", gold)["official"] == 1
    monkeypatch.setattr(limits, "LIMITS", dataclasses.replace(limits.LIMITS, scoring_max_cells=4))
    over = score_sql(ref, "SELECT h.name FROM hero h, hero h2", gold)  # same row set, past the cap
    assert over["official"] == 0 and over["soft_f1"] == 0.0 and "cap" in over["error"]


@pytest.mark.parametrize("content, needle", [
    ("", "is empty"),
    ("  \n", "is empty"),
    ('{"0": "SELECT 1"', "not valid JSON"),
    ('{"question_id": 1, "sql": "SELECT 1"}\n{"question_id": 2, "sql": ', "line 2"),
    ('[1, 2]', "row 0"),
    ("{}", "holds no predictions ({})"),  # an empty predictions object is an error, not 0 of n
    ("[]\n", "holds no predictions ([])"),
    ('{"0": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),  # past Python's recursion limit
    ('{"question_id": 100, "sql": ' + "[" * 100_000 + "]" * 100_000 + "}\n{}", "line 1 is not valid JSON"),
    ('{"question_id": 100, "SQL": "SELECT 1"}\n{"question_id": 101, "query": "SELECT 1"}\n',
     "no entry has an 'sql' field (they have: SQL, query, question_id)"),  # not every question scored 0
    ('{"\u00b2": "SELECT 1", "' + "9" * 5000 + '": "SELECT 1"}', "has a prediction"),  # "²" is no position
])
def test_unreadable_predictions_fail_with_one_clear_line(bird_dir, tmp_path, capsys, content, needle):
    predictions = _write(tmp_path / "bad.json", content)
    code = main(["score", "--data", str(bird_dir / "dev.json"), "--predictions", str(predictions), "--output",
                 str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert err.startswith("Error:") and needle in err and "Traceback" not in err
    assert not (tmp_path / "out" / "summary.json").exists()


def test_missing_files_fail_clearly(bird_dir, tmp_path, capsys):
    assert main(["score", "--data", str(bird_dir / "dev.json"), "--predictions", str(tmp_path / "none.json"),
                 "--output", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.startswith("Error: predictions file not found")
    assert main(["score", "--data", str(tmp_path / "none.json"), "--predictions", str(tmp_path / "none.json"),
                 "--output", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.startswith("Error:")


@pytest.mark.parametrize("name", ["one.json", "one.jsonl"])
def test_a_single_prediction_record_is_read_whatever_the_file_name(bird_dir, tmp_path, name):
    predictions = _write(tmp_path / name, json.dumps({"question_id": 100, "sql": "SELECT name FROM hero WHERE id = 1"}))
    result = score_files(bird_dir / "dev.json", predictions, tmp_path / "out", progress=False)
    assert [line["official"] for line in result["lines"]] == [1, 0, 0, 0]
    assert result["summary"]["missing"] == 3


# ------------------------------------------------------------------------------------------------ real data


def _bird_predictions(path, records, pick):
    return _write(path, {str(i): pick(i) + SEP + r["db_id"] for i, r in enumerate(records)})


def _other_question_sql(records, key):
    """For each question, the gold SQL of the next question on the same database whose SQL differs."""
    def norm(sql):
        return " ".join(sql.lower().split())

    out = []
    for i, record in enumerate(records):
        later = records[i + 1:] + records[:i]
        out.append(next(r[key] for r in later if r["db_id"] == record["db_id"] and norm(r[key]) != norm(record[key])))
    return out


def _counts_add_up(summary, lines):
    clean = [line for line in lines if line["error"] is None]
    assert summary["questions"] == len(lines) == summary["n"] + summary["gold_failures"]
    assert summary["n"] == summary["missing"] + summary["errors"] + len(clean)
    assert len(summary["missing_ids"]) == summary["missing"] and len(summary["error_ids"]) == summary["errors"]
    assert not set(summary["missing_ids"]) & set(summary["error_ids"])
    for key in ("n", "questions"):
        assert sum(part[key] for part in summary["per_difficulty"].values()) == summary[key]


def test_superhero_gold_scores_one_and_shifted_scores_near_zero(bird_superhero_dir, tmp_path):
    records = json.loads((bird_superhero_dir / "dev.json").read_text())
    gold = _bird_predictions(tmp_path / "gold.json", records, lambda i: records[i]["SQL"])
    result = score_files(bird_superhero_dir / "dev.json", gold, tmp_path / "gold", progress=False)
    summary = result["summary"]
    assert summary["n"] == 129
    assert summary["execution_accuracy_official"] == summary["strict"] == summary["soft_f1"] == 1.0
    assert summary["missing"] == summary["errors"] == 0
    assert set(summary["per_difficulty"]) == {"simple", "moderate", "challenging"}
    _counts_add_up(summary, result["lines"])

    others = _other_question_sql(records, "SQL")
    shifted = _bird_predictions(tmp_path / "shift.json", records, lambda i: others[i])
    result = score_files(bird_superhero_dir / "dev.json", shifted, tmp_path / "shift", progress=False)
    summary = result["summary"]
    assert summary["execution_accuracy_official"] < 0.05
    assert summary["strict"] <= summary["execution_accuracy_official"]
    assert summary["soft_f1"] < 0.05
    assert summary["errors"] == summary["missing"] == 0
    _counts_add_up(summary, result["lines"])


def test_spider_gold_scores_one_and_wta_1_stops_the_run_or_is_skipped(spider_dev_dir, tmp_path):
    """Spider dev's wta_1 has no database: as in eval, score stops naming it, or skips and counts its questions."""
    records = json.loads((spider_dev_dir / "dev.json").read_text())
    gold = _write(tmp_path / "gold.jsonl", "\n".join(
        json.dumps({"question_id": f"spider_dev:{i}", "sql": r["query"]}) for i, r in enumerate(records)))
    with pytest.raises(EvalError, match="1 database\\(s\\) missing under .*: wta_1 .*--skip-missing-dbs"):
        score_files(spider_dev_dir / "dev.json", gold, tmp_path / "refused", progress=False)
    assert not (tmp_path / "refused").exists()
    result = score_files(spider_dev_dir / "dev.json", gold, tmp_path / "gold", progress=False, skip_missing_dbs=True)
    summary, lines = result["summary"], result["lines"]
    wta = [f"spider_dev:{i}" for i, r in enumerate(records) if r["db_id"] == "wta_1"]
    assert len(wta) == 62
    assert summary["n"] == 1034 - 62 and summary["skipped_missing_dbs"] == 62 and summary["missing_db_ids"] == ["wta_1"]
    assert summary["execution_accuracy_official"] == summary["strict"] == summary["soft_f1"] == 1.0
    assert summary["errors"] == 0 and summary["missing"] == 0
    assert not [line for line in lines if line["db_id"] == "wta_1"]
    assert result["problems"]["missing_databases"] == ["wta_1"] and result["problems"]["unscorable_ids"] == []
    _counts_add_up(summary, lines)

    others = _other_question_sql(records, "query")
    shifted = _write(tmp_path / "shift.jsonl", "\n".join(
        json.dumps({"question_id": f"spider_dev:{i}", "sql": sql}) for i, sql in enumerate(others)))
    result = score_files(spider_dev_dir / "dev.json", shifted, tmp_path / "shift", progress=False,
                         skip_missing_dbs=True)
    assert result["summary"]["execution_accuracy_official"] < 0.1
    assert result["summary"]["strict"] <= result["summary"]["execution_accuracy_official"]
    assert result["summary"]["errors"] == 0 and result["summary"]["skipped_missing_dbs"] == 62
    _counts_add_up(result["summary"], result["lines"])


# ------------------------------------------------------------------------------- one reader, one rule, as eval


def _with_missing_database(bird_dir):
    """bird_dir's data plus two questions on a database that is not there."""
    data = json.loads((bird_dir / "dev.json").read_text())
    data += [{"question_id": 200 + i, "db_id": "gone", "question": f"g{i}", "evidence": "", "SQL": "SELECT 1",
              "difficulty": "simple"} for i in range(2)]
    (bird_dir / "dev.json").write_text(json.dumps(data))
    return bird_dir / "dev.json"


def test_questions_on_a_missing_database_follow_evals_rule_whatever_was_predicted(bird_dir, tmp_path, capsys):
    data = _with_missing_database(bird_dir)
    on_present = [{"question_id": q, "sql": "SELECT name FROM hero WHERE id = 1"} for q in (100, 101, 102, 103)]
    files = {
        "with": _write(tmp_path / "with.jsonl", "\n".join(json.dumps(p) for p in on_present + [
            {"question_id": 200, "sql": "SELECT 1"}, {"question_id": 201, "sql": "SELECT 1"}])),
        "without": _write(tmp_path / "without.jsonl", "\n".join(json.dumps(p) for p in on_present)),
    }
    for name, predictions in files.items():  # without the option: stopped at start-up, as eval is
        code = main(["score", "--data", str(data), "--predictions", str(predictions), "--output",
                     str(tmp_path / f"refused-{name}"), "--quiet"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and len(err) == 1, err
        assert err[0].startswith("Error: 1 database(s) missing under") and "gone" in err[0]
        assert "--skip-missing-dbs" in err[0] and not (tmp_path / f"refused-{name}").exists()
    summaries = {}
    for name, predictions in files.items():
        assert main(["score", "--data", str(data), "--predictions", str(predictions), "--output",
                     str(tmp_path / name), "--quiet", "--skip-missing-dbs"]) == 0
        printed = capsys.readouterr().out
        assert "Warning: 2 questions skipped, their database missing: gone" in printed
        summaries[name] = _summary(tmp_path / name)
        assert [line["question_id"] for line in _lines(tmp_path / name)] == ["100", "101", "102", "103"]
    assert summaries["with"] == summaries["without"]  # the denominator does not depend on what was predicted
    assert summaries["with"]["questions"] == 4 and summaries["with"]["missing"] == 0  # 103's gold fails: n is 3
    assert summaries["with"]["skipped_missing_dbs"] == 2 and summaries["with"]["missing_db_ids"] == ["gone"]

    eval_out = tmp_path / "eval"  # eval skips and counts the same questions
    assert main(["eval", "--policy", "predictions", "--predictions", str(files["with"]), "--data", str(data),
                 "--output", str(eval_out), "--quiet", "--skip-missing-dbs"]) == 0
    eval_summary = json.loads((eval_out / "summary.json").read_text())["modes"]["full"]
    assert eval_summary["skipped_missing_dbs"] == 2 and eval_summary["missing_db_ids"] == ["gone"]
    assert eval_summary["n"] == summaries["with"]["n"] == 3


def test_eval_and_score_print_the_same_warnings_for_one_predictions_file(bird_dir, tmp_path, capsys):
    predictions = _write(tmp_path / "p.jsonl", "\n".join(json.dumps(p) for p in [
        {"question_id": 100, "sql": "SELECT name FROM hero WHERE id = 1", "db_id": "heroes"},
        {"question_id": 101, "sql": "SELECT 1", "db_id": "other_db"},  # db_id disagrees with the data
        {"question_id": 101, "sql": "SELECT name, height FROM hero ORDER BY id"},  # predicted twice
        {"question_id": 999, "sql": "SELECT 1"},  # not in the data
        {"question_id": "[bold]x[/bold]", "sql": "SELECT 1"},  # markup is data
    ]))  # 102 and 103 have no prediction
    rows = list(load_json_rows(bird_dir / "dev.json"))
    expected = read_predictions(predictions, rows).warnings
    assert [line.split(" ", 2)[1] for line in expected] == ["questions", "prediction", "questions", "predictions"]
    assert expected[0] == "2 questions have no prediction (scored 0): 102, 103"
    assert expected[1] == "2 prediction ids are not in the data (ignored): 999, [bold]x[/bold]"
    assert expected[2] == "1 questions are predicted more than once (the last one is scored): 101"
    assert expected[3] == ("1 predictions name a db_id other than the data's (the data's is used): "
                           "101 (other_db vs heroes)")

    def warnings(argv):
        assert main(argv) == 0
        return [line for line in capsys.readouterr().out.splitlines() if line.startswith("Warning:")]

    scored = warnings(["score", "--data", str(bird_dir / "dev.json"), "--predictions", str(predictions), "--output",
                       str(tmp_path / "score"), "--quiet"])
    evaluated = warnings(["eval", "--policy", "predictions", "--predictions", str(predictions), "--data",
                          str(bird_dir / "dev.json"), "--output", str(tmp_path / "eval"), "--quiet"])
    assert evaluated == [f"Warning: {line}" for line in expected]
    assert scored[: len(expected)] == evaluated
    problems = json.loads((tmp_path / "score" / "problems.json").read_text())
    assert problems["duplicate_ids"] == ["101"] and problems["unknown_ids"] == ["999", "[bold]x[/bold]"]


def test_predictions_that_match_no_question_are_refused_by_score_and_eval(bird_dir, tmp_path, capsys):
    """A predictions file of another data set: every question would score 0 for a missing prediction, which looks
    like a result. Both readers refuse it with one line, before anything is written."""
    predictions = _write(tmp_path / "p.jsonl", "\n".join(json.dumps({"question_id": f"x{i}", "sql": "SELECT 1"})
                                                         for i in range(3)))
    for argv in (["score", "--output", str(tmp_path / "score")],
                 ["eval", "--policy", "predictions", "--output", str(tmp_path / "eval")]):
        code = main([*argv, "--data", str(bird_dir / "dev.json"), "--predictions", str(predictions), "--quiet"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and len(err) == 1, err
        assert err[0] == (f"Error: none of the 4 questions to score (such as 100, 101, 102 and 1 more) has a "
                          f"prediction in {predictions}, which predicts 0 other questions of the data and 3 ids not "
                          "in it (x0, x1, x2); check that the predictions, the data and --n go together")
        assert not (tmp_path / argv[-1].rsplit("/", 1)[-1] / "summary.json").exists()


def test_score_where_no_gold_sql_runs_fails_after_writing_its_files(bird_dir, tmp_path, capsys):
    data = json.loads((bird_dir / "dev.json").read_text())
    (bird_dir / "dev.json").write_text(json.dumps([dict(row, SQL="SELECT nope FROM hero") for row in data]))
    for predicted, failures in (([100, 101, 102, 103], 4), ([100], 1)):  # every question predicted, or one
        predictions = _write(tmp_path / "p.jsonl", "\n".join(json.dumps({"question_id": q, "sql": "SELECT 1"})
                                                             for q in predicted))
        code = main(["score", "--data", str(bird_dir / "dev.json"), "--predictions", str(predictions), "--output",
                     str(tmp_path / "out"), "--quiet"])
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Error:")]
        assert code == 1 and err == [f"Error: no question could be scored: the gold SQL of every one of the {failures} "
                                     "predicted questions fails on its database (see the warning above); check "
                                     "--data and --db-root"]
        assert _summary(tmp_path / "out")["gold_failures"] == failures


def test_predictions_of_other_questions_than_the_picked_ones_are_refused_naming_them(bird_dir, tmp_path, capsys):
    predictions = _write(tmp_path / "p.jsonl", json.dumps({"question_id": 103, "sql": "SELECT 1"}))
    rows = list(load_json_rows(bird_dir / "dev.json"))
    with pytest.raises(Exception, match=r"none of the 2 questions to score \(such as 100, 101\) has a prediction in "
                                        r".*, which predicts 1 other questions of the data \(on (\w+)\) and 0 ids "
                                        r"not in it; ") as raised:
        read_predictions(predictions, rows, rows[:2])
    assert raised.match(rf"\(on {re.escape(str(rows[3]['db_id']))}\)")  # where they are: a database left out, say
    assert read_predictions(predictions, rows, rows[2:]).missing_ids == ["102"]  # one predicted among them: a result


def test_an_eval_where_no_final_sql_ran_says_so_in_one_line(bird_dir, tmp_path, capsys):
    rows = json.loads((bird_dir / "dev.json").read_text())
    predictions = _write(tmp_path / "p.jsonl", "\n".join(
        json.dumps({"question_id": row["question_id"], "sql": "SELECT nope FROM nowhere"}) for row in rows))
    assert main(["eval", "--policy", "predictions", "--predictions", str(predictions), "--data",
                 str(bird_dir / "dev.json"), "--output", str(tmp_path / "eval")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "none of the 3 played episodes' final SQL ran (executes_rate 0): each scored 0; the error column of " \
           "scores.jsonl says why" in out  # the fourth question's gold fails: it is not scored
    predictions.write_text(json.dumps({"question_id": rows[0]["question_id"], "sql": "SELECT 1"}))  # one runs
    assert main(["eval", "--policy", "predictions", "--predictions", str(predictions), "--data",
                 str(bird_dir / "dev.json"), "--output", str(tmp_path / "eval2")]) == 0
    assert "final SQL ran" not in capsys.readouterr().out


def test_a_question_the_data_repeats_is_scored_and_counted_once_as_eval_counts_it(bird_dir, tmp_path, capsys):
    """BIRD mini-dev repeats two questions word for word; BIRD's predictions are keyed by position, so each repeat
    has its own entry. The question is scored once (one scores.jsonl line, which compare needs), n counts it once,
    as eval does, and no prediction is called a duplicate."""
    data = json.loads((bird_dir / "dev.json").read_text())[:3]  # without the question whose gold SQL fails
    data.insert(2, dict(data[0]))  # position 2 repeats position 0
    _write(bird_dir / "dev.json", data)
    predictions = _write(tmp_path / "predict_dev.json", {str(i): row["SQL"] + SEP + "heroes"
                                                         for i, row in enumerate(data)})
    out = tmp_path / "out"
    assert main(["score", "--data", str(bird_dir / "dev.json"), "--predictions", str(predictions), "--output",
                 str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert [line["question_id"] for line in _lines(out)] == ["100", "101", "102"]
    summary = _summary(out)
    assert summary["n"] == 3 and summary["execution_accuracy_official"] == 1.0
    assert summary["repeated_question_ids"] == ["100"]
    assert json.loads((out / "problems.json").read_text())["duplicate_ids"] == []
    assert "more than once" not in printed and "repeats questions word for word, each counted once: 100" in printed
    lines = _write(tmp_path / "p.jsonl", "\n".join(json.dumps({"question_id": row["question_id"], "sql": row["SQL"]})
                                                    for row in data))  # a line per data row: 100 twice
    again = score_files(bird_dir / "dev.json", lines, tmp_path / "jsonl", progress=False)
    assert again["summary"]["n"] == 3 and again["problems"]["duplicate_ids"] == []
    evaluated = tmp_path / "eval"
    assert main(["eval", "--policy", "gold", "--data", str(bird_dir / "dev.json"), "--output", str(evaluated),
                 "--quiet"]) == 0
    assert json.loads((evaluated / "summary.json").read_text())["modes"]["full"]["n"] == summary["n"]


def test_per_difficulty_comes_in_birds_order_with_averages_to_six_places_as_eval_writes_them(demo_dir, tmp_path):
    """score's per_difficulty runs simple, moderate, challenging (as eval's does, not alphabetically), and its
    averages are rounded to 6 places, as eval's are: the two summaries of one run's predictions read alike."""
    records = json.loads((demo_dir / "dev.json").read_text())
    wrong = {i for i, r in enumerate(records) if sum(x["difficulty"] == r["difficulty"] for x in records[:i]) % 3 == 0}
    predictions = _bird_predictions(tmp_path / "p.json", records,
                                    lambda i: "SELECT 1" if i in wrong else records[i]["SQL"])
    summary = score_files(demo_dir / "dev.json", predictions, tmp_path / "out", progress=False)["summary"]
    assert list(summary["per_difficulty"]) == ["simple", "moderate", "challenging"]
    unrounded = 0
    for name, block in [("all", summary), *summary["per_difficulty"].items()]:
        group = [i for i, r in enumerate(records) if name in ("all", r["difficulty"])]
        exact = sum(i not in wrong for i in group) / len(group)
        unrounded += exact != round(exact, 6)
        assert block["execution_accuracy_official"] == round(exact, 6), (name, block)
    assert unrounded  # a group whose average the rounding changes (17/26, 8/12)
