"""Pass-rate filter: scripted and model policies through the evaluator's episodes and scoring, on a CPU."""

from __future__ import annotations

import json

import pytest

from t2s.commands import main
from t2s.evaluation import passrate
from t2s.data.loaders import load_json_rows, load_rows
from t2s.evaluation.runner import select_rows


def test_solve_counts_follow_the_scripted_policy(bird_superhero_dir):
    rows = load_rows("bird", bird_superhero_dir, limit=12)
    k = 8
    counts = passrate.solve_counts(rows, passrate.scripted_policy_factory("scripted-mix", k), k, progress=False)
    expected = [passrate.mix_solved(r["question_id"], k) for r in rows]
    assert counts == expected
    assert len(set(counts)) >= 3  # the fixture spreads over several solve counts
    kept = passrate.keep_partially_solved(rows, counts, k)
    assert [r["question_id"] for r in kept] == [r["question_id"] for r, c in zip(rows, counts) if 1 <= c <= 7]
    assert all(r["passrate_k"] == 8 and 1 <= r["passrate_solved"] <= 7 for r in kept)


def test_wrong_sql_never_scores(bird_superhero_dir):
    rows = load_rows("bird", bird_superhero_dir, limit=3)
    counts = passrate.solve_counts(rows, lambda row, sample: passrate.submit_only(passrate.WRONG_SQL), 3,
                                   progress=False)
    assert counts == [0, 0, 0]
    assert passrate.keep_partially_solved(rows, counts, 3) == []


def test_gold_policy_solves_every_sample(bird_superhero_dir):
    rows = load_rows("bird", bird_superhero_dir, limit=3)
    counts = passrate.solve_counts(rows, passrate.scripted_policy_factory("gold", 2), 2, progress=False)
    assert counts == [2, 2, 2]
    assert passrate.keep_partially_solved(rows, counts, 2) == []


def test_passrate_command_end_to_end(bird_superhero_dir, tmp_path, capsys):
    output = tmp_path / "passrate_kept.json"
    code = main(["data", "passrate", "--data", str(bird_superhero_dir), "--policy", "scripted-mix", "--k", "8",
                 "--n", "16", "--output", str(tmp_path)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "pass rate over 8 samples" in printed and "kept" in printed
    rows = select_rows(load_rows("bird", bird_superhero_dir), 16, seed=0)  # --n: eval's seeded pick (--seed 0)
    assert [r["question_id"] for r in rows] != [r["question_id"] for r in load_rows("bird", bird_superhero_dir)[:16]]
    expected = [r["question_id"] for r in rows if 1 <= passrate.mix_solved(r["question_id"], 8) <= 7]
    written = json.loads(output.read_text())
    assert [r["question_id"] for r in written] == expected
    # the output is a data file in the common row shape: it loads again
    assert [r["question_id"] for r in load_json_rows(output)] == expected


def test_n_and_seed_pick_the_questions_eval_picks(bird_superhero_dir, tmp_path, capsys):
    rows = load_rows("bird", bird_superhero_dir)
    for seed in (0, 5):
        out = tmp_path / str(seed)
        assert main(["data", "passrate", "--data", str(bird_superhero_dir), "--policy", "scripted-mix", "--k", "8",
                     "--n", "12", "--seed", str(seed), "--output", str(out), "--quiet"]) == 0
        picked = select_rows(rows, 12, seed)
        expected = [r["question_id"] for r in picked if 1 <= passrate.mix_solved(r["question_id"], 8) <= 7]
        assert [r["question_id"] for r in json.loads((out / "passrate_kept.json").read_text())] == expected
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["data", "passrate", "--help"])
    helped = " ".join(capsys.readouterr().out.split())
    assert "only N rows, picked with --seed from the whole file as eval picks its questions" in helped
    assert "picks the --n questions (the same pick in eval and data passrate)" in helped


def test_gold_policy_command_plays_the_evaluators_gold_episodes(demo_dir, tmp_path, capsys):
    output = tmp_path / "passrate_kept.json"
    code = main(["data", "passrate", "--data", str(demo_dir), "--policy", "gold", "--k", "2", "--n", "3",
                 "--output", str(tmp_path), "--quiet"])
    assert code == 0
    histogram = {line.split("│")[1].strip(): line.split("│")[2].strip()
                 for line in capsys.readouterr().out.splitlines() if line.count("│") >= 3}
    assert histogram["0/2"] == "0" and histogram["1/2"] == "0" and histogram["2/2"] == "3"
    assert json.loads(output.read_text()) == []  # gold solves every sample: nothing is partially solved


def test_model_policy_with_the_tiny_model(tiny_model_dir, demo_dir, tmp_path, capsys):
    output = tmp_path / "passrate_kept.json"
    code = main(["data", "passrate", "--data", str(demo_dir), "--policy", "model", "--model", str(tiny_model_dir),
                 "--k", "2", "--n", "3", "--max-turns", "1", "--max-tokens-per-turn", "16",
                 "--episode-token-budget", "4096", "--device", "cpu", "--temperature", "1.0", "--quiet",
                 "--output", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "pass rate over 2 samples" in captured.out and "total" in captured.out
    written = json.loads(output.read_text())
    assert isinstance(written, list)  # a random tiny model solves 0..2 samples: whatever is kept is a valid row
    assert all(r["passrate_k"] == 2 and r["passrate_solved"] == 1 for r in written)
    assert {r["question_id"] for r in written} <= {r["question_id"] for r in load_json_rows(demo_dir / "dev.json")}


def test_model_counts_come_from_the_evaluators_scored_episodes(tiny_model_dir, demo_dir, tmp_path):
    from t2s.evaluation import runner as eval_runner
    from t2s.evaluation.config import PolicyConfig

    rows = load_json_rows(demo_dir / "dev.json")[:2]
    args = PolicyConfig.from_options(dict(policy="model", model=str(tiny_model_dir), k=2, max_turns=1,
                                          max_tokens_per_turn=8, episode_token_budget=4096, device="cpu", quiet=True))
    counts = eval_runner.solve_counts(rows, args)
    assert len(counts) == 2 and all(0 <= c <= 2 for c in counts)
    # the same questions through `eval` (same jobs, seeds and scorer) give the same per-question solve counts
    data = tmp_path / "two.json"
    data.write_text(json.dumps(json.loads((demo_dir / "dev.json").read_text())[:2]))
    code = main(["eval", "--policy", "model", "--model", str(tiny_model_dir), "--data", str(data), "--db-root",
                 str(demo_dir / "dev_databases"), "--k", "2", "--max-turns", "1", "--max-tokens-per-turn", "8",
                 "--episode-token-budget", "4096", "--device", "cpu", "--quiet", "--output", str(tmp_path / "eval")])
    assert code == 0
    lines = [json.loads(line) for line in (tmp_path / "eval" / "full" / "episodes.jsonl").read_text().splitlines()]
    assert len(lines) == 4
    assert counts == [sum(line["official"] for line in lines if line["question_id"] == r["question_id"]) for r in rows]
    # a policy that always submits the gold SQL is counted solved on every sample by the same scorer
    gold = eval_runner.solve_counts(rows, args,
                                    policy_factory=lambda row, sample: passrate.submit_only(row["gold_sql"]))
    assert gold == [2, 2]


def test_model_policy_without_a_model_is_a_clear_error(demo_dir, capsys):
    code = main(["data", "passrate", "--data", str(demo_dir), "--policy", "model", "--n", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err == ["Error: --policy model needs --model PATH"]


def test_k_below_two_is_refused(bird_superhero_dir, capsys):
    assert main(["data", "passrate", "--data", str(bird_superhero_dir), "--k", "1"]) == 2  # a usage error
    assert "--k must be at least 2" in capsys.readouterr().err


def test_a_missing_system_prompt_file_is_a_clear_error(demo_dir, tmp_path, capsys):
    code = main(["data", "passrate", "--data", str(demo_dir), "--policy", "gold", "--n", "2",
                 "--system-prompt-file", str(tmp_path / "absent.txt")])
    assert code == 1
    assert capsys.readouterr().err.strip() == f"Error: system prompt file not found: {tmp_path / 'absent.txt'}"


def test_rows_whose_gold_sql_fails_are_not_scored_and_never_kept(demo_dir, tmp_path, capsys):
    """A row whose gold SQL fails is unscorable, not unsolved: with --min-solved 0 it would otherwise be kept as a
    row no policy solves. When every row is so, the command fails with one line and writes nothing."""
    rows = json.loads((demo_dir / "dev.json").read_text())[:3]
    broken = [dict(rows[0], SQL="SELECT no_such_column FROM no_such_table"), *rows[1:]]
    data = tmp_path / "one_broken.json"
    data.write_text(json.dumps(broken))
    flags = ["--db-root", str(demo_dir / "dev_databases"), "--policy", "gold", "--k", "2", "--min-solved", "0",
             "--max-solved", "2"]
    assert main(["data", "passrate", "--data", str(data), *flags, "--output", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert f"1 rows not scored, their gold SQL fails (never kept): {rows[0]['question_id']}" in out
    assert "not scored (gold SQL fails)" in out  # the histogram's own row
    kept = json.loads((tmp_path / "a" / "passrate_kept.json").read_text())
    assert [row["question_id"] for row in kept] == [str(row["question_id"]) for row in rows[1:]]
    assert all(row["passrate_solved"] == 2 for row in kept)

    data.write_text(json.dumps([dict(row, SQL="SELECT no_such_column FROM no_such_table") for row in rows]))
    assert main(["data", "passrate", "--data", str(data), *flags, "--output", str(tmp_path / "b")]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Error:")]  # after progress
    assert errors == ["Error: no row could be scored: the gold SQL of every one of the 3 rows fails on its database; "
                      "check --data and --db-root (nothing written)"]
    assert not (tmp_path / "b" / "passrate_kept.json").exists()


def test_rows_whose_episodes_end_in_an_error_are_not_measured_and_never_kept(demo_dir, tmp_path, capsys):
    """An episode its server refused scores 0 but says nothing of the question: its row is not counted as unsolved
    (with --min-solved 0 it would be kept as a hard question made of server errors). When every row is so, the
    command fails with one line and writes nothing."""
    from tests.test_evaluate import ChatFake, gold_by_question, good_agent, question_of

    healthy = good_agent(gold_by_question(demo_dir))
    picked = select_rows(load_json_rows(demo_dir / "dev.json"), 3, 0)  # the rows --n 3 plays
    refused = picked[0]["question"]

    def respond(body):
        return (400, {"error": "refused"}) if question_of(body) == refused else healthy(body)

    flags = ["--data", str(demo_dir / "dev.json"), "--n", "3", "--policy", "endpoint", "--endpoint-mode", "chat",
             "--k", "2", "--min-solved", "0", "--max-solved", "2", "--retries", "0"]
    with ChatFake(respond) as fake:
        assert main(["data", "passrate", *flags, "--endpoint", fake.url, "--output", str(tmp_path / "a")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"1 rows not measured, an episode of theirs ended in an error or before its first turn (never kept; run " \
           f"again to measure them): {picked[0]['question_id']}" in out
    assert "not measured (an episode played no turn)" in out and "not scored (gold SQL fails)" not in out
    kept = json.loads((tmp_path / "a" / "passrate_kept.json").read_text())
    assert sorted(row["question_id"] for row in kept) == sorted(str(row["question_id"]) for row in picked[1:])
    with ChatFake(lambda body: (400, {"error": "refused"})) as fake:
        assert main(["data", "passrate", *flags, "--endpoint", fake.url, "--output", str(tmp_path / "b")]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].startswith("Error: no solve count was measured: an episode of every one "
                                                     "of the 3 rows ended in an error")
    assert not (tmp_path / "b" / "passrate_kept.json").exists()
    # the two causes together: one row's gold SQL fails, the others' episodes are refused: nothing measured either
    records = json.loads((demo_dir / "dev.json").read_text())
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps([dict(r, SQL="SELECT nope FROM nowhere") if str(r["question_id"]) == str(
        picked[0]["question_id"]) else r for r in records]))
    mixed = ["--data", str(broken), "--db-root", str(demo_dir / "dev_databases"), *flags[2:]]
    with ChatFake(lambda body: healthy(body) if question_of(body) == refused else (400, {"error": "no"})) as fake:
        assert main(["data", "passrate", *mixed, "--endpoint", fake.url, "--output", str(tmp_path / "c")]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: no row was measured: 1 rows' gold SQL fails and 2 rows had an episode that played no "
                      "turn (see above; nothing written)"]
    assert not (tmp_path / "c" / "passrate_kept.json").exists()
