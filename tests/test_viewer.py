"""The eval folder's fixed layout, the episode records a reader needs, `t2s show`, `compare --html` and report.html
(checked in headless Chromium where it is installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from t2s.commands import main

TOP_FILES = {"summary.json", "summary.md", "summary.png", "report.html"}
MODE_FILES = {"episodes.jsonl", "scores.jsonl", "eval_config.json"}


def files_of(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")}


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table_rows(printed: str) -> list[list[str]]:
    """The cells of each body row of the rich tables in ``printed``."""
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in printed.splitlines() if line.startswith("│")]


def gold_eval(demo_dir, out, *modes, n="4") -> None:
    assert main(["eval", "--policy", "gold", "--data", str(demo_dir), "--n", n, "--mode", *(modes or ("full",)),
                 "--output", str(out), "--quiet"]) == 0


def predictions_eval(demo_dir, tmp_path, out, *wrong_ids) -> None:
    """A predictions run of the whole demo data: the gold SQL, except a wrong answer for each of ``wrong_ids``."""
    records = json.loads((demo_dir / "dev.json").read_text())
    predictions = tmp_path / "p.jsonl"
    predictions.write_text("\n".join(json.dumps({"question_id": r["question_id"],
                                                 "sql": "SELECT 1" if str(r["question_id"]) in wrong_ids else r["SQL"]})
                                     for r in records))
    assert main(["eval", "--policy", "predictions", "--predictions", str(predictions), "--data", str(demo_dir),
                 "--output", str(out), "--quiet"]) == 0


# ---------------------------------------------------------------------------------------------------------- layout
def test_eval_layout_is_the_same_for_one_mode_or_several(demo_dir, tmp_path, capsys):
    gold_eval(demo_dir, tmp_path / "one")
    printed = capsys.readouterr().out
    assert f"wrote {tmp_path / 'one'}: report.html" in printed
    gold_eval(demo_dir, tmp_path / "two", "full", "withheld")
    assert files_of(tmp_path / "one") == TOP_FILES | {f"full/{name}" for name in MODE_FILES}
    assert files_of(tmp_path / "two") == TOP_FILES | {f"{m}/{name}" for m in ("full", "withheld")
                                                      for name in MODE_FILES}
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert list(summary["modes"]) == ["full", "withheld"] and summary["modes"]["withheld"]["n"] == 4

    episodes = lines_of(tmp_path / "one" / "full" / "episodes.jsonl")
    scores = lines_of(tmp_path / "one" / "full" / "scores.jsonl")
    assert len(episodes) == len(scores) == 4
    records = {str(r["question_id"]): r for r in json.loads((demo_dir / "dev.json").read_text())}
    for line in episodes:  # what a reader needs to judge the episode
        row = records[str(line["question_id"])]
        assert line["question"] == row["question"] and line["gold_sql"] == row["SQL"]
        assert line["evidence"] == (row.get("evidence") or "") and line["db_id"] == row["db_id"]
        assert line["gold_result"]["rows"] and line["gold_result"] == line["pred_result"]
        assert len(line["gold_result"]["rows"]) <= 10 and line["gold_result"]["columns"]
        assert line["submitted_sql"] and line["counters"]["submitted"]
    assert [set(s) for s in scores] == [{"question_id", "sample", "db_id", "difficulty", "official", "strict",
                                         "soft_f1", "executes", "error"}] * 4
    assert [s["official"] for s in scores] == [1] * 4


def test_a_folder_of_other_modes_takes_more_and_an_old_layout_refuses_with_one_line(demo_dir, tmp_path, capsys):
    out = tmp_path / "out"
    gold_eval(demo_dir, out)
    full = (out / "full" / "episodes.jsonl").read_text()
    assert main(["eval", "--policy", "gold", "--data", str(demo_dir), "--n", "4", "--mode", "withheld",
                 "--output", str(out), "--quiet"]) == 0  # a mode added to a finished folder
    assert (out / "full" / "episodes.jsonl").read_text() == full
    assert len(lines_of(out / "withheld" / "episodes.jsonl")) == 4
    assert list(json.loads((out / "summary.json").read_text())["modes"]) == ["full", "withheld"]
    assert main(["eval", "--policy", "gold", "--data", str(demo_dir), "--n", "4", "--mode", "full", "withheld",
                 "--output", str(out), "--quiet"]) == 0  # both finished: nothing new
    assert (out / "full" / "episodes.jsonl").read_text() == full
    assert len(lines_of(out / "withheld" / "episodes.jsonl")) == 4
    capsys.readouterr()
    old = tmp_path / "old"  # the layout of earlier versions: episodes at the top
    old.mkdir()
    (old / "episodes.jsonl").write_text('{"question_id": "1", "sample": 0}\n')
    assert main(["eval", "--policy", "gold", "--data", str(demo_dir), "--n", "4", "--output", str(old), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "older layout" in err[0] and not (old / "full").exists()


def test_compare_takes_the_folder_or_a_mode_inside_it(demo_dir, tmp_path, capsys):
    gold_eval(demo_dir, tmp_path / "a", n="63")
    wrong = str(lines_of(tmp_path / "a" / "full" / "scores.jsonl")[0]["question_id"])
    predictions_eval(demo_dir, tmp_path, tmp_path / "b", wrong)
    for a, b in ((tmp_path / "a", tmp_path / "b"), (tmp_path / "a" / "full", tmp_path / "b" / "full")):
        assert main(["compare", str(a), str(b), "--output", str(tmp_path / "cmp")]) == 0
        report = json.loads((tmp_path / "cmp" / "compare.json").read_text())
        assert report["n"] == 63 and report["only_a"] == 1 and report["only_b"] == 0


def test_compare_html_shows_the_questions_that_flipped(demo_dir, tmp_path, capsys):
    gold_eval(demo_dir, tmp_path / "a", n="63")
    wrong = str(lines_of(tmp_path / "a" / "full" / "scores.jsonl")[5]["question_id"])
    predictions_eval(demo_dir, tmp_path, tmp_path / "b", wrong)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--html"]) == 2
    assert "--output" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--output", str(tmp_path / "cmp"), "--html"]) == 0
    page = (tmp_path / "cmp" / "compare.html").read_text()
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
                      .group(1).replace("<\\/", "</"))
    assert [(e["flip"], str(e["question_id"]), e["other"]["final_sql"]) for e in data["episodes"]] == [
        ("only_a", wrong, "SELECT 1")]
    assert data["compare"]["only_a"] == 1 and "<script src" not in page and "http" not in page.split("<script")[0]
    capsys.readouterr()
    # the same folder again without --html: the page of the earlier comparison does not stay beside the new figures
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "a"), "--output", str(tmp_path / "cmp")]) == 0
    assert not (tmp_path / "cmp" / "compare.html").exists()
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["only_a"] == 0
    assert f"removed {tmp_path / 'cmp' / 'compare.html'}: it showed an earlier comparison" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------------------ show
def test_show_lists_filters_and_prints_a_transcript(demo_dir, tmp_path, capsys):
    out = tmp_path / "out"
    gold_eval(demo_dir, out, n="8")
    lines = lines_of(out / "full" / "episodes.jsonl")
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    listed = capsys.readouterr().out
    assert "8 of 8 episodes" in listed and all(f"│ {line['question_id']} " in listed for line in lines)
    db = lines[0]["db_id"]
    assert main(["show", str(out), "--db", db]) == 0
    on_db = sum(line["db_id"] == db for line in lines)
    assert f"{on_db} of 8 episodes" in capsys.readouterr().out or on_db == 1
    assert main(["show", str(out), "--wrong"]) == 0
    assert "no episode of 8 matches" in capsys.readouterr().out
    chosen = next(line for line in lines if "WHERE" in line["gold_sql"].upper())
    assert main(["show", str(out / "full"), "--id", str(chosen["question_id"])]) == 0
    shown = capsys.readouterr().out
    assert chosen["question"] in shown and "turn 1" in shown and "final SQL (submitted):" in shown
    assert "\nWHERE " in shown  # the SQL is formatted with sqlparse: WHERE opens a line
    assert "gold rows" in shown and "predicted rows" in shown and "official=1" in shown
    assert main(["show", str(tmp_path / "nothing")]) == 1
    assert capsys.readouterr().err.startswith("Error: run not found")


def test_show_a_pair_lists_only_the_flipped_questions(demo_dir, tmp_path, capsys):
    gold_eval(demo_dir, tmp_path / "a", n="63")
    wrong = str(lines_of(tmp_path / "a" / "full" / "scores.jsonl")[2]["question_id"])
    predictions_eval(demo_dir, tmp_path, tmp_path / "b", wrong)
    capsys.readouterr()
    assert main(["show", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    shown = capsys.readouterr().out
    assert "run A" in shown and "run B" in shown and "SELECT 1" in shown  # one flip: both transcripts printed
    assert main(["show", str(tmp_path / "b"), str(tmp_path / "a"), "--wrong", "--db", "no_such_db"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: ") and "has no database no_such_db (it has 2: " in err[0]
    db = lines_of(tmp_path / "a" / "full" / "scores.jsonl")[2]["db_id"]
    assert main(["show", str(tmp_path / "b"), str(tmp_path / "a"), "--db", db]) == 0  # B right, A wrong
    assert "only_b: run A" in capsys.readouterr().out  # the one flip's transcripts


def test_show_refuses_a_pair_without_shared_questions(demo_dir, tmp_path, capsys):
    """Two runs on different questions are refused with one line, as ``compare`` refuses them, not shown as an
    empty table."""
    import shutil

    gold_eval(demo_dir, tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    for path in (tmp_path / "b" / "full").glob("*.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        path.write_text("".join(json.dumps({**r, "question_id": f"other-{r['question_id']}"}) + "\n" for r in records))
    capsys.readouterr()
    assert main(["show", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: ") and "share no question" in err[0]
    assert main(["compare", str(tmp_path / "a" / "full"), str(tmp_path / "b" / "full")]) == 1


def test_show_a_pair_that_shares_some_questions_says_how_many_it_paired(demo_dir, tmp_path, capsys):
    gold_eval(demo_dir, tmp_path / "a", n="8")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    for path in (tmp_path / "b" / "full").glob("*.jsonl"):  # B: 3 of A's questions, and 5 of its own
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        path.write_text("".join(json.dumps({**r, "question_id": f"other-{r['question_id']}"} if i >= 3 else r) + "\n"
                                for i, r in enumerate(records)))
    capsys.readouterr()
    assert main(["show", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "over the 3 questions both hold; A's 5 and B's 5 others are not paired: only_a 0, only_b 0" in shown


def test_show_a_pair_lists_both_runs_scores(demo_dir, tmp_path, capsys):
    gold_eval(demo_dir, tmp_path / "a", n="63")
    ids = [str(line["question_id"]) for line in lines_of(tmp_path / "a" / "full" / "scores.jsonl")]
    predictions_eval(demo_dir, tmp_path, tmp_path / "b", ids[3], ids[7])
    capsys.readouterr()
    assert main(["show", str(tmp_path / "b"), str(tmp_path / "a")]) == 0
    shown = capsys.readouterr().out
    assert f"flipped between A = {tmp_path / 'b'} and B = {tmp_path / 'a'}, over the 63 questions both hold: only_a " \
           "0, only_b 2" in " ".join(shown.split())
    header = next(line for line in shown.splitlines() if "score A" in line)
    assert [c.strip() for c in header.split("┃")[1:-1]][-4:] == ["score A", "score B", "final SQL A", "final SQL B"]
    rows = table_rows(shown)
    assert sorted(row[1] for row in rows) == sorted([ids[3], ids[7]])
    assert all(row[0] == "only_b" and row[-4:-2] == ["0", "1"] for row in rows), rows


def test_show_names_what_a_run_holds_when_a_filter_does_not(demo_dir, tmp_path, capsys):
    out = tmp_path / "out"
    gold_eval(demo_dir, out, n="8")
    ids = sorted(str(line["question_id"]) for line in lines_of(out / "full" / "episodes.jsonl"))
    capsys.readouterr()
    assert main(["show", str(out), "--id", "999"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"Error: {out} has no question id 999 (it has 8: ") and all(i in err for i in ids)
    assert main(["show", str(out), "--db", "nonexist"]) == 1
    assert "has no database nonexist (it has " in capsys.readouterr().err
    assert main(["show", str(out), "--sample", "3"]) == 1
    assert "has no sample 3 (it has 1: 0)" in capsys.readouterr().err
    assert main(["show", str(out), "--wrong"]) == 0  # a filter that matches nothing by chance is no error
    assert "no episode of 8 matches" in capsys.readouterr().out


def test_show_lists_questions_in_data_order_and_limits(demo_dir, tmp_path, capsys):
    out = tmp_path / "out"
    gold_eval(demo_dir, out, "full", "withheld", n="12")
    for mode in ("full", "withheld"):  # episodes finish in any order: write them backwards
        path = out / mode / "episodes.jsonl"
        path.write_text("".join(reversed(path.read_text().splitlines(keepends=True))))
    records = {str(r["question_id"]): r for r in json.loads((demo_dir / "dev.json").read_text())}
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    rows = table_rows(capsys.readouterr().out)
    positions = {qid: index for index, qid in enumerate(records)}
    listed = [(row[2], row[0]) for row in rows]
    assert [m for m, _ in listed] == ["full"] * 12 + ["withheld"] * 12
    assert [positions[q] for _, q in listed[:12]] == sorted(positions[q] for _, q in listed[:12])
    assert all(records[row[0]]["question"].startswith(row[5].rstrip("…")) for row in rows)  # the question column
    assert main(["show", str(out), "--n", "5"]) == 0
    printed = capsys.readouterr().out
    assert "24 of 24 episodes, the first 5" in printed
    assert sum(line.startswith("│") for line in printed.splitlines()) == 5
    assert main(["show", str(out), "--limit", "3", "--mode", "withheld"]) == 0
    printed = capsys.readouterr().out
    assert "12 of 12 episodes, the first 3" in printed
    assert sum(line.startswith("│") for line in printed.splitlines()) == 3


def test_show_reads_training_episodes(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    records = [{"question_id": f"q{i}", "db_id": "d", "step": 1, "reward": r, "tier": t, "f1": 0.5, "join": 1,
                "consensus": 0, "turns": [{"assistant": "<think>x</think>\nhi", "calls": [], "observation": ""}],
                "final_sql": "select 1", "final_sql_source": "fallback", "counters": {"turns": 1}}
               for i, (r, t) in enumerate([(3.0, "equivalent"), (0.1, "executable"), (0.0, "invalid")])]
    (run / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["show", str(run), "--wrong"]) == 0
    assert "2 of 3 episodes" in capsys.readouterr().out
    assert main(["show", str(run), "--tier", "executable"]) == 0
    shown = capsys.readouterr().out
    assert "question q1" in shown and "tier=executable" in shown and "SELECT 1" in shown


# ----------------------------------------------------------------------------------------------- comparability
def test_the_data_a_run_played_is_named_and_only_bird_dev_is_published_data(bird_superhero_dir, spider_dev_dir,
                                                                            bird_minidev_file):
    from t2s.data.loaders import data_label, load_json_rows

    bird = load_json_rows(bird_superhero_dir / "dev.json")
    assert data_label(bird, bird_superhero_dir / "dev.json") == "BIRD dev"
    spider = load_json_rows(spider_dev_dir / "dev.json", require_databases=False)
    assert data_label(spider, spider_dev_dir / "dev.json") == "spider_dev/dev.json"
    minidev = load_json_rows(bird_minidev_file, require_databases=False)  # BIRD's databases, another benchmark
    assert data_label(minidev, bird_minidev_file) == "bird_minidev/mini_dev_sqlite.json"


def test_comparable_only_with_the_published_settings():
    from t2s.evaluation.report import comparability_line

    published = {"policy": "model", "mode": "full", "training_token_stream": True, "n": 300, "seed": 0, "max_turns": 6,
                 "episode_token_budget": 12288, "enable_thinking": True, "data": "BIRD dev",
                 "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20}}
    assert comparability_line(published) == "comparable with the published figures"
    spider = {**published, "data": "spider_dev/dev.json"}  # the published settings on other data
    assert comparability_line(spider) == ("not comparable with the published figures: data spider_dev/dev.json "
                                          "(published: BIRD dev)")
    unknown = {k: v for k, v in published.items() if k != "data"}  # a run from before the data was recorded
    assert comparability_line(unknown).endswith("data not recorded (published: BIRD dev)")
    changed = {**published, "n": 50, "max_turns": 4, "sampling": {"temperature": 1.0, "top_p": 0.95, "top_k": 20}}
    assert comparability_line(changed) == ("not comparable with the published figures: n 50 (published 300); "
                                           "max_turns 4 (published 6); temperature 1.0 (published 0.6)")
    every = {**published, "n": 0, "questions": 63}  # --n 0: every question of a 63-question file
    assert comparability_line(every) == "not comparable with the published figures: n 63 (published 300)"
    chat = {**published, "training_token_stream": False, "endpoint_mode": "chat", "policy": "endpoint"}
    assert comparability_line(chat) == ("not comparable with the published figures: a chat endpoint does not play "
                                        "the training token stream")


# ------------------------------------------------------------------------------------- the page's script, in node
def _page(path: Path, hash_: str = "") -> dict:
    """report.html's script run by node against a stand-in DOM (tests/report_page_dom.js)."""
    done = subprocess.run(["node", str(Path(__file__).with_name("report_page_dom.js")), str(path), hash_],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")


@needs_node
def test_report_html_opens_a_question_by_id_and_lists_in_data_order(demo_dir, tmp_path):
    from t2s.evaluation.report_html import HASH_PARAMETERS, write_report

    out = tmp_path / "out"
    gold_eval(demo_dir, out, "full", "withheld", n="12")
    for mode in ("full", "withheld"):  # episodes finish in any order: write them backwards, then the page again
        path = out / mode / "episodes.jsonl"
        path.write_text("".join(reversed(path.read_text().splitlines(keepends=True))))
    write_report(out)
    page = (out / "report.html").read_text()
    guide = (Path(__file__).parents[1] / "docs" / "evaluation.md").read_text()
    for name, _ in HASH_PARAMETERS:  # every hash parameter is named on the page and in the evaluation guide
        assert f"<code>{name}</code>" in page and f"`{name}`" in guide, name
    ids = [str(r["question_id"]) for r in json.loads((demo_dir / "dev.json").read_text())]
    shown = _page(out / "report.html")
    listed = [(row["cells"][1], row["cells"][0]) for row in shown["rows"]]
    assert [m for m, _ in listed] == ["full"] * 12 + ["withheld"] * 12
    assert [q for _, q in listed[:12]] == sorted((q for _, q in listed[:12]), key=ids.index)
    assert shown["errors"] == [] and shown["detail"]["hidden"] is True
    question = listed[7][1]  # not the 8th of the data file: the id names the question, not a position
    assert question != ids[7]
    opened = _page(out / "report.html", f"#id={question}")
    assert opened["detail"]["data-question-id"] == question and opened["detail"]["data-open"] == "7"
    assert f"Question {question} on " in opened["detail"]["text"] and "(full)" in opened["detail"]["text"]
    withheld = _page(out / "report.html", f"#mode=withheld&id={question}")
    assert withheld["detail"]["data-question-id"] == question and withheld["detail"]["data-open"] == "19"
    assert "(withheld)" in withheld["detail"]["text"] and withheld["status"]["data-shown"] == "12"
    missing = _page(out / "report.html", "#id=999")
    assert missing["status"]["data-missing"] == "999" and missing["detail"]["hidden"] is True
    by_position = _page(out / "report.html", "#open=3")
    assert by_position["detail"]["data-open"] == "3" and by_position["detail"]["data-question-id"] == listed[3][1]


@needs_node
def test_compare_html_marks_each_runs_score(demo_dir, tmp_path):
    gold_eval(demo_dir, tmp_path / "a", n="63")
    ids = [str(line["question_id"]) for line in lines_of(tmp_path / "a" / "full" / "scores.jsonl")]
    predictions_eval(demo_dir, tmp_path, tmp_path / "b", ids[4])
    assert main(["compare", str(tmp_path / "b"), str(tmp_path / "a"), "--output", str(tmp_path / "cmp"), "--html"]) == 0
    shown = _page(tmp_path / "cmp" / "compare.html")
    [row] = shown["rows"]  # only B (the gold run) got it right: neither red nor green as a whole
    assert row["cls"] == "pair" and row["marks"] == ["bad", "ok"] and row["cells"][4] == "only_b A 0 B 1"


# ------------------------------------------------------------------------------------------------------- browser
def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _browse(url: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([_chromium(), "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                           "--window-size=1400,1000", *extra, url], capture_output=True, text=True, timeout=120)


def _status(dom: str) -> dict:
    tag = re.search(r'<div id="status"[^>]*>', dom).group(0)
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', tag))


@pytest.mark.skipif(_chromium() is None,
                    reason="headless Chromium is not installed: `make install-chromium` (as root) installs it")
def test_report_html_in_headless_chromium(demo_dir, tmp_path):
    out = tmp_path / "out"
    gold_eval(demo_dir, out, "full", "withheld", n="63")
    page = (out / "report.html").read_text()
    assert "<script src" not in page and "<link" not in page and "data:image/png;base64," in page
    url = (out / "report.html").as_uri()
    loaded = _status(_browse(url, "--dump-dom").stdout)
    assert loaded["ready"] == "1" and loaded["errors"] == "" and loaded["total"] == loaded["shown"] == "126"
    db = lines_of(out / "full" / "scores.jsonl")[0]["db_id"]
    on_db = sum(line["db_id"] == db for line in lines_of(out / "full" / "scores.jsonl"))
    narrowed = _status(_browse(f"{url}#mode=full&db={db}", "--dump-dom").stdout)
    assert narrowed["errors"] == "" and int(narrowed["shown"]) == on_db < 63
    assert 0 < int(loaded["first-row-top"]) < 1000  # the list of episodes is on the first screen of 1400×1000
    opened = _browse(f"{url}#open=3", "--dump-dom").stdout
    assert re.search(r'id="detail"[^>]* data-open="3"', opened) and "gold rows" in opened and "predicted rows" in opened
    assert _status(opened)["errors"] == ""
    question = str(lines_of(out / "withheld" / "scores.jsonl")[9]["question_id"])
    by_id = _browse(f"{url}#mode=withheld&id={question}", "--dump-dom").stdout
    assert re.search(rf'id="detail"[^>]* data-question-id="{question}"', by_id) and f"Question {question} on " in by_id
    assert loaded["columns"] == loaded["columns-aligned"] == "7"  # each cell under its header
    shot = tmp_path / "transcript.png"
    _browse(f"{url}#open=3", f"--screenshot={shot}")
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one


@pytest.mark.skipif(_chromium() is None,
                    reason="headless Chromium is not installed: `make install-chromium` (as root) installs it")
def test_compare_html_rows_line_up_with_their_header_in_headless_chromium(demo_dir, tmp_path):
    """compare.html's episode rows (``tr.pair``) keep the table's layout: each cell starts where its header does."""
    gold_eval(demo_dir, tmp_path / "a", n="63")
    ids = [str(line["question_id"]) for line in lines_of(tmp_path / "a" / "full" / "scores.jsonl")]
    predictions_eval(demo_dir, tmp_path, tmp_path / "b", ids[4], ids[9])
    assert main(["compare", str(tmp_path / "b"), str(tmp_path / "a"), "--output", str(tmp_path / "cmp"), "--html"]) == 0
    dom = _browse((tmp_path / "cmp" / "compare.html").as_uri(), "--dump-dom").stdout
    status = _status(dom)
    assert status["errors"] == "" and status["shown"] == "2" and 'class="pair"' in dom
    assert status["columns"] == status["columns-aligned"] == "7", status


def test_pairs_are_made_sample_by_sample_and_on_the_chosen_metric(demo_dir, tmp_path, capsys):
    """show --sample S pairs A's sample S with B's sample S; a pair where no question is scored in both is one
    error line (as compare says), not an empty list; compare --html lists the questions flipped on --metric."""
    gold_eval(demo_dir, tmp_path / "a", n="4")
    episodes = tmp_path / "a" / "full" / "episodes.jsonl"
    first = [json.loads(line) for line in episodes.read_text().splitlines()]
    twice = first + [{**r, "sample": 1, "official": 0, "strict": 0} for r in first]  # sample 1: every answer wrong
    pair = {}
    for name in ("k2a", "k2b"):
        (tmp_path / name).mkdir()
        pair[name] = tmp_path / name / "episodes.jsonl"
        pair[name].write_text("".join(json.dumps(r) + "\n" for r in twice))
    capsys.readouterr()
    assert main(["show", str(pair["k2a"]), str(pair["k2b"]), "--sample", "1"]) == 0
    assert "only_a 0, only_b 0" in " ".join(capsys.readouterr().out.split())
    named = str(first[0]["question_id"])  # named, but not flipped: said so, not an empty output
    assert main(["show", str(pair["k2a"]), str(pair["k2b"]), "--id", named]) == 0
    assert " ".join(capsys.readouterr().out.split()).startswith(f"{named}: not flipped between A = {pair['k2a']}")
    unscored = tmp_path / "unscored" / "episodes.jsonl"
    unscored.parent.mkdir()
    unscored.write_text("".join(json.dumps({**r, "official": None}) + "\n" for r in first))
    assert main(["show", str(episodes), str(unscored)]) == 1
    assert capsys.readouterr().err.strip() == f"Error: no question is scored in both {episodes} and {unscored} (as " \
                                              "`compare` refuses them): nothing to pair"
    strict_b = tmp_path / "strict_b" / "episodes.jsonl"  # B differs from A on strict only, on one question
    strict_b.parent.mkdir()
    strict_b.write_text("".join(json.dumps({**r, "strict": 0} if i == 0 else r) + "\n" for i, r in enumerate(first)))
    out = tmp_path / "cmp"
    assert main(["compare", str(episodes), str(strict_b), "--metric", "strict", "--output", str(out), "--html"]) == 0
    assert json.loads((out / "compare.json").read_text())["only_a"] == 1
    page = (out / "compare.html").read_text()
    assert f'"question_id": {json.dumps(first[0]["question_id"])}' in page or \
        f'"question_id":{json.dumps(first[0]["question_id"])}' in page
    scores = tmp_path / "a" / "full" / "scores.jsonl"  # named: its mode folder's episodes are beside it
    assert main(["compare", str(scores), str(scores), "--output", str(tmp_path / "cmp3"), "--html"]) == 0
    alone = tmp_path / "alone.jsonl"  # a file of scores under another name, beside no episodes of its own
    alone.write_text(scores.read_text())
    (tmp_path / "episodes.jsonl").write_text(episodes.read_text())  # an unrelated file beside it is not read
    assert main(["compare", str(tmp_path / "a"), str(alone), "--output", str(tmp_path / "cmp2"), "--html"]) == 1
    assert "--html needs the episodes of each run" in capsys.readouterr().err
    assert not (tmp_path / "cmp2").exists()  # said before anything was written


def test_a_line_break_in_an_id_or_database_stays_in_its_row(demo_dir, tmp_path, capsys):
    """Ids and db_ids are untrusted text: a line break in one would start a row of its own in show's list."""
    gold_eval(demo_dir, tmp_path / "a", n="2")
    episodes = tmp_path / "a" / "full" / "episodes.jsonl"
    first = lines_of(episodes)
    episodes.write_text("".join(json.dumps({**r, "question_id": f"{r['question_id']}\nfake",
                                            "db_id": "a\nb"} if i == 0 else r) + "\n" for i, r in enumerate(first)))
    capsys.readouterr()
    assert main(["show", str(tmp_path / "a")]) == 0
    rows = [row for row in table_rows(capsys.readouterr().out) if any(row)]
    # the list is sorted by id, and the two episodes were written in the order they finished: found by content
    [changed] = [row for row in rows if row[0].startswith(f"{first[0]['question_id']} fake")]
    assert len(rows) == 2 and "a b" in changed


def test_show_on_a_run_stopped_before_its_first_episode_says_so(demo_dir, tmp_path, capsys):
    """An eval killed before it wrote an episode leaves an empty episodes.jsonl: show says that, alone or in a pair,
    instead of "no episode of 0 matches" or "share no question"."""
    gold_eval(demo_dir, tmp_path / "done")
    gold_eval(demo_dir, tmp_path / "empty")
    (tmp_path / "empty" / "full" / "episodes.jsonl").write_text("")
    capsys.readouterr()
    for argv in (["show", str(tmp_path / "empty")], ["show", str(tmp_path / "done"), str(tmp_path / "empty")]):
        assert main(argv) == 1
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line == (f"Error: {tmp_path / 'empty'} holds no episodes yet (its run stopped before the first was "
                        "written)")
